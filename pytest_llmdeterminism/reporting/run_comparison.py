"""Two runs' JSON reports, check by check: which checks changed verdict (or passed in one run and
failed in the other), which appeared, which disappeared; as terminal lines and as a self-contained
HTML page with filters. Built from data; nothing here reads files or prints."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_llmdeterminism.judge.compare import Verdict
from pytest_llmdeterminism.reporting.html_report import (
    filter_attributes,
    filter_bar,
    static,
)
from pytest_llmdeterminism.reporting.text import drift_text, margin_text

# How a check moved between the runs, in the order a reviewer reads them: FAILING is a check that
# failed in both runs with the same verdict (nothing moved, but it still needs a look).
CHANGED, APPEARED, DISAPPEARED, FAILING, SAME = "changed", "appeared", "disappeared", "still failing", "same"
_ORDER = (CHANGED, APPEARED, DISAPPEARED, FAILING, SAME)
MOVED = (CHANGED, APPEARED, DISAPPEARED)


@dataclass(frozen=True)
class CheckChange:
    """One check (test node id and golden key) in either run: its entry in each (None: absent)."""

    test: str
    name: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None

    @property
    def status(self) -> str:
        if self.before is None:
            return APPEARED
        if self.after is None:
            return DISAPPEARED
        moved = (self.before["verdict"] != self.after["verdict"]
                 or self.before["passed"] != self.after["passed"])
        return CHANGED if moved else SAME if self.after["passed"] else FAILING

    @property
    def direction(self) -> str:
        """For a changed check: ``better`` (it passes now, or its verdict is less severe), ``worse``
        (the reverse), or "" (neither)."""
        if self.status != CHANGED or self.before is None or self.after is None:
            return ""
        if self.before["passed"] != self.after["passed"]:
            return "better" if self.after["passed"] else "worse"
        old, new = (Verdict.risk_of(side["verdict"]) for side in (self.before, self.after))
        return "better" if new > old else "worse" if new < old else ""


def compare_runs(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]) -> list[CheckChange]:
    """Every check of either run, matched by test and golden key (a check a run lists twice: its
    last entry), changed ones first (the later run's worst verdict first), then appeared,
    disappeared and unchanged ones, each in test order."""
    first = {(c["test"], c["name"]): c for c in before}
    second = {(c["test"], c["name"]): c for c in after}
    keys = list(first) + [key for key in second if key not in first]
    changes = [CheckChange(test, name, first.get((test, name)), second.get((test, name)))
               for test, name in keys]

    def rank(change: CheckChange) -> tuple[int, int, str, str]:
        verdict = change.after["verdict"] if change.after is not None else ""
        worst = Verdict.risk_of(verdict) if change.status in (CHANGED, FAILING) else 0
        return _ORDER.index(change.status), worst, change.test, change.name

    return sorted(changes, key=rank)


def outcome(check: dict[str, Any] | None) -> str:
    """A check's verdict as the terminal summary spells it: ``REGRESSION (failed)``; ``—`` for none."""
    if check is None:
        return "—"
    return str(check["verdict"]) + ("" if check["passed"] else " (failed)")


def counts_line(changes: Sequence[CheckChange]) -> str:
    counted = {status: sum(change.status == status for change in changes) for status in _ORDER}
    failing = f", {counted[FAILING]} failing in both" if counted[FAILING] else ""
    return (f"{counted[CHANGED]} changed verdict, {counted[APPEARED]} appeared, "
            f"{counted[DISAPPEARED]} disappeared, {counted[SAME] + counted[FAILING]} unchanged{failing}")


def comparison_lines(changes: Sequence[CheckChange], before: str, after: str) -> list[str]:
    """The terminal text: what was compared, the counts, then one line per check that moved, and one
    per check that failed in both runs."""
    moved = [change for change in changes if change.status != SAME]
    lines = [f"compared {before} -> {after}: {counts_line(changes)}"]
    lines += [f"  {change.status:<12} {outcome(change.before):<24} -> {outcome(change.after):<24} "
              f"{change.test} [{change.name!r}]" for change in moved]
    if not any(change.status in MOVED for change in changes):
        lines.append("no check changed verdict, appeared or disappeared")
    return lines


def comparison_html(changes: Sequence[CheckChange], before: str, after: str) -> str:
    """A self-contained page: both runs' entry of every check side by side, with filters by how it
    moved and a search box (inline CSS and script, nothing fetched). A change for the better is
    green, for the worse red; the table fits the window's width (long ids wrap)."""
    import html

    rows = []
    for change in changes:
        searched = (change.test, change.name, outcome(change.before), outcome(change.after))
        name = change.status.replace(" ", "-")
        failed = "" if change.after is None or change.after["passed"] else " failed"
        classes = f"{name} {change.direction}{failed}"
        rows.append(f'<tr class="{classes}" {filter_attributes(["all", name], searched)}>'
                    f"<td>{change.status}{f' ({change.direction})' if change.direction else ''}</td>"
                    f"<td><code>{html.escape(change.test)}</code></td>"
                    f"<td><code>{html.escape(change.name)}</code></td>"
                    f"{_side(change.before)}{_side(change.after)}</tr>")
    filters = [("all", "all", len(changes))] + [
        (status.replace(" ", "-"), status, sum(change.status == status for change in changes))
        for status in _ORDER]
    head = "<th>step</th><th>golden margin</th><th>drift</th>"
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>LLM golden checks: two runs</title>'
            f"<style>{static('report.css')}</style></head><body>"
            f"<h1>LLM golden checks: two runs</h1><p>{html.escape(before)} → {html.escape(after)}: "
            f"{html.escape(counts_line(changes))}.</p>"
            f"{filter_bar(filters, placeholder='search tests, goldens, verdicts')}"
            f'<table class="runs"><tr><th rowspan="2">check</th><th rowspan="2">test</th>'
            f'<th rowspan="2">golden</th>'
            f'<th colspan="4">{html.escape(before)}</th><th colspan="4">{html.escape(after)}</th></tr>'
            f"<tr><th>verdict</th>{head}<th>verdict</th>{head}</tr>{''.join(rows)}</table>"
            f"<script>{static('filters.js')}</script></body></html>\n")


def _side(check: dict[str, Any] | None) -> str:
    """One run's cells for a check: verdict, step of the first divergence, margin, drift."""
    import html

    if check is None:
        return '<td colspan="4">absent</td>'
    step = "" if check.get("first_divergence") is None else str(check["first_divergence"])
    status = "passed" if check["passed"] else "failed"
    return (f'<td class="{status}"><span class="verdict">{html.escape(outcome(check))}</span></td>'
            f"<td>{step}</td><td>{html.escape(margin_text(check))}</td><td>{html.escape(drift_text(check))}</td>")
