"""When the plugin changes the process, and how it puts everything back.

pytest loads every installed plugin on every run, so an installed plugin that nobody uses must
change nothing: no environment variable, no torch import, no flag, no output. But the variables
that pin CPU numerics (``MKL_CBWR``, ``ATEN_CPU_CAPABILITY``) and cuBLAS's workspace
(``CUBLAS_WORKSPACE_CONFIG``) are read once, when torch first computes or CUDA starts, which a
conftest may do at import, long before pytest knows whether any test uses the plugin (that is
known only after collection). So the plugin decides on what it can see before conftests load:

1. **The project configures the plugin** (an ``llm_*`` key in its ini file or in ``-o``, or an
   ``--llm-*`` option on the command line or in ``addopts``): the variables are set in the
   earliest hook, before any conftest can import torch.
2. **Otherwise nothing is set.** A run whose model is configured some other way (a conftest that
   sets ``config.option.llm_model``) sets them at the first model load; the load then checks what
   torch actually runs with, so a torch that already computed under other kernels is refused with
   one error that says to set ``llm_model`` in the ini file, never recorded as portable.

Under pytest-xdist each worker takes its share of the cores (``threads.py``): ``OMP_NUM_THREADS`` is
set with the numerics variables, and torch's thread count when the model is used.

Whatever was set, early or late, and any variable an engine's load set (vLLM's ``HF_HUB_OFFLINE``
and its siblings), is put back at the end of the run (``pytest_unconfigure``), torch's thread count too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

from pytest_llmdeterminism.compute import determinism, numerics
from pytest_llmdeterminism.compute.threads import ThreadChoice


def configures_plugin(ini_keys: Iterable[str], args: Iterable[str]) -> bool:
    """Whether the project or the command line sets any ``llm_*`` ini key or ``--llm-*`` option.

    ``ini_keys``: the ini file's keys; ``args``: the command line with ``addopts`` (``-o KEY=VALUE``
    and ``--override-ini=KEY=VALUE`` count as ini keys).
    """
    if any(str(key).startswith("llm_") for key in ini_keys):
        return True
    arguments = [str(arg) for arg in args]
    for index, arg in enumerate(arguments):
        if arg.startswith("--llm"):
            return True
        override = arg.partition("=")[2] if arg.startswith("--override-ini=") else (
            arg[2:] if arg.startswith("-o") and len(arg) > 2 else None)
        if override is None and arg in ("-o", "--override-ini") and index + 1 < len(arguments):
            override = arguments[index + 1]
        if override is not None and override.strip().startswith("llm_"):
            return True
    return False


class PinnedEnvironment:
    """The environment variables this run set, with the values they replaced, and torch's thread count."""

    def __init__(self, cpu_numerics: str, threads: ThreadChoice | None = None) -> None:
        self.cpu_numerics = cpu_numerics
        self.threads = threads or ThreadChoice(None, "not chosen by the plugin")
        self._torch_threads_before: int | None = None
        self.pinned = False  # numerics and cuBLAS variables set (early or at the first load)
        self.early = False  # set before conftests loaded
        self._replaced: dict[str, str | None] = {}

    def pin(self, *, early: bool) -> str | None:
        """Set the CPU-numerics and cuBLAS variables once; returns a warning text, if any."""
        if self.pinned:
            return None
        self.pinned, self.early = True, early
        with self.recording():
            numerics.pin(self.cpu_numerics)
            if self.threads.set_by_plugin:  # read by torch (and OpenMP) when they start
                os.environ["OMP_NUM_THREADS"] = str(self.threads.threads)
            return determinism.ensure_cublas_workspace_config()

    def share_threads(self) -> None:
        """Set torch's thread count to the plugin's choice, if it made one. Called whenever the model
        is handed out: torch may have started before the variable was set, and a test's deterministic
        block puts back the count it found."""
        torch = sys.modules.get("torch")
        wanted = self.threads.threads
        if torch is None or not self.threads.set_by_plugin or wanted is None:
            return
        current = torch.get_num_threads()
        if current != wanted:
            if self._torch_threads_before is None:
                self._torch_threads_before = current
            torch.set_num_threads(wanted)

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Remember every variable the block sets, changes or removes, to restore it at the end."""
        before = dict(os.environ)
        try:
            yield
        finally:
            for name in set(before) | set(os.environ):
                if before.get(name) != os.environ.get(name):
                    self._replaced.setdefault(name, before.get(name))

    @property
    def replaced(self) -> Mapping[str, str | None]:
        return dict(self._replaced)

    def restore(self) -> None:
        numerics.unpin(self._replaced)
        self._replaced.clear()
        torch = sys.modules.get("torch")
        if torch is not None and self._torch_threads_before is not None:
            torch.set_num_threads(self._torch_threads_before)
        self._torch_threads_before = None
