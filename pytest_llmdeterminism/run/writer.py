"""The end of the run: write recorded goldens and candidates, judge unused goldens, prune, write
reports. It reads the ledger and returns what it did as a :class:`RunOutput`; one bad file never
stops the rest, and every problem is reported (and fails the run)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pytest_llmdeterminism.errors import GoldenFileError
from pytest_llmdeterminism.goldens import atomic, judged, store
from pytest_llmdeterminism.goldens.files import GoldenFiles
from pytest_llmdeterminism.goldens.schema import AnyEntry
from pytest_llmdeterminism.reporting import documents, hints, terminal
from pytest_llmdeterminism.reporting.records import RunRecord
from pytest_llmdeterminism.reporting.run_header import source_commit
from pytest_llmdeterminism.run import prune_trust, repro, unused
from pytest_llmdeterminism.run.configuration import NODE_IDS_GIVEN
from pytest_llmdeterminism.run.ledger import FileUpdates, Ledger
from pytest_llmdeterminism.run.options import Options


@dataclass
class RunOutput:
    written: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    unused: dict[str, list[str]] = field(default_factory=dict)  # golden file -> keys no test checked
    pruned: list[str] = field(default_factory=list)
    # golden file -> keys of parametrized cases this run did not collect, kept (--llm-golden-prune=cases)
    cases_kept: dict[str, list[str]] = field(default_factory=dict)
    partial: list[str] = field(default_factory=list)  # why unused goldens were not judged
    held_back: list[str] = field(default_factory=list)  # tests whose recorded goldens were not written


def finish(ledger: Ledger, files: GoldenFiles, options: Options, *, failed: bool) -> RunOutput:
    out = RunOutput()
    if options.repro is not None and not options.plant_defect:  # a planted defect's outputs: never
        _write_repro_packs(ledger, files, options.repro, options, out)  # before goldens change on disk
    recorded, out.held_back = ledger.goldens_to_write()
    _merge(recorded, lambda path: path, lambda n: f"{n} golden{'s' * (n != 1)}", files, out,
           refuse=files.link_out)
    if options.artifacts is not None and not options.plant_defect:  # a planted defect's outputs: never
        # At the golden file's path relative to the rootdir, for review and `llm-golden accept`.
        folder = options.artifacts
        home = [atomic.output_home(folder, options.rootdir)]
        _merge(ledger.candidates, lambda path: folder / files.under_root(path), lambda n: f"{n} candidate(s)",
               files, out, refuse=lambda path: atomic.link_out(path, home, what="candidates"))
        _record_tolerances(ledger, lambda path: folder / files.under_root(path), files, out,
                           refuse=lambda path: atomic.link_out(path, home, what="candidates"))
    out.partial = ledger.why_partial() + (["some tests failed"] if failed else [])
    if not out.partial:
        out.unused, out.cases_kept = find_unused(ledger, files, options.rootdir,
                                                 cases=options.prune == "cases")
        if options.prune and not options.plant_defect:
            _prune(out, files)
    _write_reports(ledger, options, files, out, failed=failed)
    return out


def _merge(updates_by_file: FileUpdates, target: Callable[[Path], Path], describe: Callable[[int], str],
           files: GoldenFiles, out: RunOutput, *,
           refuse: Callable[[Path], str | None] = lambda path: None) -> None:
    for path, updates in sorted(updates_by_file.items()):
        destination = target(Path(path))
        if _wrote(destination, functools.partial(store.merge, destination, updates), files, out, refuse):
            out.written.append(f"{files.display(destination)} ({describe(len(updates))})")


def _record_tolerances(ledger: Ledger, target: Callable[[Path], Path], files: GoldenFiles,
                       out: RunOutput, *, refuse: Callable[[Path], str | None]) -> None:
    """Beside each candidate file, the profile the run set for its candidates, so that the review
    tools judge them as this run did (:mod:`~pytest_llmdeterminism.goldens.judged`)."""
    for path, tolerances in sorted(ledger.candidate_tolerances.items()):
        destination = target(Path(path))
        if not destination.is_file():
            continue  # its candidates were not written: already reported
        _wrote(judged.path_for(destination), functools.partial(judged.merge, destination, tolerances),
               files, out, refuse)


def _wrote(destination: Path, write: Callable[[], object], files: GoldenFiles, out: RunOutput,
           refuse: Callable[[Path], str | None]) -> bool:
    """``write()`` the file ``destination`` unless ``refuse`` names why not; a refusal or a failure is
    one line of the run's errors (the summary reports it and the run is marked failed)."""
    refused = refuse(destination)
    if refused:
        out.errors.append(f"{files.display(destination)}: {refused}")
        return False
    try:
        write()
    except Exception as error:  # noqa: BLE001 - reported in the summary, run marked failed
        out.errors.append(f"{files.display(destination)}: {type(error).__name__}: {error}")
        return False
    return True


def _write_repro_packs(ledger: Ledger, files: GoldenFiles, folder: Path, options: Options,
                       out: RunOutput) -> None:
    def golden(path: Path, key: str, variant: str) -> AnyEntry | None:
        try:
            return files.read(path).get(key, {}).get(variant)
        except GoldenFileError:
            return None  # the check's failure already said why; the pack says it has no golden

    packs = repro.plan(ledger.checks, ledger.candidates, options, golden_file=files.path_for_nodeid,
                       golden=golden)
    written, errors = repro.write(packs, folder, rootdir=options.rootdir)
    out.errors += errors
    if written:
        first = files.display(written[0] / "rerun.sh")
        out.written.append(f"{files.display(folder)} ({len(written)} repro pack(s); rerun one check alone "
                           f"from here with: sh {first})")


def find_unused(ledger: Ledger, files: GoldenFiles, root: Path, *,
                cases: bool = False) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """After a complete, green run: golden keys it proves unused (:mod:`.unused`), per golden file,
    and the keys of parametrized cases it did not collect: unused with ``cases``, else kept."""
    finished = ledger.ran_to_the_end()
    tests_by_module: dict[str, dict[str, str | None]] = {}
    for nodeid in ledger.seen | ledger.collected:
        module, _, test = nodeid.partition("::")
        if test:
            tests_by_module.setdefault(module, {})[test] = \
                ledger.outcomes.get(nodeid, "passed") if nodeid in finished else None
    used_by_file: dict[str, set[str]] = {}
    for file_name, key in ledger.used:
        used_by_file.setdefault(str(Path(file_name)), set()).add(key)
    found, kept = {}, {}
    for module, tests in sorted(tests_by_module.items()):
        path = files.path_for_nodeid(module)
        try:
            keys = files.read(path).keys()
        except GoldenFileError:
            continue  # already reported by the tests that read it
        if not keys:
            continue
        used = frozenset(used_by_file.get(str(path), ()))
        run = unused.ModuleRun(tests, module_source(root, module), used)
        keys_unused = unused.unused_keys(keys, run, cases=cases)
        if keys_unused:
            found[str(path)] = keys_unused
        cases_kept = [] if cases else unused.uncollected_cases(keys, run)
        if cases_kept:
            kept[str(path)] = cases_kept
    return found, kept


MAX_MODULE_BYTES = 64 * 1024 * 1024


def module_source(root: Path, module: str) -> str | None:
    """The text of test module ``module`` (a node id's path, relative to ``root``), or None when it
    is not a readable file inside ``root``: then no golden of it can be proven unused."""
    path = Path(os.path.realpath(root / module))
    if Path(os.path.realpath(root)) not in path.parents:
        return None
    try:
        return store.read_regular_file(path, max_bytes=MAX_MODULE_BYTES).decode("utf-8", errors="replace")
    except (OSError, store.UnreadableFileError):
        return None


def _prune(out: RunOutput, files: GoldenFiles) -> None:
    for path, keys in sorted(out.unused.items()):
        refused = files.link_out(Path(path))
        if refused:
            out.errors.append(f"{files.display(Path(path))}: not pruned: {refused}")
            continue
        try:
            store.remove(Path(path), keys)
        except (GoldenFileError, OSError) as error:
            out.errors.append(f"{files.display(Path(path))}: {error}")
        else:
            out.pruned += [f"{files.display(Path(path))} [{key!r}]" for key in keys]
    out.unused = {}


def _write_reports(ledger: Ledger, options: Options, files: GoldenFiles, out: RunOutput, *,
                   failed: bool) -> None:
    """``--llm-report`` (JSON, Markdown or HTML), and the Markdown summary for GitHub Actions. The
    JSON report also says what the run checked (``run``), for ``llm-golden merge`` of shards."""
    if not ledger.checks and not options.reports:
        return
    lead = {"header": {**ledger.header, **({"commit": [commit]} if (commit := source_commit(options.rootdir))
                                            else {})},
            "next_steps": next_steps(ledger, out, files, options)}
    document = documents.run_report(ledger.checks, ledger.audits, lead=lead)
    markdown = documents.run_report_markdown(document)
    for path in options.reports:
        chosen = documents.format_of(path)
        assert chosen is not None, path  # the option's check refused any other suffix
        if chosen.records_the_run:
            record = run_record(ledger, files, options, failed=failed, report_folder=path.parent)
            text = chosen.render(documents.run_report(ledger.checks, ledger.audits, run=record, lead=lead),
                                 markdown)
        else:
            text = chosen.render(document, markdown)
        try:
            atomic.write_text_atomic(path, text, homes=[atomic.output_home(path.parent, options.rootdir)],
                                     what="reports", mode=atomic.new_file_mode())
            out.written.append(f"{files.display(path)} (report)")
        except OSError as error:
            out.errors.append(f"{files.display(path)}: {error}")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary and ledger.checks:
        with open(step_summary, "a", encoding="utf-8") as handle:
            handle.write(markdown)


def run_record(ledger: Ledger, files: GoldenFiles, options: Options, *, failed: bool,
               report_folder: Path) -> RunRecord:
    """What this run checked, in terms another machine's checkout shares (see :class:`RunRecord`)."""
    suite = sorted(ledger.collected | ledger.deselected)
    ran = ledger.ran_to_the_end()
    modules = sorted({nodeid.partition("::")[0] for nodeid in suite if "::" in nodeid})
    candidates = None
    if options.artifacts is not None and not options.plant_defect:  # a planted defect's outputs: never
        relative = os.path.relpath(options.artifacts, report_folder) if options.artifacts.anchor == \
            report_folder.anchor else str(options.artifacts)
        candidates = Path(relative).as_posix()
    return RunRecord(
        suite=suite,
        selected=sorted(ledger.collected),
        outcomes={nodeid: ledger.outcomes.get(nodeid, "passed") for nodeid in sorted(ran)},
        golden_files={module: files.portable(files.path_for_nodeid(module)) for module in modules},
        used=sorted({(files.portable(Path(path)), key) for path, key in ledger.used}),
        stopped=ledger.incomplete(),
        partial=ledger.why_partial(),
        failed=failed,
        suite_collected=NODE_IDS_GIVEN not in ledger.partial_reasons,
        candidates=candidates,
        commit=prune_trust.checkout_commit(options.rootdir),
    )


def next_steps(ledger: Ledger, out: RunOutput, files: GoldenFiles, options: Options) -> list[str]:
    """What the reports tell the reviewer to run next: the commands the terminal gives (each failing
    test's accept command, as its failure says; after a new checkpoint, the tolerance and the review
    commands; the prune command for unused goldens)."""
    folder = options.artifacts
    candidates = None if options.plant_defect or folder is None else files.display(folder)
    failing = sorted(nodeid for nodeid, outcome in ledger.outcomes.items() if outcome == "failed")
    accept = [ledger.accept[nodeid] for nodeid in failing if nodeid in ledger.accept]
    more = len(accept) - _ACCEPTS_LISTED
    lines = ["review each failing test's checks, then record or accept its goldens (as its failure says):",
             *(f"  {command}" for command in accept[:_ACCEPTS_LISTED]),
             *([f"  … {more} more failing test(s)"] if more > 0 else [])] if accept else []
    lines += hints.after_model_change(ledger.checks, candidates=candidates)
    lines += terminal.unused_summary(out.unused, [], [], files.display, prune=options.prune is not None)
    return lines


_ACCEPTS_LISTED = 20


def summary_lines(ledger: Ledger, out: RunOutput | None, files: GoldenFiles, *, prune: bool,
                  candidates: Path | None = None) -> list[str]:
    """``candidates``: the ``--llm-golden-artifacts`` folder, which the review commands are named with."""
    out = out or RunOutput(partial=ledger.why_partial())
    folder = files.display(candidates) if candidates is not None else None
    return terminal.summary(dict(ledger.outcome_counts()), out.written, out.errors, ledger.notes,
                            out.held_back, ledger.overwritten()) + \
        hints.after_model_change(ledger.checks, candidates=folder) + \
        terminal.unused_summary(out.unused, out.pruned, out.partial, files.display, prune=prune,
                                stopped=bool(ledger.stop_reasons), cases_kept=out.cases_kept) + \
        terminal.audit_summary(ledger.audits)
