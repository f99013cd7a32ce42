"""Which shard reports ``llm-golden merge --prune`` may delete goldens on: only reports of the commit
checked out where it prunes, each naming every golden its checks looked up.

A report is CI artifact input. What its tests checked and looked up is believed only for the commit
it ran at: a stale report of another commit (without malice) names other tests and other checks,
and the goldens it did not look up may be used here. And a report whose ``used`` leaves out goldens
its own checks compared with is not one a run wrote (it was edited, or is damaged): on its word a
whole golden file would go.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pytest_llmdeterminism.reporting.records import CheckRecord, RunRecord


class ShardReport(Protocol):
    """A shard's report, read and validated (:class:`~pytest_llmdeterminism.run.shards.Shard`)."""

    @property
    def report(self) -> Path: ...
    @property
    def run(self) -> RunRecord: ...
    @property
    def checks(self) -> list[CheckRecord]: ...

_COMMIT = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")  # SHA-1 or SHA-256


def checkout_commit(root: Path) -> str | None:
    """The commit the git checkout holding ``root`` is at (``git rev-parse HEAD``); None where
    ``root`` is in no git checkout, the checkout has no commit yet, or git is not installed."""
    try:
        done = subprocess.run(["git", "rev-parse", "--verify", "--quiet", "HEAD"], cwd=root,
                              capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    head = done.stdout.strip()
    return head if done.returncode == 0 and _COMMIT.fullmatch(head) else None


def prune_refusals(shards: Sequence[ShardReport], root: Path, head: str | None) -> list[str]:
    """Why ``--prune`` may not delete goldens on these shards' word: each report of another commit
    than ``head`` (``root``'s, None where it has none), or whose ``used`` does not cover its checks."""
    fix = "Merge without --prune, or with the reports of a run of the commit checked out here."
    if head is None:
        return [f"--prune needs the commit checked out in {root} (git rev-parse HEAD found none: not a git "
                "checkout, or no commit yet), to know the reports ran its tests: a report of another commit "
                f"names other tests and checks. {fix}"]
    problems = []
    for shard in shards:
        commit = shard.run.commit
        if commit != head:
            ran = ("records no commit (its run was outside a git checkout, or an older pytest-llmdeterminism "
                   "wrote it)" if commit is None else f"ran at commit {commit[:40]!r}")
            problems.append(f"{shard.report} {ran}, but the checkout at {root} is at {head}: the goldens its "
                            f"tests did not look up may be used by this commit's tests. {fix}")
            continue
        used = {(path, key) for path, key in shard.run.used}
        missing = [f"{check.test} [{check.name!r}]" for check in shard.checks
                   if (shard.run.golden_files.get(check.test.partition("::")[0]), check.name) not in used]
        if missing:
            shown = ", ".join(missing[:3]) + (" …" if len(missing) > 3 else "")
            problems.append(f"{shard.report} lists {len(missing)} check(s) of goldens its 'used' does not "
                            f"name ({shown}): a run's report names every golden its checks looked up, so "
                            f"this one was edited or is damaged, and nothing is pruned on its word. {fix}")
    return problems
