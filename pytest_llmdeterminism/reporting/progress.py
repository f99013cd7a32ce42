"""Lines the plugin prints while tests run: the model's load, and progress on slow work (a generation
that takes a while: what it generates and how long it took; a slow test: its checks and time).

Each is written on a line of its own between pytest's progress output, which then goes on as if
unbroken (:class:`LinesBetween`). Progress lines appear only once work is slow
(:data:`PROGRESS_AFTER_S`), so a quick run prints none, and never under ``-q``."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any

import pytest

PROGRESS_AFTER_S = 5.0  # a generation or a test at least this slow gets a progress line


class LinesBetween:
    """Writes lines on lines of their own between pytest's progress output (pytest's
    ``TerminalReporter``), which then goes on as if unbroken: a line of a file's results that ours
    interrupt first gets its percentage; our last line stays open until pytest writes again, when
    this object's hooks end it and write again what pytest's line began with (a file's name), so
    pytest never appends a result to our line nor leaves a blank one. (A test that prints before its
    file's first result leaves that file's name alone on the line above ours, as ``-s`` output does:
    pytest wrote it when the test started.) pytest has no public API for the width of the current
    line or the percentage: both are read through its private names where they exist."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config
        self._open = False  # our last line has not ended
        self._resume: Path | None = None  # the file whose results pytest's line held

    @property
    def _reporter(self) -> Any:
        return self._config.pluginmanager.get_plugin("terminalreporter")

    def _width(self) -> int:
        return int(getattr(self._reporter, "_width_of_current_line", 0) or 0)

    def write(self, lines: Sequence[str]) -> None:
        reporter = self._reporter
        if reporter is None:
            return
        resume = reporter.currentfspath
        if self._open:
            reporter.write("\n")
        elif self._width():
            fill = getattr(reporter, "_write_progress_information_filling_space", None)
            if isinstance(resume, Path) and self._width() > len(self._prefix(resume)) and fill is not None \
                    and getattr(reporter, "_show_progress_info", False):
                fill()  # the results so far end with their percentage, as at a change of file
            reporter.write("\n")
            self._resume = resume if isinstance(resume, Path) else None
        reporter.write("\n".join(lines), flush=True)
        self._open = True
        # Under -v pytest ends any line that is not its test's line itself: -2 says so.
        reporter.currentfspath = -2 if self._verbose else self._resume

    @property
    def _verbose(self) -> bool:
        """pytest writes a line per test (-v), which it ends itself."""
        return bool(getattr(self._reporter, "showlongtestinfo", False))

    def _prefix(self, path: Path) -> str:
        return os.path.relpath(path, self._reporter.startpath) + " "

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self, nodeid: str) -> None:
        """A test starts: a test of another file than our line interrupted starts pytest's next line
        itself (its file's name)."""
        path = self._config.rootpath / nodeid.split("::")[0]
        if not self._open:
            return
        if not self._verbose:
            if not getattr(self._reporter, "showfspath", False):
                return  # pytest writes nothing when a test starts (pytest-xdist's controller)
            if isinstance(self._resume, Path) and path == self._resume:
                return  # the same file's results go on after ours: pytest writes nothing now
            self._reporter.currentfspath = None  # pytest ends our line and writes the file's name
        self._open, self._resume = False, None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """pytest is about to write a result (a letter after a file's name, or a -v line)."""
        if report.when != "call" and report.passed:
            return  # a passed setup or teardown: pytest writes nothing
        if not self._open or self._verbose:
            self._open = False
            return
        self._reporter.write("\n" + (self._prefix(self._resume) if self._resume is not None else ""))
        self._reporter.currentfspath = self._resume
        self._open = False

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtestloop(self) -> Generator[None, object, object]:
        """After the last test, before pytest writes its final percentage: our last line ends."""
        try:
            return (yield)
        finally:
            self.close()

    def close(self) -> None:
        """End our last line, if pytest has not: before the run's summary."""
        if self._open and self._reporter is not None:
            self._reporter.write("\n")
            self._reporter.currentfspath = None
        self._open = False


class Progress:
    """Progress lines for one process: a generation is announced before it starts once an earlier one
    was slow (the run is one where generating takes a while), and its time said after it when it was
    slow; a slow test's time and checks at its end. ``write``: prints one line (None: prints nothing,
    as on an xdist worker); ``quiet``: under ``-q``, nothing."""

    def __init__(self, write: Callable[[str], None] | None, *, quiet: bool = False) -> None:
        self._write = None if quiet else write
        self._slow = False  # the last generation took PROGRESS_AFTER_S or more
        self._done: dict[str, tuple[float, Sequence[tuple[str, float]]]] = {}  # slow tests, until reported

    def generating(self, nodeid: str, what: str) -> Callable[[], None]:
        """Call before a generation (``what``: prompts, shape, budget); returns what to call after it."""
        if self._write is None:
            return lambda: None
        write = self._write
        if self._slow:
            write(f"llm: {nodeid}: generating {what} ...")
        started = time.monotonic()

        def done() -> None:
            took = time.monotonic() - started
            self._slow = took >= PROGRESS_AFTER_S
            if self._slow:
                write(f"llm: {nodeid}: generated {what} in {took:.1f} s")

        return done

    def test_done(self, nodeid: str, seconds: float, checks: Sequence[tuple[str, float]]) -> None:
        """A test whose call took ``seconds``, with its golden checks (key, seconds before it was judged):
        its line waits for :meth:`test_finished`, after pytest's own line for it."""
        if self._write is not None and seconds >= PROGRESS_AFTER_S and checks:
            self._done[nodeid] = (seconds, checks)

    def test_finished(self, nodeid: str) -> None:
        """pytest reported all of the test ``nodeid``: its line, if it was slow."""
        if nodeid not in self._done or self._write is None:
            return
        seconds, checks = self._done.pop(nodeid)
        shown = ", ".join(f"{key!r} {took:.1f} s" for key, took in checks[:_CHECKS_SHOWN])
        more = f", … {len(checks) - _CHECKS_SHOWN} more" if len(checks) > _CHECKS_SHOWN else ""
        self._write(f"llm: {nodeid} took {seconds:.1f} s; its golden checks: {shown}{more}")


_CHECKS_SHOWN = 6
