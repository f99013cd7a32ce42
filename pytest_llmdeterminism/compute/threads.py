"""How many threads torch computes on: under pytest-xdist, each worker's share of the cores.

A worker takes ``usable cores // workers`` threads, at least one, rounded down to a power of two
(the bits of MKL's reproducible branch hold at 1, 2, 4 and 8 threads, not at 3 or 6), set in the
environment before torch starts and with ``torch.set_num_threads`` whenever the model is handed out.
A choice the user made wins: ``llm_threads``, else ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS``. A
plain run keeps torch's default. In a project that configures the plugin, with the model on the
CPU, ``-n auto`` starts one worker per :data:`AUTO_WORKER_CORES` cores, and none where that makes
fewer than two. Measurements: ``docs/design/kernels.md``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# xdist's worker count, in each worker's environment (set before the worker reads its configuration).
WORKER_COUNT = "PYTEST_XDIST_WORKER_COUNT"
# What torch reads for its default thread count, MKL's first: a user who set one chose the count.
USER_VARIABLES = ("MKL_NUM_THREADS", "OMP_NUM_THREADS")
SETTING = "llm_threads"


@dataclass(frozen=True)
class ThreadChoice:
    """The thread count a process runs torch on, and why."""

    threads: int | None  # None: torch's default, left alone
    why: str
    set_by_plugin: bool = False  # the plugin sets it (not the user's environment, not torch's default)

    def describe(self) -> str:
        """``threads=1 (2 cores / 2 workers)`` for the header."""
        return f"threads={'torch default' if self.threads is None else self.threads} ({self.why})"


def share(cores: int, workers: int) -> int:
    """Each of ``workers`` processes' share of ``cores``: at least one thread, and a power of two."""
    fair = max(1, cores // max(1, workers))
    return 1 << (fair.bit_length() - 1)


def choose(*, configured: int | None, environ: Mapping[str, str], workers: int | None,
           cores: int) -> ThreadChoice:
    """The thread count for a process: ``configured`` (``llm_threads``), else the user's
    ``MKL_NUM_THREADS`` / ``OMP_NUM_THREADS``, else, as one of ``workers`` xdist workers, its share
    of ``cores``, else torch's default. Pure."""
    if configured is not None:
        return ThreadChoice(configured, SETTING, set_by_plugin=True)
    for name in USER_VARIABLES:
        raw = environ.get(name, "").strip()
        if raw:
            return ThreadChoice(int(raw) if raw.isdigit() and int(raw) > 0 else None, f"{name}={raw}")
    if workers is not None:
        threads = share(cores, workers)
        why = f"{cores} cores / {workers} worker{'s' if workers != 1 else ''}"
        if threads != max(1, cores // workers):
            why += ", down to a power of two"
        return ThreadChoice(threads, why, set_by_plugin=True)
    return ThreadChoice(None, f"{cores} cores")


# Under ``-n auto`` on a CPU, one xdist worker per this many cores (see the module's note).
AUTO_WORKER_CORES = 4


def auto_workers(cores: int) -> int:
    """How many workers ``-n auto`` starts for a model on the CPU: one per :data:`AUTO_WORKER_CORES`
    cores, 0 (no worker: the tests run in the pytest process) where that makes fewer than two."""
    workers = cores // AUTO_WORKER_CORES
    return workers if workers >= 2 else 0


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one, e.g. a container's
    ``--cpuset-cpus`` or ``taskset``), else every core the OS counts."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return len(affinity(0)) or 1
    return os.cpu_count() or 1


def worker_count(environ: Mapping[str, str]) -> int | None:
    """How many xdist workers this process is one of, or None outside xdist."""
    raw = environ.get(WORKER_COUNT, "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def for_this_process(configured: int | None) -> ThreadChoice:
    """:func:`choose` for the running process, read from its environment and CPU affinity."""
    return choose(configured=configured, environ=os.environ, workers=worker_count(os.environ),
                  cores=usable_cores())
