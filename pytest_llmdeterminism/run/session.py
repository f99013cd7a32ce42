"""The run, kept in ``config.stash``: a few parts with one job each, and the fixtures' objects.

- ``models`` (:class:`~pytest_llmdeterminism.engines.ModelCache`): one model load per process;
- ``files`` (:class:`~pytest_llmdeterminism.goldens.files.GoldenFiles`): golden paths, each file read once;
- ``environment`` (:class:`~pytest_llmdeterminism.compute.environment.PinnedEnvironment`): the variables
  the run set, restored at its end;
- ``ledger`` (:class:`~pytest_llmdeterminism.run.ledger.Ledger`): what every test decided, taken from
  test reports (under pytest-xdist, from every worker's);
- per test, in ``item.stash``: its settings (``settings.of``) and its recorder (:class:`TestOutcomes`);
- at the end, ``writer.finish`` writes goldens, candidates and reports and judges unused goldens.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest

from pytest_llmdeterminism.compute import numerics, profiles, threads
from pytest_llmdeterminism.compute.environment import PinnedEnvironment
from pytest_llmdeterminism.compute.kernels import why_not_batch_invariant
from pytest_llmdeterminism.engines import ModelCache
from pytest_llmdeterminism.engines.defect import DEFECT_SCALE
from pytest_llmdeterminism.engines.registry import entry_of
from pytest_llmdeterminism.engines.spec import engine_of
from pytest_llmdeterminism.goldens.files import GoldenFiles
from pytest_llmdeterminism.reporting import terminal
from pytest_llmdeterminism.reporting.progress import Progress
from pytest_llmdeterminism.reporting.recorder import TestOutcomes
from pytest_llmdeterminism.reporting.records import TestRecords
from pytest_llmdeterminism.run import markers as settings
from pytest_llmdeterminism.run import writer
from pytest_llmdeterminism.run.ledger import Ledger
from pytest_llmdeterminism.run.options import Options
from pytest_llmdeterminism.shape import MARKER

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from pytest_llmdeterminism.engines.loaded import LoadedModel
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.run.golden_tokens import GoldenTokens
    from pytest_llmdeterminism.run.markers import ItemSettings

_OUTCOMES = pytest.StashKey[TestOutcomes]()
_NEEDS_MODEL = ("llm_model", "golden_tokens")  # the fixtures that load the model


class LLMSession:
    def __init__(self, options: Options, announce: Callable[[str], None] | None = None,
                 environment: PinnedEnvironment | None = None, *, quiet: bool = False) -> None:
        self.options = options
        self.progress = Progress(announce, quiet=quiet)
        self.environment = environment or PinnedEnvironment(options.cpu_numerics,
                                                            threads.for_this_process(options.threads))
        self.models = ModelCache(options.model, dtype=options.dtype, device=options.device,
                                 cpu_numerics=options.cpu_numerics, announce=announce,
                                 environment=self.environment, plant_defect=options.plant_defect,
                                 batch_invariant=options.batch_invariant,
                                 recording=options.update is not None,
                                 after_load=self._check_serving if options.server_checks else None)
        self.serving: list[str] = []  # llm_server_checks: the serving audit's table, for the header
        self.files = GoldenFiles(options.golden_dir, options.rootdir, options.invocation_dir)
        self.ledger = Ledger(options.partial)
        self.output: writer.RunOutput | None = None

    def _check_serving(self, loaded: LoadedModel) -> None:
        """``llm_server_checks``: a server's serving audited once, as it loads; what it verified goes
        into every golden's fingerprint."""
        from pytest_llmdeterminism.engines.loaded import ServedEngine
        from pytest_llmdeterminism.model.serving_audit import verify_serving

        if isinstance(loaded.engine, ServedEngine):
            self.serving = verify_serving(loaded, seed=self.options.seed).lines()

    def serving_lines(self) -> list[str]:
        """The header's lines for ``llm_server_checks``: the model loads now, and is audited."""
        from pytest_llmdeterminism.errors import LLMDeterminismError

        if not self.options.server_checks or not entry_of(self.options.model or "").served:
            return []
        loaded = self.models.load_now()
        if isinstance(loaded, LLMDeterminismError):
            return [f"llm server checks: not run: {str(loaded).splitlines()[0][:300]} (the first test that "
                    "needs the model shows the whole error)"]
        return [f"llm server checks (llm_server_checks = true): {line}" if n == 0 else line
                for n, line in enumerate(self.serving)]

    def settings(self, item: pytest.Item) -> ItemSettings:
        __tracebackhide__ = True
        return settings.of(item, self.options)

    def seed_again(self, item: pytest.Item) -> None:
        """Seed a deterministic test's generators once more, just before its function runs: another
        plugin's ``pytest_runtest_call`` (pytest-randomly's reseeding) runs after this plugin's seeding."""
        if item.get_closest_marker(MARKER):
            from pytest_llmdeterminism.compute.determinism import seed_all

            seed_all(self.settings(item).generation.seed)

    @staticmethod
    def outcomes(item: pytest.Item) -> TestOutcomes:
        return item.stash.setdefault(_OUTCOMES, TestOutcomes())

    @staticmethod
    def outcomes_if_any(item: pytest.Item) -> TestOutcomes | None:
        return item.stash.get(_OUTCOMES, None)

    def llm_model(self, item: pytest.Item) -> LLMModel:
        """The ``llm_model`` fixture's object for ``item``: the loaded model under its settings."""
        __tracebackhide__ = True
        from pytest_llmdeterminism.model.audit import after_generate_hook
        from pytest_llmdeterminism.model.llm_model import LLMModel

        resolved = self.settings(item)
        outcomes = self.outcomes(item)
        audit = self.options.audit
        hook = after_generate_hook(audit, self.options.audit_dtype, outcomes.audited) \
            if audit is not None and resolved.deterministic else None
        return LLMModel(self.models.get(item.nodeid), resolved.generation, after_generate=hook,
                        note=outcomes.note,
                        progress=lambda what: self.progress.generating(item.nodeid, what))

    def load_before_tests(self, items: Sequence[pytest.Item]) -> None:
        """Load the model now, before the first test's progress line, where a test will need it (a
        load error waits for that test, as :meth:`ModelCache.load_now` keeps it)."""
        if any(name in getattr(item, "fixturenames", ()) for item in items for name in _NEEDS_MODEL):
            self.models.load_now()

    def test_done(self, nodeid: str, seconds: float, payload: dict[str, Any]) -> None:
        """A test's golden checks arrived (from this process or a worker): its progress line if slow."""
        self.progress.test_done(nodeid, seconds, TestRecords.from_payload(payload).timings)

    def golden_tokens(self, item: pytest.Item) -> GoldenTokens:
        """The ``golden_tokens`` fixture's object for ``item``."""
        __tracebackhide__ = True
        from pytest_llmdeterminism.run.golden_tokens import GoldenTokens

        resolved = self.settings(item)
        return GoldenTokens(self.files, self.outcomes(item), self.options, nodeid=item.nodeid,
                            test_path=item.path, models=self.models,
                            rerun=resolved.rerun, tolerance=resolved.tolerance)

    def finish(self, session: pytest.Session, exitstatus: int) -> bool:
        """Write everything the run decided; False when something could not be written."""
        for reason in stop_reasons(session, exitstatus):
            self.ledger.stopped(reason)
        self.output = writer.finish(self.ledger, self.files, self.options, failed=session.testsfailed > 0)
        return not self.output.errors

    def header_lines(self, *, quiet: bool = False) -> list[str]:
        """What the run is pinned to, before anything loads (``pytest_report_header``); ``quiet``
        (``-q``, where pytest prints no header): the one ``llm:`` line, and the planted defect."""
        options = self.options
        if options.model is None:
            return []
        defect = [f"llm: PLANTED DEFECT on (--llm-plant-defect): the model's weights get relative noise "
                  f"{DEFECT_SCALE} in memory; every golden check must fail, and no golden, candidate or "
                  "prune is written"] if options.plant_defect else []
        tolerance = (options.tolerance.describe() if options.tolerance.by_device else
                     "exact (near_tie across environments)")
        engine = engine_of(options.model)
        takes = entry_of(options.model).takes_dtype_and_device
        where = [f"dtype={options.dtype} device={options.device}"] if takes else []
        pinned = " ".join([*([f"engine={engine}"] if engine else []), *where])
        first = (f"llm: model={options.model} shape={options.batch_shape} {pinned} seed={options.seed} "
                 f"max_new_tokens={options.max_new_tokens} tolerance={tolerance}"
                 + (f" {self.thread_choice().describe()}" if engine is None else ""))
        if quiet:
            return [first, *defect]
        return [
            first,
            *defect,
            f"llm {numerics.describe(options.cpu_numerics)}; {self._kernels()}{self._rows_cost()}"
            if engine is None else
            (f"llm engine {engine}: its own pinned settings are recorded in each golden's fingerprint; the "
             "shape's L still bounds prompts"),
            *self.serving_lines(),
        ]

    def _rows_cost(self) -> str:
        """What B > 1 costs: a call of fewer prompts still runs B rows (filler rows cost as much)."""
        rows = self.options.batch_shape.rows
        if rows == 1:
            return ""
        return (f". B = {rows}: a call of fewer than {rows} prompts still runs {rows} rows (filler rows cost "
                "as much as real ones), so B > 1 speeds up only calls that pass several prompts as a list")

    def _kernels(self) -> str:
        """Which kernels the model will run, as far as the settings tell before it loads (the load line
        says which run: ``Kernels.describe``), and whether goldens depend on the batch shape."""
        options = self.options
        why_not = why_not_batch_invariant(profiles.profile(options.cpu_numerics), options.dtype,
                                          "cpu" if options.device == "auto" else options.device)
        if options.batch_invariant is False or why_not:
            kept = ("llm_batch_invariant = false" if options.batch_invariant is False
                    else f"batch-invariant kernels do not run here: {why_not}")
            return (f"the previous kernels ({kept}): batch invariance is verified at the first generation "
                    "of each shape, and the batch shape is part of every golden")
        same_bits = ("a prompt gives the same bits alone or in any batch (verified at the first generation, "
                     "against another shape)")
        if options.batch_invariant:
            return (f"batch-invariant kernels (llm_batch_invariant = true): {same_bits}; goldens do not "
                    "depend on the batch shape")
        where = "loads on the CPU and " if options.device == "auto" else ""
        return (f"batch-invariant kernels by default, where the model {where}its layers can run them (the "
                f"load line says which run): {same_bits.replace('a prompt', 'a prompt then')}, and goldens "
                "do not depend on the batch shape")

    def thread_choice(self) -> threads.ThreadChoice:
        """The thread count the tests run on: this process's, or as the xdist controller (which runs
        no test), each worker's."""
        if self.options.xdist_workers is None:
            return self.environment.threads
        return threads.choose(configured=self.options.threads, environ=os.environ,
                              workers=self.options.xdist_workers, cores=threads.usable_cores())

    def summary_lines(self) -> list[str]:
        lines = writer.summary_lines(self.ledger, self.output, self.files, prune=bool(self.options.prune),
                                     candidates=None if self.options.plant_defect else self.options.artifacts)
        if self.options.plant_defect:
            lines += terminal.planted_defect_summary(self.ledger.checks, ignored=[
                flag for flag, given in (("--llm-golden-artifacts", self.options.artifacts is not None),
                                         ("--llm-golden-prune", bool(self.options.prune)),
                                         ("--llm-repro", self.options.repro is not None)) if given])
        return lines


def stop_reasons(session: pytest.Session, exitstatus: int) -> list[str]:
    """Why pytest ended this run before its last test: Ctrl-C or ``pytest.exit``, an internal
    error, ``-x``/``--maxfail`` or a plugin that set ``session.shouldstop``/``shouldfail``."""
    ended = {pytest.ExitCode.INTERRUPTED: "interrupted", pytest.ExitCode.INTERNAL_ERROR: "an internal error"}
    reasons = [ended[pytest.ExitCode(exitstatus)]] if exitstatus in ended else []
    option = session.config.option
    # These set tests up (and tear them down) without calling them: every test "passes", none ran.
    mode = next((flag for flag, on in (("--setup-plan", getattr(option, "setupplan", False)),
                                       ("--setup-only", getattr(option, "setuponly", False))) if on), None)
    reasons += [f"{mode}: no test function ran"] if mode else []
    return reasons + [str(flag) for flag in (session.shouldfail, session.shouldstop) if flag]
