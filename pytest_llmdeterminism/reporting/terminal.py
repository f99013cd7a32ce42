"""The lines pytest's terminal shows at the end of a run: checks per outcome, files written, unused
goldens, audits; and a failure's one-line crash message for the short test summary."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.judge.decision import Written
from pytest_llmdeterminism.judge.verdict import Verdict

if TYPE_CHECKING:
    from pytest_llmdeterminism.judge.decision import Outcome
    from pytest_llmdeterminism.reporting.records import CheckRecord


_LISTED = 20  # lines of a list in the summary before "… N more"


def one_line_crash(longrepr: Any) -> None:
    """Keep only the first line (the verdict) of a failure's crash message, which pytest's short test
    summary prints (in full under CI or -vv): the FAILURES section above already shows all of it."""
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and "\n" in str(crash.message):
        crash.message = str(crash.message).split("\n", 1)[0].rstrip(":")


def summary(counts: Mapping[Outcome, int], written: Sequence[str], errors: Iterable[str],
            notes: Sequence[str] = (), held_back: Sequence[str] = (),
            overwritten: Sequence[tuple[str, str, str]] = ()) -> list[str]:
    """Terminal summary lines: checks per outcome, files written, write problems, notes.
    ``overwritten``: (node id, key, verdict) of each golden an update wrote over a real change."""
    if not counts and not written:
        return []
    by_name: dict[str, list[int]] = {}  # verdict (or write) -> [checks, failed]
    replaced: dict[str, int] = {}  # the verdicts that updated goldens replaced
    for outcome, n in counts.items():
        name = (outcome.written.value if outcome.written is not None
                else outcome.verdict.value if outcome.verdict is not None else "?")
        totals = by_name.setdefault(name, [0, 0])
        totals[0] += n
        totals[1] += n if outcome.written is None and not outcome.passed else 0
        if outcome.written is Written.UPDATED and outcome.verdict is not None:
            replaced[outcome.verdict.value] = replaced.get(outcome.verdict.value, 0) + n
    over = ", ".join(f"{n} {verdict}" for verdict, n in sorted(replaced.items()))
    parts = ", ".join(f"{n} {name}" + _failed_of(n, failed)
                      + (f" (over {over})" if name == Written.UPDATED.value and over else "")
                      for name, (n, failed) in sorted(by_name.items()))
    lines = [f"golden checks: {parts}" if parts else "golden checks: none"]
    lines += list(notes)
    lines += [f"wrote {path}" for path in written]
    lines += [f"NOT written: {problem}" for problem in errors]
    if overwritten:
        over = " or ".join(verdict.value for verdict in Verdict.by_risk() if verdict.confident_change)
        lines.append(f"updated {len(overwritten)} golden(s) over a {over}: the model "
                     "now says (or is asked) something else there; review each change before you commit it:")
        lines += [f"  {verdict:<13} {nodeid} [{key!r}]" for nodeid, key, verdict in overwritten]
    if held_back:
        lines.append(f"NOT recorded: the goldens of {len(held_back)} test(s) that recorded, then failed or "
                     "were skipped (a golden is kept only when its test passes); fix them, then record "
                     "again:")
        lines += [f"  {nodeid}" for nodeid in held_back]
    return lines


def _failed_of(checks: int, failed: int) -> str:
    """`` (failed)`` when every check of a verdict failed, `` (1 failed)`` when some did."""
    if not failed:
        return ""
    return " (failed)" if failed == checks else f" ({failed} failed)"


def planted_defect_summary(checks: Sequence[CheckRecord], *, ignored: Sequence[str] = ()) -> list[str]:
    """Under ``--llm-plant-defect``: did every golden check catch the perturbed model? A check that
    still passes (or had no golden to compare with) does not protect against a changed model."""
    missing = [check for check in checks if check.verdict == "MISSING"]
    passed = [check for check in checks if check.passed]
    caught = len(checks) - len(passed) - len(missing)
    if not checks:
        lines = ["planted defect: no golden check ran, so nothing was tested against it"]
    elif not passed and not missing:
        lines = [f"planted defect caught: all {caught} golden check(s) failed, as they must"]
    else:
        lines = [f"planted defect caught by {caught} of {len(checks)} golden check(s); "
                 "these did not catch it:"]
        escaped = [f"  {check.verdict} (passed) {check.test} [{check.name!r}]: it does not protect you; "
                   "check more new tokens or a stricter tolerance" for check in passed]
        escaped += [f"  MISSING {check.test} [{check.name!r}]: no golden to compare with; record it first, "
                    "without the planted defect" for check in missing]
        more = [f"  … {len(escaped) - _LISTED} more"] if len(escaped) > _LISTED else []
        lines += escaped[:_LISTED] + more
    if ignored:
        lines.append(f"{' and '.join(ignored)} ignored: nothing is written under a planted defect")
    return lines


def audit_summary(audits: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """One table per audited generation, then which sources moved results, across the session."""
    from pytest_llmdeterminism.reporting.audit import AuditReport

    serving = [(nodeid, data) for nodeid, data in audits if data.get("kind") == "serving"]
    audits = [(nodeid, data) for nodeid, data in audits if data.get("kind") != "serving"]
    lines: list[str] = serving_summary(serving)
    if not audits:
        return lines
    reports = [(nodeid, AuditReport.from_json(data)) for nodeid, data in audits]
    for nodeid, found in reports:
        lines += [f"{nodeid}: " + found.lines()[0], *found.lines()[1:]]
    moved: dict[str, int] = {}
    audited: dict[str, int] = {}  # reports with the row: the seed row is only in sampled ones
    for _, found in reports:
        for row in found.rows:
            moved[row.source] = moved.get(row.source, 0) + row.moved
            audited[row.source] = audited.get(row.source, 0) + 1
    nondeterministic = sum(found.nondeterministic for _, found in reports)
    lines.append(f"audit summary: {len(reports)} generation(s), {nondeterministic} nondeterministic; "
                 "results moved by " + ", ".join(f"{source} {n}/{audited[source]}"
                                                 for source, n in moved.items()))
    return lines


def serving_summary(audits: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """The serving audits' tables (a server engine under ``--llm-audit``), then which conditions
    moved answers, across the session."""
    from pytest_llmdeterminism.reporting.audit import ServingAudit

    if not audits:
        return []
    reports = [(nodeid, ServingAudit.from_json(data)) for nodeid, data in audits]
    lines: list[str] = []
    moved: dict[str, int] = {}
    ran: dict[str, int] = {}
    for nodeid, found in reports:
        lines += [f"{nodeid}: " + found.lines()[0], *found.lines()[1:]]
        for row in found.rows:
            if row.ran:
                moved[row.source] = moved.get(row.source, 0) + (row.verdict != "identical")
                ran[row.source] = ran.get(row.source, 0) + 1
    lines.append(f"serving audit summary: {len(reports)} request(s); answers moved by "
                 + ", ".join(f"{source} {n}/{ran[source]}" for source, n in moved.items()))
    return lines


def unused_summary(unused: dict[str, list[str]], pruned: Sequence[str], partial: Sequence[str],
                   display: Callable[[Path], str], *, prune: bool, stopped: bool = False,
                   prune_command: str = "pytest --llm-golden-prune",
                   cases_kept: dict[str, list[str]] | None = None) -> list[str]:
    """Unused goldens after a complete run; after a partial one, why none were judged: always when
    the run stopped early, under ``--llm-golden-prune`` for any reason (``-k`` is quiet otherwise).
    ``cases_kept``: goldens of parametrized cases the run did not collect, kept and named."""
    kept = [f"kept golden of a case this run did not collect in {display(Path(path))}: {key!r}"
            for path, keys in sorted((cases_kept or {}).items()) for key in keys]
    if kept:
        kept.append("its test still exists and its parametrization may depend on the machine or "
                    f"environment; delete such goldens with: {prune_command}=cases")
    if pruned:
        return [f"pruned {len(pruned)} unused golden(s):", *(f"  {item}" for item in pruned), *kept]
    if partial:
        verb = "not pruned" if prune else "not judged"
        if not (prune or stopped):
            return []
        return [f"unused goldens {verb}: this run was partial ({'; '.join(partial)})"]
    lines = []
    for path, keys in sorted(unused.items()):
        lines += [f"unused golden in {display(Path(path))}: {key!r}" for key in keys]
    if lines:
        lines.append("these goldens were not checked by any test in this complete run; "
                     f"delete them with: {prune_command}")
    return lines + kept


