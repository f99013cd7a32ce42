"""Under pytest-xdist each worker computes on its share of the cores, and says so in the header."""

from __future__ import annotations

import os

import pytest

from pytest_llmdeterminism.compute.threads import auto_workers, choose, share, usable_cores, worker_count
from pytest_llmdeterminism.errors import ConfigurationError
from pytest_llmdeterminism.run.options import parse_threads


def test_a_worker_takes_its_share_of_the_cores_at_least_one_thread_and_a_power_of_two():
    assert share(2, 2) == 1
    assert share(8, 3) == 2
    assert share(16, 1) == 16
    assert share(2, 4) == 1
    assert share(1, 0) == 1
    assert share(6, 2) == 2  # not 3: rows of a batch differed at 3 threads
    assert share(12, 1) == 8


@pytest.mark.parametrize(("configured", "environ", "cores", "workers", "line"), [
    (None, {}, 2, 2, "threads=1 (2 cores / 2 workers)"),
    (None, {}, 8, 1, "threads=8 (8 cores / 1 worker)"),
    (None, {}, 6, 2, "threads=2 (6 cores / 2 workers, down to a power of two)"),
    (None, {}, 2, None, "threads=torch default (2 cores)"),
    (None, {"OMP_NUM_THREADS": "2"}, 2, 2, "threads=2 (OMP_NUM_THREADS=2)"),
    (None, {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "3"}, 2, 2, "threads=3 (MKL_NUM_THREADS=3)"),
    (None, {"OMP_NUM_THREADS": "many"}, 2, 2, "threads=torch default (OMP_NUM_THREADS=many)"),
    (3, {"OMP_NUM_THREADS": "2"}, 2, 2, "threads=3 (llm_threads)"),
], ids=["worker-share", "one-worker", "power-of-two", "serial", "user-omp-wins", "mkl-first",
        "user-omp-unreadable", "llm-threads-wins"])
def test_the_choice_puts_the_users_setting_first_then_the_workers_share(configured, environ, cores, workers,
                                                                        line):
    choice = choose(configured=configured, environ=environ, workers=workers, cores=cores)
    assert choice.describe() == line
    assert choice.set_by_plugin == (configured is not None or (not environ and workers is not None))


def test_worker_count_and_usable_cores_are_read_from_the_process():
    assert worker_count({"PYTEST_XDIST_WORKER_COUNT": "4"}) == 4
    assert worker_count({}) is None
    assert worker_count({"PYTEST_XDIST_WORKER_COUNT": "x"}) is None
    affinity = getattr(os, "sched_getaffinity", None)
    assert usable_cores() == (len(affinity(0)) if affinity else os.cpu_count())


def test_llm_threads_is_auto_or_a_count():
    assert parse_threads(None) is None
    assert parse_threads("auto") is None
    assert parse_threads("2") == 2
    with pytest.raises(ConfigurationError) as error:
        parse_threads("0")
    assert str(error.value).startswith(
        "llm_threads = '0': expected auto or a number of threads >= 1, e.g. '1'")


_RECORD_THREADS = """
    import os
    import torch

    def test_{name}(llm_model, golden_tokens):
        golden_tokens.check(llm_model.generate("The sky is", max_new_tokens=3))
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(f"threads-{{worker}}-{name}.txt", "w") as log:
            log.write(str(torch.get_num_threads()))
"""


def _project(suite, names=("a", "b", "c")):
    for name in names:
        suite.makepyfile(**{f"test_{name}": _RECORD_THREADS.format(name=name)})


def _threads_seen(suite) -> dict[str, int]:
    return {path.stem: int(path.read_text()) for path in suite.path.glob("threads-*.txt")}


@pytest.mark.parametrize(("environ", "args", "expected"), [
    ({}, (), share(usable_cores(), 2)),
    ({"OMP_NUM_THREADS": "3"}, (), None),  # the user's count: torch already runs on what it read
    ({}, ("--llm-threads=4",), 4),
], ids=["worker-share", "user-omp-kept", "llm-threads"])
def test_a_worker_runs_its_model_on_its_share_and_the_count_is_restored_after(suite, monkeypatch, environ,
                                                                              args, expected):
    import torch

    _project(suite, names=("a",))
    before = torch.get_num_threads()
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")  # as xdist sets it in each worker
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    result = suite.runpytest("--llm-golden-update", *args)
    result.assert_outcomes(passed=1)
    assert _threads_seen(suite) == {"threads-main-a": before if expected is None else expected}
    assert torch.get_num_threads() == before
    assert os.environ.get("OMP_NUM_THREADS") == environ.get("OMP_NUM_THREADS")


@pytest.mark.subprocess
def test_goldens_recorded_serially_are_identical_under_xdist_with_each_worker_on_its_share(suite):
    pytest.importorskip("xdist")
    _project(suite)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=3)
    for path in suite.path.glob("threads-*.txt"):
        path.unlink()
    cores = usable_cores()
    result = suite.runpytest_subprocess("-n", "2", "-p", "no:randomly")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([f"llm: model=builtin:tiny * tolerance=* threads={share(cores, 2)} ({cores} "
                                 "cores / 2 workers)", "golden checks: 3 IDENTICAL"])
    seen = _threads_seen(suite)
    assert len(seen) == 3 and all(name.startswith("threads-gw") for name in seen)
    assert set(seen.values()) == {share(cores, 2)}


def test_n_auto_on_a_cpu_starts_a_worker_per_four_cores_and_none_below_two():
    assert [auto_workers(cores) for cores in (1, 2, 4, 7, 8, 12, 16, 64)] == [0, 0, 0, 0, 2, 3, 4, 16]


@pytest.mark.parametrize(("ini", "environ", "cores", "found"), [
    ("llm_model = builtin:tiny", {}, 2, 0),
    ("llm_model = builtin:tiny", {}, 16, 4),
    ("llm_model = builtin:tiny\nllm_device = cpu", {}, 8, 2),
    ("llm_model = builtin:tiny\nllm_device = cuda", {}, 16, None),  # a GPU: xdist's own count
    ("llm_model = openai:http://127.0.0.1:1/v1", {}, 2, None),  # a server does the work
    ("llm_model = builtin:tiny", {"PYTEST_XDIST_AUTO_NUM_WORKERS": "3"}, 2, None),  # xdist's variable
    ("", {}, 2, None),  # a project that does not configure the plugin
    ("llm_cpu_numerics = portable", {}, 2, None),  # configured, but no model from the plugin (this suite)
], ids=["2-cores", "16-cores", "cpu-8-cores", "gpu", "server", "xdist-variable", "other-project",
        "no-model"])
def test_what_n_auto_starts_follows_the_cores_where_the_model_runs_on_the_cpu(pytester, monkeypatch, ini,
                                                                              environ, cores, found):
    from pytest_llmdeterminism.compute import threads
    from pytest_llmdeterminism.run import configuration

    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(threads, "usable_cores", lambda: cores)
    pytester.makeini(f"[pytest]\n{ini}\n")
    decided = configuration.auto_workers(pytester.parseconfig("-n", "auto"))
    assert (decided if decided is None else decided[0]) == found
    if found:
        assert decided[1] == f"llm: -n auto starts {found} workers of 4 threads ({cores} cores)"


def test_n_auto_on_two_cores_runs_the_tests_in_the_pytest_process_and_says_so(suite, monkeypatch):
    """On 2 cores xdist would start two workers, each loading its own model: slower than one
    process (11.2 s against 4.4 s for the example suite). -n auto then is a serial run."""
    pytest.importorskip("xdist")
    from pytest_llmdeterminism.compute import threads

    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    _project(suite)
    result = suite.runpytest("-n", "auto", "--llm-golden-update")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["llm: -n auto runs the tests in this process: 2 cores, and a worker per 4 "
                                 "cores pays from 8 on (each worker loads its own model); choose a count "
                                 "with -n N"])
    assert set(_threads_seen(suite)) == {"threads-main-a", "threads-main-b", "threads-main-c"}  # no worker
