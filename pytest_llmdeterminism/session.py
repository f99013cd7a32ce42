"""The run: model cache, golden file cache, queued golden writes and outcome counts.

Kept in ``config.stash``. Golden writes are decided during tests and flushed once at the end of
the run. Under pytest-xdist, workers send their queued writes to the controller through
``workeroutput`` and only the controller writes.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from pytest_llmdeterminism import report, store
from pytest_llmdeterminism.errors import (
    ConfigurationError,
    GoldenFileError,
    LLMDeterminismError,
    ModelLoadError,
)
from pytest_llmdeterminism.options import BatchShape, Options, validate_marker_kwargs
from pytest_llmdeterminism.records import CheckRecord, GoldenWrite, TestRecords
from pytest_llmdeterminism.tolerance import Profile

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from pytest_llmdeterminism.backends import LoadedModel
    from pytest_llmdeterminism.compare import Comparison
    from pytest_llmdeterminism.generation import Generation
    from pytest_llmdeterminism.model import GenerationSettings

REPORT_ATTRIBUTE = "llm_golden"  # test reports carry each test's golden outcomes
GOLDEN_FOLDER = "__golden__"
MARKER = "deterministic"


class TestOutcomes:
    """What one test's golden checks decided, as typed :class:`TestRecords`. Travels on the test's
    report, so under xdist the controller has it as soon as the test ends, even if the worker
    later dies."""

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        self.data = TestRecords()

    @property
    def sequence(self) -> list[str]:
        return self.data.sequence

    @property
    def checks(self) -> list[CheckRecord]:
        return self.data.checks

    @property
    def audits(self) -> list[dict[str, Any]]:
        return self.data.audits

    def record(self, path: Path, key: str, generation: Generation, *, outcome: str) -> None:
        self.data.records.append(_golden_write(path, key, generation))
        self.count(outcome)

    def count(self, outcome: str) -> None:
        self.data.counts[outcome] = self.data.counts.get(outcome, 0) + 1
        self.data.sequence.append(outcome)

    def note(self, line: str) -> None:
        self.data.notes.append(line)

    def candidate(self, path: Path, key: str, generation: Generation) -> None:
        """A missing or failing check's actual result, for ``--llm-golden-artifacts``."""
        self.data.candidates.append(_golden_write(path, key, generation))

    def used(self, path: Path, key: str) -> None:
        self.data.used.append((str(path), key))

    def checked(self, key: str, variant: str, comparison: Comparison, *, passed: bool, profile: str = "",
                changed: Sequence[tuple[str, Any, Any]] = (), numerics_changed: Sequence[str] = (),
                expected: Generation | None = None, actual: Generation | None = None) -> None:
        """One golden comparison's result, as the machine-readable report lists it."""
        verdict = comparison.verdict.value
        self.count(verdict if passed else f"{verdict} (failed)")
        divergence = comparison.divergence
        self.data.checks.append(CheckRecord(
            name=key, variant=variant, verdict=verdict, passed=passed, profile=profile,
            first_divergence=divergence.step if divergence else comparison.first_hash_step,
            golden_margin=divergence.golden_margin if divergence else None,
            max_logprob_delta=comparison.max_logprob_delta, tie_margin=comparison.tie_margin,
            input_changes=[field for field, _, _ in comparison.input_changes],
            changed_fingerprint={field: (old, new) for field, old, new in changed},
            numerics_changed=list(numerics_changed),
            steps={side: _steps(gen) for side, gen in (("expected", expected), ("actual", actual)) if gen},
        ))

    def to_json(self) -> dict[str, Any] | None:
        return None if self.data.is_empty() else self.data.to_payload()


def _golden_write(path: Path, key: str, generation: Generation) -> GoldenWrite:
    return GoldenWrite(str(path), key, generation.variant, store.to_struct(store.to_entry(generation)))


def _steps(generation: Generation, limit: int = 64) -> list[tuple[str, int, float, float | None]]:
    """``(piece, token id, margin, top-1 logprob)`` per step, for the HTML report."""
    return [(piece, token, margin, top[0][1] if top else None)
            for piece, token, margin, top in zip(generation.pieces, generation.token_ids, generation.margins,
                                                 generation.top_logprobs)][:limit]


def _file_updates(into: dict[str, dict[str, dict[str, store.Entry]]], rows: Iterable[GoldenWrite]) -> None:
    """Fold golden writes into ``file -> key -> variant -> entry``."""
    for row in rows:
        into.setdefault(row.path, {}).setdefault(row.key, {})[row.variant] = row.entry


class LLMSession:
    def __init__(self, options: Options) -> None:
        self.options = options
        self._models: dict[tuple[str, str, str], LoadedModel | LLMDeterminismError] = {}
        self._goldens: dict[Path, store.Goldens] = {}
        self.pending: dict[str, dict[str, dict[str, store.Entry]]] = {}  # file -> key -> variant -> entry
        self.counts: Counter[str] = Counter()
        self.written: list[str] = []
        self.write_errors: list[str] = []
        self.notes: list[str] = []
        self.audits: list[tuple[str, dict[str, Any]]] = []  # (test id, AuditReport.to_json())
        self.checks: list[CheckRecord] = []  # every golden comparison, for --llm-report
        self.used_keys: set[tuple[str, str]] = set()
        self.candidates: dict[str, dict[str, dict[str, store.Entry]]] = {}  # like pending, for artifacts
        self.test_outcomes: dict[str, str] = {}  # node id -> passed / failed / skipped
        self.partial_reasons: list[str] = list(options.partial)  # why unused goldens cannot be judged
        self.unused: dict[str, list[str]] = {}
        self.pruned: list[str] = []

    # -- models ---------------------------------------------------------------------------
    def loaded_model(self) -> LoadedModel:
        __tracebackhide__ = True
        from pytest_llmdeterminism import backends

        spec = self.options.model
        if spec is None:
            raise ConfigurationError(
                "llm_model", None,
                "no model configured. Set llm_model in your pytest ini (e.g. llm_model = \"builtin:tiny\" "
                "or a local folder / .gguf file) or pass --llm-model=PATH",
            )
        key = (spec, self.options.dtype, self.options.device)
        if key not in self._models:
            try:
                self._models[key] = backends.load(spec, dtype=self.options.dtype, device=self.options.device,
                                                  cpu_numerics=self.options.cpu_numerics)
            except LLMDeterminismError as error:
                self._models[key] = error  # fail every test the same way, without loading again
            except Exception as error:  # noqa: BLE001 - any failure, reported once per test, never retried
                self._models[key] = ModelLoadError(spec, f"{type(error).__name__}: {error}")
        loaded = self._models[key]
        if isinstance(loaded, LLMDeterminismError):
            raise loaded.with_traceback(None)  # one error object for many tests: no earlier test's frames
        return loaded

    def _marker_kwargs(self, item: pytest.Item) -> dict[str, object]:
        """Arguments of every ``@deterministic`` on the test, its class and module; closest wins."""
        __tracebackhide__ = True
        merged: dict[str, object] = {}
        for marker in reversed(list(item.iter_markers(MARKER))):  # farthest first
            if marker.args:
                raise ConfigurationError(f"@deterministic in {item.nodeid}", marker.args,
                                         "takes keyword arguments only, e.g. @deterministic(max_new_tokens=24)")
            merged.update(marker.kwargs)
        return validate_marker_kwargs(merged, item.nodeid)

    def tolerance_for(self, item: pytest.Item) -> Profile | None:
        """The marker's ``tolerance=`` profile; None lets the options decide per device class."""
        __tracebackhide__ = True
        profile = self._marker_kwargs(item).get("tolerance")
        assert profile is None or isinstance(profile, Profile)
        return profile

    def audit_hook(self, item: pytest.Item, outcomes: TestOutcomes) -> Any:
        """Under ``--llm-audit``, what ``llm_model.generate`` calls after each deterministic call."""
        if self.options.audit is None or item.get_closest_marker(MARKER) is None:
            return None
        repeats, dtype = self.options.audit, self.options.audit_dtype

        def after_generate(llm: Any, results: list[Generation], overrides: dict[str, Any]) -> None:
            __tracebackhide__ = True
            from pytest_llmdeterminism.audit import NondeterminismError, audit

            for result in results:
                found = audit(llm, result.prompt, repeats=repeats, dtype=dtype, **overrides)
                outcomes.audits.append(found.to_json())
                if found.nondeterministic:
                    raise NondeterminismError(found)

        return after_generate

    def settings_for(self, item: pytest.Item) -> GenerationSettings:
        __tracebackhide__ = True
        from pytest_llmdeterminism.model import GenerationSettings

        given = self._marker_kwargs(item)
        shape = given.get("batch_shape", self.options.batch_shape)
        assert isinstance(shape, BatchShape)
        return GenerationSettings(
            batch_shape=shape,
            batch_shape_setting="@deterministic(batch_shape=...)" if "batch_shape" in given else "llm_batch_shape",
            max_new_tokens=int(given.get("max_new_tokens", self.options.max_new_tokens)),  # type: ignore[call-overload]
            seed=int(given.get("seed", self.options.seed)),  # type: ignore[call-overload]
        )

    # -- goldens --------------------------------------------------------------------------
    def golden_path(self, test_path: Path) -> Path:
        if self.options.golden_dir is None:
            return test_path.parent / GOLDEN_FOLDER / f"{test_path.stem}.json"
        return self.options.golden_dir / self._under_root(test_path).with_suffix(".json")

    def _under_root(self, path: Path) -> Path:
        """``path`` relative to the rootdir, or just its name when it lies outside."""
        try:
            return path.relative_to(self.options.rootdir)
        except ValueError:
            return Path(path.name)

    def rerun_arguments(self, item: pytest.Item) -> str:
        """Shell arguments that select this test from where pytest was started, with the run's own
        ``--llm-*`` options (model, dtype, shape...), so a printed command acts on the same variant."""
        path = os.path.relpath(item.path, item.config.invocation_params.dir)
        target = f"{path}::{item.nodeid.split('::', 1)[1]}" if "::" in item.nodeid else path
        return " ".join(report.shell_quote(arg) for arg in (target, *self.options.cli_settings))

    def display_path(self, path: Path) -> str:
        """``path`` as the user would type it from where pytest was started."""
        relative = os.path.relpath(path, self.options.invocation_dir)
        return path.as_posix() if relative.startswith("..") else relative

    def goldens(self, path: Path) -> store.Goldens:
        __tracebackhide__ = True
        if path not in self._goldens:
            self._goldens[path] = store.read(path)
        return self._goldens[path]

    # -- end of each test, end of run ----------------------------------------------------
    def collect(self, payload: dict[str, Any], nodeid: str = "", duration: float = 0.0) -> None:
        """Take one test's outcomes (:meth:`TestOutcomes.to_json`), from this process or a worker."""
        records = TestRecords.from_payload(payload)
        _file_updates(self.pending, records.records)
        self.counts.update(records.counts)
        self.notes += [note for note in records.notes if note not in self.notes]
        self.audits += [(nodeid, audit) for audit in records.audits]
        self.checks += [msgspec.structs.replace(check, test=nodeid, test_duration_s=round(duration, 4))
                        for check in records.checks]
        self.used_keys.update(records.used)
        _file_updates(self.candidates, records.candidates)

    def flush(self) -> None:
        """Write every queued golden, one atomic write per file."""
        self._merge_files(self.pending, lambda path: path, lambda n: f"{n} golden{'s' * (n != 1)}")
        self.pending.clear()

    def _merge_files(self, updates_by_file: dict[str, dict[str, dict[str, store.Entry]]],
                     target: Callable[[Path], Path], describe: Callable[[int], str]) -> None:
        """Merge each file's updates into ``target(file)``; one bad file never stops the rest."""
        for path, updates in sorted(updates_by_file.items()):
            destination = target(Path(path))
            try:
                store.merge(destination, updates)
            except Exception as error:  # noqa: BLE001 - reported in the summary, run marked failed
                self.write_errors.append(f"{self.display_path(destination)}: {type(error).__name__}: {error}")
            else:
                self.written.append(f"{self.display_path(destination)} ({describe(len(updates))})")

    def partial(self, reasons: Iterable[str]) -> None:
        """This run did not visit every test (for the given reasons): unused goldens are not judged."""
        self.partial_reasons += [reason for reason in reasons if reason not in self.partial_reasons]

    def test_finished(self, nodeid: str, when: str, outcome: str) -> None:
        """Keep each test's overall outcome: failed beats skipped beats passed."""
        if when == "call" or outcome != "passed":
            rank = {"passed": 0, "skipped": 1, "failed": 2}
            if rank[outcome] >= rank[self.test_outcomes.get(nodeid, "passed")]:
                self.test_outcomes[nodeid] = outcome

    def find_unused(self, *, failed: bool) -> None:
        """After a complete, green run: golden keys no test checked. Never after a partial run."""
        reasons = list(self.partial_reasons) + (["some tests failed"] if failed else [])
        if reasons or not self.test_outcomes:
            self.partial_reasons = reasons
            return
        by_module: dict[Path, dict[str, str]] = {}
        for nodeid, outcome in self.test_outcomes.items():
            module, _, test = nodeid.partition("::")
            if test:
                golden = self.golden_path(self.options.rootdir / module)
                by_module.setdefault(golden, {})[test] = outcome
        used = {(Path(path), key) for path, key in self.used_keys}
        for path, tests in sorted(by_module.items()):
            try:
                keys = self.goldens(path).keys()
            except GoldenFileError:
                continue  # already reported by the tests that read it
            from pytest_llmdeterminism.golden import unused_keys

            unused = unused_keys(keys, tests, {key for p, key in used if p == path})
            if unused:
                self.unused[str(path)] = unused

    def write_candidates(self) -> None:
        """Candidate goldens of missing and failing checks under ``--llm-golden-artifacts`` DIR,
        at the golden file's path relative to the rootdir, for review and ``llm-golden accept``."""
        folder = self.options.artifacts
        if folder is not None:
            self._merge_files(self.candidates, lambda path: folder / self._under_root(path),
                              lambda n: f"{n} candidate(s)")

    def prune(self) -> None:
        for path, keys in sorted(self.unused.items()):
            try:
                store.remove(Path(path), keys)
            except (GoldenFileError, OSError) as error:
                self.write_errors.append(f"{self.display_path(Path(path))}: {error}")
            else:
                self.pruned += [f"{self.display_path(Path(path))} [{key!r}]" for key in keys]
        self.unused = {}

    def write_reports(self) -> None:
        """``--llm-report`` (JSON or Markdown), and the Markdown summary for GitHub Actions."""
        if not self.checks and self.options.report is None:
            return
        document = report.run_report(self.checks, self.audits)
        markdown = report.run_report_markdown(document)
        if self.options.report is not None:
            suffix = self.options.report.suffix
            text = (json.dumps(document, indent=1, sort_keys=True, allow_nan=False) if suffix == ".json"
                    else report.run_report_html(document) if suffix == ".html" else markdown)
            try:
                store.write_text_atomic(self.options.report, text)
                self.written.append(f"{self.display_path(self.options.report)} (report)")
            except OSError as error:
                self.write_errors.append(f"{self.options.report}: {error}")
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary and self.checks:
            with open(step_summary, "a", encoding="utf-8") as handle:
                handle.write(markdown)

    def header_lines(self) -> list[str]:
        """What the run is pinned to, before anything loads (``pytest_report_header``)."""
        from pytest_llmdeterminism import numerics

        options = self.options
        if options.model is None:
            return []
        return [
            (f"llm: model {options.model}, batch shape {options.batch_shape}, {options.dtype} on "
             f"{options.device}, seed {options.seed}"),
            (f"llm {numerics.describe(options.cpu_numerics)}; batch invariance is verified at the first "
             "generation of each shape"),
        ]

    def summary_lines(self) -> list[str]:
        return report.summary(dict(self.counts), self.written, self.write_errors, self.notes) + \
            report.unused_summary(self.unused, self.pruned, self.partial_reasons, self.display_path,
                                  prune=self.options.prune) + report.audit_summary(self.audits)
