"""Each xdist worker's share of the cores (compute/threads.py): at least one thread and a power of two,
the user's setting first, counts read from the process, ``llm_threads`` as auto or a count, and the
workers ``-n auto`` starts on a CPU."""

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


def test_n_auto_on_a_cpu_starts_a_worker_per_four_cores_and_none_below_two():
    assert [auto_workers(cores) for cores in (1, 2, 4, 7, 8, 12, 16, 64)] == [0, 0, 0, 0, 2, 3, 4, 16]
