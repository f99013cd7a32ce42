"""One review from the shards of a suite: ``llm-golden merge``.

A CI job matrix runs one suite in N shards (pytest-split's ``--splits N --group i``, or any ``-k`` /
path split). Each shard is a partial run: its JSON report lists its checks and, in ``run``
(:class:`~pytest_llmdeterminism.reporting.records.RunRecord`), what it collected, ran and looked up; its
``--llm-golden-artifacts`` folder holds its candidates. Merging them gives one candidate tree, one
report and one decision on unused goldens, made only when the shards together ran every test of
the suite. Everything is read and checked first (:func:`plan`), here; writing a plan without
problems, and the summary of what it found, are :mod:`~pytest_llmdeterminism.run.merge_writer`'s.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from pytest_llmdeterminism.errors import GoldenFileError, LLMDeterminismError
from pytest_llmdeterminism.goldens import schema, store
from pytest_llmdeterminism.goldens.acceptance import candidate_files
from pytest_llmdeterminism.goldens.files import GOLDEN_FOLDER, GoldenFiles
from pytest_llmdeterminism.reporting import documents
from pytest_llmdeterminism.reporting.records import CheckRecord, RunRecord, report_strings_problem
from pytest_llmdeterminism.run import prune_trust, unused
from pytest_llmdeterminism.run.writer import module_source

MAX_REPORT_BYTES = 256 * 1024 * 1024  # a report is artifact input: refused unread above this
_WORST = {"passed": 0, "skipped": 1, "failed": 2}
MergedCandidates = dict[str, schema.Goldens]  # candidate file (relative to the candidates folder) -> goldens


class _ReportDocument(msgspec.Struct):
    schema: str
    version: int
    checks: list[CheckRecord]
    audits: list[dict[str, Any]] = msgspec.field(default_factory=list)
    run: RunRecord | None = None


@dataclass(frozen=True)
class Shard:
    """One shard's JSON report, read and validated."""

    report: Path
    checks: list[CheckRecord]
    audits: list[tuple[str, dict[str, Any]]]
    run: RunRecord

    @property
    def failed(self) -> bool:
        """Whether the shard failed: as its report says, or as its checks and outcomes show (a
        report is an artifact; ``failed: false`` beside a failed check is not believed)."""
        return (self.run.failed or any(not check.passed for check in self.checks)
                or "failed" in self.run.outcomes.values())

    @property
    def candidates(self) -> Path | None:
        """The shard's ``--llm-golden-artifacts`` folder, where its report says it is."""
        return None if self.run.candidates is None else self.report.parent / self.run.candidates


class ShardError(LLMDeterminismError):
    """A report that cannot be merged; the message says what and how to fix it."""


def read_shard(path: Path) -> Shard:
    """The shard whose JSON report is ``path``; :class:`ShardError` when it is not one."""
    rerun = ("Give the .json file that `pytest --llm-report=PATH.json` wrote (in each shard), with this "
             "version of pytest-llmdeterminism.")
    try:
        data = store.read_regular_file(path, max_bytes=MAX_REPORT_BYTES)
    except FileNotFoundError:
        raise ShardError(f"{path} does not exist. {rerun}") from None
    except store.UnreadableFileError as error:  # a FIFO would block, a huge file fill the memory
        raise ShardError(f"{path} {error.reason}. {rerun}") from None
    try:
        document = msgspec.convert(_infinite_again(msgspec.json.decode(data)), _ReportDocument)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise ShardError(f"{path} is not a pytest-llmdeterminism JSON report ({error}). {rerun}") from None
    if document.schema != documents.REPORT_SCHEMA or document.version != documents.REPORT_VERSION:
        raise ShardError(f"{path} has schema {document.schema!r} version {document.version!r}; this "
                         f"pytest-llmdeterminism merges {documents.REPORT_SCHEMA!r} version "
                         f"{documents.REPORT_VERSION}. {rerun}")
    problem = report_strings_problem(document.checks, document.run)
    if problem:  # before a string of it is printed or trusted
        raise ShardError(f"{path} is not a report this plugin wrote: {problem}. {rerun}")
    if document.run is None:
        raise ShardError(f"{path} has no 'run' section (which tests the shard collected and ran), so it "
                         f"cannot say what the shard covered. {rerun}")
    suite = set(document.run.suite)
    strays = sorted((set(document.run.outcomes) | set(document.run.selected)) - suite)
    if strays:  # pytest's record of a run never has them: a report edited or put together by hand
        raise ShardError(f"{path} says tests ran that its suite does not hold ({', '.join(strays[:3])}"
                         f"{' …' if len(strays) > 3 else ''}), so it cannot say what the shard covered. "
                         f"{rerun}")
    audits = [(str(audit.pop("test", "")), audit) for audit in document.audits]
    return Shard(path, document.checks, audits, document.run)


def _infinite_again(document: Any) -> Any:
    """A report as written, with the infinite numbers its JSON wrote as null (strict JSON has no
    infinity) infinite again: a drift beyond every logprob, a margin where the second token had none."""
    checks = document.get("checks") if isinstance(document, dict) else None
    for check in checks if isinstance(checks, list) else ():
        if isinstance(check, dict) and check.get("max_logprob_delta", 0.0) is None:
            check["max_logprob_delta"] = math.inf
        steps = check.get("steps") if isinstance(check, dict) else None
        for side in steps.values() if isinstance(steps, dict) else ():
            for step in side if isinstance(side, list) else ():
                if isinstance(step, list) and len(step) > 2 and step[2] is None:
                    step[2] = math.inf
    return document


@dataclass(frozen=True)
class Coverage:
    """Which tests of the suite the shards ran, together."""

    suite: list[str]  # every test any shard collected, deselected ones included
    not_run: list[str]  # tests of the suite that ran to their end in no shard
    twice: list[str]  # tests that ran in more than one shard (their checks count once per shard)


def coverage(runs: Sequence[RunRecord]) -> Coverage:
    suite = sorted({nodeid for run in runs for nodeid in run.suite})
    seen: dict[str, int] = {}
    for run in runs:
        for nodeid in run.outcomes:
            seen[nodeid] = seen.get(nodeid, 0) + 1
    return Coverage(suite, [nodeid for nodeid in suite if nodeid not in seen],
                    sorted(nodeid for nodeid, n in seen.items() if n > 1))


def partial_reasons(shards: Sequence[Shard], covered: Coverage) -> list[str]:
    """Why the shards together do not speak for the whole suite; none when they do, all passing."""
    reasons = [f"{shard.report}: {reason}" for shard in shards for reason in shard.run.stopped]
    reasons += [f"{shard.report}: test ids on the command line, so the rest of the suite was not collected"
                for shard in shards if not shard.run.suite_collected]
    if covered.not_run:
        reasons.append(f"{len(covered.not_run)} of {len(covered.suite)} test(s) of the suite ran in no shard")
    if any(shard.failed for shard in shards):
        reasons.append("some tests failed")
    return reasons


def merged_run(shards: Sequence[Shard], partial: list[str], candidates: str | None) -> RunRecord:
    """The shards' records as one run's: a merged report can be merged again."""
    outcomes: dict[str, str] = {}
    commits = {shard.run.commit for shard in shards}
    for shard in shards:
        for nodeid, outcome in shard.run.outcomes.items():
            if _WORST.get(outcome, 0) >= _WORST.get(outcomes.get(nodeid, "passed"), 0):
                outcomes[nodeid] = outcome
    return RunRecord(
        suite=sorted({nodeid for shard in shards for nodeid in shard.run.suite}),
        selected=sorted({nodeid for shard in shards for nodeid in shard.run.selected}),
        outcomes=dict(sorted(outcomes.items())),
        golden_files=dict(sorted(golden_files(shards)[0].items())),
        used=sorted({(path, key) for shard in shards for path, key in shard.run.used}),
        stopped=[f"{shard.report}: {reason}" for shard in shards for reason in shard.run.stopped],
        partial=partial,
        failed=any(shard.failed for shard in shards),
        suite_collected=all(shard.run.suite_collected for shard in shards),
        candidates=candidates,
        commit=commits.pop() if len(commits) == 1 else None,  # the shards' one commit
    )


def golden_files(shards: Sequence[Shard]) -> tuple[dict[str, str], list[str]]:
    """Each test module's golden file, and the modules that two shards put in different files."""
    files: dict[str, tuple[str, Path]] = {}
    problems = []
    for shard in shards:
        for module, path in shard.run.golden_files.items():
            known = files.setdefault(module, (path, shard.report))
            if known[0] != path:
                problems.append(f"{module}'s goldens are in {known[0]} for {known[1]} but in {path} for "
                                f"{shard.report}: run every shard with the same llm_golden_dir")
    return {module: path for module, (path, _) in files.items()}, problems


def merge_candidates(shards: Sequence[Shard]) -> tuple[MergedCandidates, list[str]]:
    """Every shard's candidates in one tree, and every problem: an unreadable or unsafe folder, a
    file that is not a golden file, or a conflict (two shards wrote one golden differently)."""
    merged: MergedCandidates = {}
    written_by: dict[tuple[str, str, str], Path] = {}
    problems: list[str] = []
    for shard in shards:
        folder = shard.candidates
        if folder is None:
            continue
        if not folder.is_dir():
            if shard.failed:  # a failing shard wrote candidates: they must not go missing unnoticed
                problems.append(
                    f"{folder} does not exist, but {shard.report} says its shard wrote its candidates there "
                    f"(--llm-golden-artifacts). Download the shard's candidates folder beside its report, in "
                    f"the layout the shard wrote, e.g. {shard.report.parent / str(shard.run.candidates)}/")
            continue
        names, found = candidate_files(folder)
        problems += found
        goldens_of_shard = {path for path in shard.run.golden_files.values() if not Path(path).is_absolute()}
        for name in names:
            if name.parent.name != GOLDEN_FOLDER and name.as_posix() not in goldens_of_shard:
                problems.append(f"{folder / name} is not the golden file of any test its shard ran: a "
                                "candidates folder holds only those. Remove it.")
                continue
            try:
                goldens = store.read(folder / name)
            except GoldenFileError as error:
                problems.append(str(error))
                continue
            into = merged.setdefault(name.as_posix(), {})
            for key, variants in goldens.items():
                for variant, entry in variants.items():
                    earlier = into.setdefault(key, {}).setdefault(variant, entry)
                    where = (name.as_posix(), key, variant)
                    if earlier != entry:
                        first = written_by[where]
                        problems.append(_conflict(name, key, variant, first, shard.report, earlier, entry))
                    written_by.setdefault(where, shard.report)
    return merged, problems


def _conflict(name: Path, key: str, variant: str, first: Path, second: Path,
              a: schema.AnyEntry, b: schema.AnyEntry) -> str:
    fields = [f for f in a.__struct_fields__ if getattr(a, f) != getattr(b, f)]
    if "fingerprint" in fields:
        from pytest_llmdeterminism.judge.fingerprint import diff

        changed = ", ".join(f for f, _, _ in diff(a.fingerprint, b.fingerprint))
        fields[fields.index("fingerprint")] = f"fingerprint ({changed})"
    return (f"conflict: {name} [{key!r}][{variant!r}] differs between the candidates of {first} and of "
            f"{second} ({', '.join(fields)}). Two shards ran this check and got different results, so "
            "neither is kept. Give every shard job the same --splits N and its own --group i (one test runs "
            "in one shard), or merge only the reports of one attempt of each shard.")


def unused_goldens(root: Path, run: RunRecord, *,
                   cases: bool = False) -> tuple[dict[str, list[str]], dict[str, list[str]], list[str]]:
    """After shards that together ran the whole suite, all passing: the golden keys they prove unused
    (:mod:`~pytest_llmdeterminism.run.unused`), per golden file (as in ``run.golden_files``), read from
    the checkout at ``root``. The reports are artifacts: a golden of a test that the checkout's module
    still defines is kept unless the shards ran it, whatever a report leaves out. Then the keys of
    parametrized cases no shard collected: unused with ``cases`` (``--prune=cases``), else kept."""
    tests_by_module: dict[str, dict[str, str | None]] = {}
    for nodeid in run.suite:
        module, _, test = nodeid.partition("::")
        if test:
            tests_by_module.setdefault(module, {})[test] = run.outcomes.get(nodeid)
    used: dict[str, set[str]] = {}
    for file_name, key in run.used:
        used.setdefault(file_name, set()).add(key)
    found: dict[str, list[str]] = {}
    kept: dict[str, list[str]] = {}
    problems = []
    for module, tests in sorted(tests_by_module.items()):
        path = run.golden_files.get(module)
        if path is None:
            continue
        file = root / path
        if not file.exists():
            if path in used:  # a shard read goldens there: this is not the project the shards ran
                problems.append(f"{file} does not exist, but the shards checked goldens in it: run merge in "
                                "the project's root (where pytest ran), or give it with --root DIR")
            continue
        try:
            keys = store.read(file).keys()
        except GoldenFileError as error:
            problems.append(str(error))
            continue
        source = module_source(root, module)  # None for a module outside the root, however named
        module_run = unused.ModuleRun(tests, source, frozenset(used.get(path, ())))
        found[path] = unused.unused_keys(keys, module_run, cases=cases)
        kept[path] = [] if cases else unused.uncollected_cases(keys, module_run)
    return {p: k for p, k in found.items() if k}, {p: k for p, k in kept.items() if k}, problems


@dataclass
class MergePlan:
    shards: list[Shard]
    coverage: Coverage
    run: RunRecord
    candidates: MergedCandidates
    unused: dict[str, list[str]]
    problems: list[str] = field(default_factory=list)  # any: nothing is written
    cases_kept: dict[str, list[str]] = field(default_factory=dict)  # uncollected cases' keys, kept

    @property
    def complete(self) -> bool:
        """Whether the shards together ran every test of the suite to its end (passing or not)."""
        return (not self.coverage.not_run and not self.run.stopped and self.run.suite_collected
                and bool(self.shards))

    @property
    def checks(self) -> list[CheckRecord]:
        return [check for shard in self.shards for check in shard.checks]

    def document(self) -> dict[str, Any]:
        audits = [audit for shard in self.shards for audit in shard.audits]
        return documents.run_report(self.checks, audits, run=self.run)


def plan(reports: Iterable[Path], root: Path, *, candidates_out: Path | None = None,
         json_report: Path | None = None, golden_dir: Path | None = None, cases: bool = False) -> MergePlan:
    """Read and check every shard; merge candidates; judge unused goldens when the shards are complete.

    ``golden_dir`` is the project's llm_golden_dir (absolute, or relative to ``root``): a report's
    golden files must be where it puts them, or beside their modules when it is None.
    """
    root = Path(os.path.abspath(root))
    files = GoldenFiles(None if golden_dir is None else root / golden_dir, root, Path.cwd())
    shards, problems = [], []
    for path in reports:
        try:
            shards.append(read_shard(path))
        except ShardError as error:
            problems.append(str(error))
    untrusted = [problem for shard in shards for problem in prune_trust.trust_problems(shard, files)]
    if untrusted:  # nothing else of theirs is read: their paths may lead anywhere
        problems += untrusted
        covered = coverage([shard.run for shard in shards])
        return MergePlan(shards, covered, merged_run(shards, [], None), {}, {}, problems)
    covered = coverage([shard.run for shard in shards])
    partial = partial_reasons(shards, covered)
    relative = None
    if candidates_out is not None:
        relative = Path(os.path.relpath(candidates_out, json_report.parent) if json_report
                        else candidates_out)
    run = merged_run(shards, partial, relative.as_posix() if relative is not None else None)
    problems += golden_files(shards)[1]
    merged, found = merge_candidates(shards)
    problems += found
    unused: dict[str, list[str]] = {}
    kept: dict[str, list[str]] = {}
    if not partial and shards:
        unused, kept, found = unused_goldens(root, run, cases=cases)
        problems += found
    return MergePlan(shards, covered, run, merged, unused, problems, cases_kept=kept)
