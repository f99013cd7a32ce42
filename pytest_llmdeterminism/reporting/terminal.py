"""The lines pytest's terminal shows at the end of a run: checks per outcome, files written, unused
goldens, audits; and a failure's one-line crash message for the short test summary."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_llmdeterminism.reporting.records import Outcome


def one_line_crash(longrepr: Any) -> None:
    """Keep only the first line (the verdict) of a failure's crash message, which pytest's short test
    summary prints (in full under CI or -vv): the FAILURES section above already shows all of it."""
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and "\n" in str(crash.message):
        crash.message = str(crash.message).split("\n", 1)[0].rstrip(":")


def summary(counts: Mapping[Outcome, int], written: Sequence[str], errors: Iterable[str],
            notes: Sequence[str] = (), held_back: Sequence[str] = ()) -> list[str]:
    """Terminal summary lines: checks per outcome, files written, write problems, notes."""
    if not counts and not written:
        return []
    parts = ", ".join(f"{n} {name}" for name, n in sorted((str(outcome), n) for outcome, n in counts.items()))
    lines = [f"golden checks: {parts}" if parts else "golden checks: none"]
    lines += list(notes)
    lines += [f"wrote {path}" for path in written]
    lines += [f"NOT written: {problem}" for problem in errors]
    if held_back:
        lines.append(f"NOT recorded: the goldens of {len(held_back)} test(s) that recorded, then failed or "
                     "were skipped (a golden is kept only when its test passes); fix them, then record "
                     "again:")
        lines += [f"  {nodeid}" for nodeid in held_back]
    return lines


def audit_summary(audits: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """One table per audited generation, then which sources moved results, across the session."""
    from pytest_llmdeterminism.engines.audit import AuditReport

    if not audits:
        return []
    reports = [(nodeid, AuditReport.from_json(data)) for nodeid, data in audits]
    lines: list[str] = []
    for nodeid, found in reports:
        lines += [f"{nodeid}: " + found.lines()[0], *found.lines()[1:]]
    moved: dict[str, int] = {}
    for _, found in reports:
        for row in found.rows:
            moved[row.source] = moved.get(row.source, 0) + row.moved
    nondeterministic = sum(found.nondeterministic for _, found in reports)
    lines.append(f"audit summary: {len(reports)} generation(s), {nondeterministic} nondeterministic; "
                 "results moved by " + ", ".join(f"{source} {n}/{len(reports)}"
                                                 for source, n in moved.items()))
    return lines


def unused_summary(unused: dict[str, list[str]], pruned: Sequence[str], partial: Sequence[str],
                   display: Callable[[Path], str], *, prune: bool, stopped: bool = False,
                   prune_command: str = "pytest --llm-golden-prune") -> list[str]:
    """Unused goldens after a complete run; after a partial one, why none were judged: always when
    the run stopped early, under ``--llm-golden-prune`` for any reason (``-k`` is quiet otherwise)."""
    if pruned:
        return [f"pruned {len(pruned)} unused golden(s):", *(f"  {item}" for item in pruned)]
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
    return lines


