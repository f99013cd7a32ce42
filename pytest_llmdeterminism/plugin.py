"""pytest hooks and fixtures. Each one routes to the session object; the decisions live elsewhere."""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_llmdeterminism.compute import determinism, threads
from pytest_llmdeterminism.compute.environment import PinnedEnvironment, configures_plugin
from pytest_llmdeterminism.errors import ConfigurationError, LLMDeterminismError
from pytest_llmdeterminism.reporting.progress import LinesBetween
from pytest_llmdeterminism.reporting.terminal import one_line_crash
from pytest_llmdeterminism.run import configuration, options, suites
from pytest_llmdeterminism.run.session import LLMSession
from pytest_llmdeterminism.shape import MARKER

if TYPE_CHECKING:
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.run.golden_tokens import GoldenTokens

SESSION = pytest.StashKey[LLMSession]()
REPORT_ATTRIBUTE = "llm_golden"  # test reports carry each test's golden outcomes
_ENVIRONMENT = pytest.StashKey[PinnedEnvironment]()
_AUTO_WORKERS = pytest.StashKey[str]()  # what -n auto started, for the header
_LINES = pytest.StashKey[LinesBetween]()  # the plugin's lines among pytest's progress output
_MARKER_HELP = (
    f"{MARKER}(seed=None, max_new_tokens=None, batch_shape=None, tolerance=None, concurrency=None): run the "
    "test with fixed seeds, deterministic torch kernels and greedy fixed-shape generation; every global is "
    "restored afterwards. concurrency=N (server engines): each request is sent again among N concurrent "
    "ones and must be answered the same."
)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.register(parser)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser,
                                  args: list[str]) -> Generator[None, None, None]:
    # Installed is not used: only a project that configures the plugin gets its variables set
    # here, before any conftest can import torch or start CUDA (see environment.py).
    try:
        environment = PinnedEnvironment(configuration.early_cpu_numerics(early_config),
                                        threads.for_this_process(configuration.early_threads(early_config)))
    except ConfigurationError as error:
        raise pytest.UsageError(str(error)) from None
    early_config.stash[_ENVIRONMENT] = environment
    if configures_plugin(configuration.ini_values(early_config), args):
        warning = environment.pin(early=True)
        if warning:
            early_config.issue_config_time_warning(pytest.PytestConfigWarning(warning), stacklevel=2)
    yield
    try:  # now conftests have declared their own options and ini keys: only what nobody knows is a typo
        configuration.check_names(early_config, parser, args)
    except ConfigurationError as error:
        raise pytest.UsageError(str(error)) from None


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    found = configuration.auto_workers(config)
    if found is None:
        return None  # xdist's own count
    config.stash[_AUTO_WORKERS] = found[1]
    return found[0]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", _MARKER_HELP)
    try:
        session = LLMSession(configuration.read(config), announce=_terminal_line(config),
                             environment=config.stash.get(_ENVIRONMENT, None),
                             quiet=config.get_verbosity() < 0)
    except ConfigurationError as error:
        raise pytest.UsageError(str(error)) from None
    config.stash[SESSION] = session
    if not hasattr(config, "workerinput"):  # the process that writes: plain pytest or the xdist controller
        config.stash[_LINES] = LinesBetween(config)
        config.pluginmanager.register(config.stash[_LINES], "llmdeterminism-lines")
        config.pluginmanager.register(_OutcomeCollector(session), "llmdeterminism-collector")
        if config.pluginmanager.hasplugin("xdist"):
            config.pluginmanager.register(_WorkerReports(session), "llmdeterminism-xdist")
    warning = determinism.cuda_started_without_workspace_config() if session.environment.pinned else None
    if warning:
        config.issue_config_time_warning(pytest.PytestConfigWarning(warning), stacklevel=2)


def _terminal_line(config: pytest.Config) -> Any:
    """Writes a line to the terminal, past output capture, on its own line between pytest's progress
    output (nothing on an xdist worker)."""

    def write(line: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None or hasattr(config, "workerinput"):
            return
        capture = config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            config.stash[_LINES].write([line])

    return write


def pytest_unconfigure(config: pytest.Config) -> None:
    environment = config.stash.get(_ENVIRONMENT, None)
    if environment is not None:
        environment.restore()


def pytest_report_header(config: pytest.Config) -> list[str]:
    auto = config.stash.get(_AUTO_WORKERS, None)
    return config.stash[SESSION].header_lines() + ([auto] if auto else [])


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # Under -q pytest prints no header at all: the run's one llm: line still says what is in force.
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    quiet = reporter is not None and reporter.verbosity == -1 and not reporter.no_header  # -qq: nothing
    if reporter is not None and quiet and not hasattr(session.config, "workerinput"):
        for line in session.config.stash[SESSION].header_lines(quiet=True):
            reporter.write_line(line)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    # The model loads before the first test's progress line starts, where a test needs it.
    if not (session.config.option.collectonly or session.testsfailed):
        session.config.stash[SESSION].load_before_tests(session.items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    __tracebackhide__ = True
    return (yield from _checks_judged(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    __tracebackhide__ = True
    llm = item.config.stash[SESSION]
    seeded = determinism.deterministic_state(llm.settings(item).generation.seed) \
        if item.get_closest_marker(MARKER) else contextlib.nullcontext()
    with seeded:
        return (yield from _checks_judged(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, Any, Any]:
    __tracebackhide__ = True
    return (yield from _checks_judged(item, "teardown"))


def _checks_judged(item: pytest.Item, when: str) -> Generator[None, Any, Any]:
    """One phase of a test (its fixtures' setup, its body, its fixtures' teardown and finalizers):
    a failing golden check lets the phase go on, so every check is judged; the failures are raised
    together when the phase ends (in setup or teardown, pytest reports an error there)."""
    __tracebackhide__ = True
    outcomes = LLMSession.outcomes(item)
    outcomes.phase = when
    try:
        result = yield
    except pytest.skip.Exception:
        outcomes.raise_failures()  # a skip after a failing check must not hide it
        raise
    except BaseException:
        waiting = outcomes.clear_failures()
        if waiting:
            item.add_report_section(when, "llm golden checks that failed too", waiting)
        raise
    finally:
        outcomes.phase = None
    outcomes.raise_failures()
    return result


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> None:
    # Plugins reseed in their own pytest_runtest_call (pytest-randomly does), inside ours: seed again, last.
    pyfuncitem.config.stash[SESSION].seed_again(pyfuncitem)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if call.excinfo is not None and isinstance(call.excinfo.value, LLMDeterminismError):
        one_line_crash(report.longrepr)  # the short summary says what; FAILURES keeps the whole message
    outcomes = LLMSession.outcomes_if_any(item)
    if outcomes is not None and call.when == "teardown":
        # The test's last report carries every phase's checks (setup, call, teardown, finalizers).
        payload = outcomes.to_json()
        if payload is not None:
            setattr(report, REPORT_ATTRIBUTE, payload)
        # One JUnit XML <property name="llm_verdict"> per golden check, for CI dashboards (JUnit XML
        # reads them from the teardown report).
        report.user_properties += [("llm_verdict", str(outcome)) for outcome in outcomes.data.outcomes]
        outcomes.end_attempt()  # pytest-rerunfailures may run the test again: a new attempt starts clean
    return report


class _OutcomeCollector:
    """Collects golden outcomes from test reports: this process's, or every xdist worker's."""

    def __init__(self, session: LLMSession) -> None:
        self._session = session

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._session.ledger.collected.update(item.nodeid for item in session.items)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:  # this process's, or (as the xdist controller) a worker's
            self._session.ledger.collection_failed(report.nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._session.ledger.test_finished(report.nodeid, report.when, report.outcome, report.duration)
        payload = getattr(report, REPORT_ATTRIBUTE, None)
        if payload is not None and not self._session.ledger.retried(report.nodeid):  # a retried attempt:
            self._session.ledger.collect(payload, report.nodeid)  # its records are not the test's
            body = self._session.ledger.durations.get(report.nodeid, report.duration)
            self._session.test_done(report.nodeid, body, payload)

    @pytest.hookimpl(trylast=True)  # after pytest's line for the test, percentage included
    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self._session.progress.test_finished(nodeid)


class _WorkerReports:
    """xdist controller only: what each worker saw of the run beyond its test reports."""

    def __init__(self, session: LLMSession) -> None:
        self._session = session

    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self._session.ledger.collected.update(ids)

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        if error is not None:
            self._session.ledger.stopped(f"xdist worker {node.gateway.id} crashed")
        output = getattr(node, "workeroutput", {})
        self._session.ledger.partial(output.get(_PARTIAL, []))
        self._session.ledger.deselected.update(output.get(_DESELECTED, []))


def pytest_itemcollected(item: pytest.Item) -> None:
    # pytest's own record of what exists, before any plugin or conftest filters the items
    item.config.stash[SESSION].ledger.seen.add(item.nodeid)


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config.stash[SESSION].ledger.collection_finished(item.nodeid for item in session.items)


_PARTIAL = "llm_partial_reasons"
_DESELECTED = "llm_deselected"  # every worker collects the whole suite and deselects the same tests


def pytest_deselected(items: list[pytest.Item]) -> None:
    # Whoever deselects (-k, -m, --lf, a conftest or another plugin), those goldens were not visited.
    if items:
        items[0].config.stash[SESSION].ledger.deselect(item.nodeid for item in items)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    lines = session.config.stash.get(_LINES, None)
    if lines is not None:
        lines.close()
    llm = session.config.stash[SESSION]
    if hasattr(session.config, "workerinput"):
        # an xdist worker: its outcomes went to the controller with each test report
        session.config.workeroutput[_PARTIAL] = llm.ledger.partial_reasons  # type: ignore[attr-defined]
        session.config.workeroutput[_DESELECTED] = sorted(llm.ledger.deselected)  # type: ignore[attr-defined]
        return
    if not llm.finish(session, exitstatus):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    lines = config.stash[SESSION].summary_lines()
    if lines:
        terminalreporter.write_sep("-", "llm goldens")
        for line in lines:
            terminalreporter.write_line(line)


def pytest_assertrepr_compare(op: str, left: object, right: object) -> list[str] | None:
    from pytest_llmdeterminism.goldens import kinds

    if op == "==" and kinds.is_record(left) and type(left) is type(right):
        from pytest_llmdeterminism.reporting.failure import assertrepr

        return assertrepr(left, right)
    return None


def pytest_collect_file(file_path: Any, parent: pytest.Collector) -> pytest.Collector | None:
    return suites.PromptSuite.from_parent(parent, path=file_path) if suites.is_suite(file_path) else None


@pytest.fixture
def llm_model(request: pytest.FixtureRequest) -> LLMModel:
    """The configured model: greedy, fixed-shape ``generate()`` with per-step capture."""
    __tracebackhide__ = True
    return request.config.stash[SESSION].llm_model(request.node)


@pytest.fixture
def golden_tokens(request: pytest.FixtureRequest) -> GoldenTokens:
    """``golden_tokens.check(generation, name=None)``: compare with (or record) the stored golden."""
    __tracebackhide__ = True
    return request.config.stash[SESSION].golden_tokens(request.node)
