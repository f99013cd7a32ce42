"""What ``llm-golden merge`` believes of a shard's report: the paths it names (``trust_problems``:
golden files the project's configuration gives its own modules, candidates inside its own folder),
and which reports ``--prune`` may delete goldens on (``prune_refusals``): only reports of the commit
checked out where it prunes, each naming every golden its checks looked up.

A report is CI artifact input. What its tests checked and looked up is believed only for the commit
it ran at: a stale report of another commit (without malice) names other tests and other checks,
and the goldens it did not look up may be used here. And a report whose ``used`` leaves out goldens
its own checks compared with is not one a run wrote (it was edited, or is damaged): on its word a
whole golden file would go.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pytest_llmdeterminism.goldens.files import GoldenFiles
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


_UNTRUSTED = ("A shard report is CI artifact input, so merge follows none of its paths blindly: give the "
              "reports that `pytest --llm-report` wrote for this project, and merge them in its root with "
              "its llm_golden_dir (or --golden-dir D)")


def trust_problems(shard: ShardReport, files: GoldenFiles) -> list[str]:
    """Every path of a shard's report that reaches outside what the report may name: each of its
    modules' golden file must be the one the project's configuration gives that module (under the
    root, no link leading out), and its candidates folder must lie inside the report's own folder."""
    own_modules = {nodeid.partition("::")[0] for nodeid in shard.run.suite if "::" in nodeid}
    problems = []
    for module, path in sorted(shard.run.golden_files.items()):
        problem = _golden_file_problem(module, path, own_modules, files)
        if problem:
            problems.append(f"{shard.report}: 'golden_files' maps {module!r} to {path!r}, {problem}. "
                            f"{_UNTRUSTED}.")
    problem = _candidates_problem(shard)
    if problem:
        problems.append(f"{shard.report}: 'candidates' is {shard.run.candidates!r}, {problem}. Keep each "
                        "shard's --llm-golden-artifacts folder inside the folder of its --llm-report, e.g. "
                        "--llm-report=shard1/report.json --llm-golden-artifacts=shard1/candidates.")
    return problems


def _golden_file_problem(module: str, path: str, own_modules: set[str], files: GoldenFiles) -> str | None:
    if not _plain_relative(module):
        return "but a test module is a path inside the root, relative to it, without '..'"
    if module not in own_modules:
        return ("but no test of that module is in the report's own suite: a report names only the golden "
                "files of its own modules")
    expected = files.portable(files.path_for_nodeid(module))
    if path != expected:
        return (f"but the project keeps {module}'s goldens in {expected!r} ({files.describe_location()}); "
                "merge reads and prunes only that file")
    link = files.link_out(files.path_for_nodeid(module))
    return None if link is None else f"and {link.rstrip('.')}"


def _candidates_problem(shard: ShardReport) -> str | None:
    given = shard.run.candidates
    if given is None:
        return None
    if not _plain_relative(given):
        return (f"not a folder inside the report's own folder {str(shard.report.parent)!r}: merge reads a "
                "shard's candidates only from beside its report (one artifact per shard)")
    folder = shard.report.parent / given
    real, home = os.path.realpath(folder), os.path.realpath(shard.report.parent)
    if os.path.commonpath([real, home]) != home:
        return (f"and {folder} resolves to {real}, outside the report's own folder {home} (a symbolic link "
                "leads out): merge follows no link out of a shard's artifact")
    return None


def _plain_relative(name: str) -> bool:
    """A path relative to its folder that cannot climb out of it by its words alone."""
    path = PurePosixPath(name.replace("\\", "/"))
    climbs = path.is_absolute() or bool(PureWindowsPath(name).drive) or ".." in path.parts
    return bool(name) and not climbs
