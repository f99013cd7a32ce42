"""Under pytest-xdist each worker computes on its share of the cores, and says so in the header."""

from __future__ import annotations

import os

import pytest

from pytest_llmdeterminism.compute.threads import share, usable_cores

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
