"""CPU numerics: which kernels torch's CPU math takes, pinned so that goldens travel between machines.

Measured with torch 2.13 (MKL 2024.2) on the tiny model and SmolLM2-135M, fp32 and bf16, 4x32:

- ATen dispatches its vectorised kernels by the CPU's SIMD level (AVX512, AVX2, none), and
  MKL picks its GEMM code path by CPU *and vendor*: the same binaries gave different logit hashes
  on a native AMD EPYC, an emulated Intel Haswell and an emulated Intel Nehalem, and multithreaded
  SDPA decode made rows of one batch differ from each other.
- ``ATEN_CPU_CAPABILITY=default`` plus ``MKL_CBWR=COMPATIBLE`` gives one hash on all of them, at
  1, 2 and 4 threads, and restores row invariance. Neither variable alone does. (Large GEMMs still
  differ at 3 or 6 threads: the thread count stays part of a golden's numerics.)
  ``MKL_CBWR=AVX2`` is ignored by MKL on AMD (it falls back to AUTO), so it is not portable:
  re-measured on an Intel host (``benchmarks/mkl_branches.py``), AVX2 agreed with an emulated
  Haswell and differed on an emulated EPYC for every ``linear`` shape; no cheaper pin kept the bits.
  oneDNN's ISA cap (``ONEDNN_MAX_CPU_ISA``) changed no hash, fp32 or bf16, so it is not pinned.

Both variables are read lazily, at torch's first CPU kernel and MKL's first call, so the plugin
sets them in its earliest hook when the project configures it, otherwise at the first model load
(``environment.py``), and then *checks* what is in force when the model loads: a run that torch
started too early is refused, never recorded as portable.

On arm64 (Linux, torch 2.9.1's CPU wheel, measured under qemu-aarch64) torch has no MKL: its GEMMs
go to OpenBLAS, which picks kernels by core type (read from MIDR_EL1 at load: ``x @ w``, 16x1024 by
1024x2048, differs between ``OPENBLAS_CORETYPE=ARMV8`` and ``NEOVERSEN1``), or to oneDNN, which torch
takes for ``matmul``/``bmm`` only on CPUs with BF16 (so the same ``bmm`` gave other bits on an
emulated A64FX than on a Neoverse-class CPU) and for ``linear`` with SVE-512 or NEON kernels by CPU.
``OPENBLAS_CORETYPE=ARMV8`` (read when OpenBLAS loads, checked after) plus
``TORCH_MKLDNN_MATMUL_MIN_DIM`` above any dimension (read at torch's first matmul: every fp32 GEMM
then goes to OpenBLAS) gave one hash for ``linear``, ``matmul`` and ``bmm`` on all emulated CPUs
and at 1, 2 and 4 threads; ``ATEN_CPU_CAPABILITY=default`` keeps ATen off its SVE256 kernels.
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
import sys
from collections.abc import Mapping
from typing import Any

from pytest_llmdeterminism.errors import ConfigurationError, LLMDeterminismError, pasteable

PORTABLE = "portable"
NATIVE = "native"
MODES = (PORTABLE, NATIVE)
DEFAULT_MODE = PORTABLE
# MKL's branch that portable numerics pin on x86-64: the same bits on every CPU, at a thread count.
MKL_REPRODUCIBLE_BRANCH = "COMPATIBLE"
# What portable numerics set before torch starts, and must then find in force, per machine.
_PORTABLE_BY_MACHINE: Mapping[str, tuple[Mapping[str, str], Mapping[str, str]]] = {
    "x86_64": ({"MKL_CBWR": MKL_REPRODUCIBLE_BRANCH, "ATEN_CPU_CAPABILITY": "default"},
               {"aten_capability": "DEFAULT", "mkl_cbwr": MKL_REPRODUCIBLE_BRANCH}),
    "aarch64": ({"ATEN_CPU_CAPABILITY": "default", "OPENBLAS_CORETYPE": "ARMV8",
                 "TORCH_MKLDNN_MATMUL_MIN_DIM": "1000000000"},
                {"aten_capability": "DEFAULT", "blas_coretype": "ARMV8"}),
}
PORTABLE_ENVIRONMENT, _PORTABLE_EFFECTIVE = _PORTABLE_BY_MACHINE.get(platform.machine(),
                                                                      _PORTABLE_BY_MACHINE["x86_64"])

# MKL's branch codes (mkl_cbwr.h); the STRICT flag is bit 16.
_MKL_BRANCHES = {0: "UNSET", 1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1",
                 8: "SSE4_2", 9: "AVX", 10: "AVX2", 11: "AVX512_MIC", 12: "AVX512", 13: "AVX512_MIC_E1",
                 14: "AVX512_E1"}
_MKL_STRICT = 0x10000


class CPUNumericsError(LLMDeterminismError):
    """The CPU numerics in force are not the ones the run asked for."""

    def __init__(self, mode: str, effective: Mapping[str, Any], wrong: Mapping[str, Any], *,
                 pinned_late: bool = False) -> None:
        self.mode = mode
        self.effective = dict(effective)
        self.pinned_late = pinned_late
        found = ", ".join(f"{name} is {value!r} (portable needs {_PORTABLE_EFFECTIVE[name]!r})"
                          for name, value in wrong.items())
        environment = " ".join(f"{k}={v}" for k, v in PORTABLE_ENVIRONMENT.items())
        if pinned_late:
            why = ("torch ran CPU kernels before the first model load, where pytest-llmdeterminism pinned "
                   "them: this project does not configure the plugin in its ini file or command line, so "
                   "nothing was pinned before conftests ran, and this run would record machine-specific "
                   "goldens as portable. Set llm_model in the ini file (pytest.ini: llm_model = "
                   "builtin:tiny; pyproject.toml: llm_model = \"builtin:tiny\", with your model) so the "
                   "plugin pins them before conftests load, or start pytest with the variables set: "
                   f"`{environment} python -m pytest ...`, or choose "
                   f"{pasteable('llm_cpu_numerics', NATIVE)} to accept machine-specific numerics.")
        else:
            why = ("torch ran CPU kernels before pytest-llmdeterminism could pin them (a plugin, conftest "
                   "or script imported and used torch first), so this run would record machine-specific "
                   "goldens as portable. Start pytest with the variables set: "
                   f"`{environment} python -m pytest ...`, or choose "
                   f"{pasteable('llm_cpu_numerics', NATIVE)} to accept machine-specific numerics.")
        super().__init__(f"llm_cpu_numerics = {mode!r} is not in force: {found}. {why}")


def parse_mode(raw: str | None, *, setting: str = "llm_cpu_numerics") -> str:
    mode = (raw or DEFAULT_MODE).strip()
    if mode not in MODES:
        raise ConfigurationError(setting, raw, f"expected {PORTABLE!r} (the default: the same bits on any "
                                 f"x86-64 CPU, or any arm64 CPU, at a thread count) or {NATIVE!r} (the CPU's "
                                 "fastest kernels)")
    return mode


def pin(mode: str) -> dict[str, str | None]:
    """Set the environment for ``mode`` before torch starts; returns the values it replaced."""
    if mode != PORTABLE:
        return {}
    replaced = {name: os.environ.get(name) for name in PORTABLE_ENVIRONMENT}
    os.environ.update(PORTABLE_ENVIRONMENT)
    return replaced


def unpin(replaced: Mapping[str, str | None]) -> None:
    for name, value in replaced.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def effective() -> dict[str, Any]:
    """What CPU numerics torch runs with now (imports torch)."""
    import torch

    blas = _blas(torch)
    return {"aten_capability": str(torch.backends.cpu.get_cpu_capability()), "mkl_cbwr": _mkl_branch(torch),
            "blas": blas, "blas_coretype": _openblas_coretype() if blas == "openblas" else None}


def check(mode: str, *, pinned_late: bool = False) -> dict[str, Any]:
    """The effective numerics, or :class:`CPUNumericsError` when ``portable`` is not in force
    (``pinned_late``: the plugin set the variables at the first load, not before conftests)."""
    __tracebackhide__ = True
    found = effective()
    if mode == PORTABLE:
        wrong = {name: found[name] for name, wanted in _PORTABLE_EFFECTIVE.items()
                 if found[name] is not None and found[name] != wanted}
        if wrong:
            raise CPUNumericsError(mode, found, wrong, pinned_late=pinned_late)
    return found


def describe(mode: str) -> str:
    """One line for the pytest header."""
    if mode == PORTABLE:
        pinned = ", ".join(f"{k}={v}" for k, v in PORTABLE_ENVIRONMENT.items())
        return f"cpu numerics: portable ({pinned}; {platform.machine()})"
    return f"cpu numerics: native (machine-specific kernels; {platform.machine()})"


def _mkl_branch(torch: Any) -> str | None:
    """MKL's conditional-numerical-reproducibility branch in force, or None without MKL."""
    if not torch.backends.mkl.is_available():
        return None
    # torch links MKL statically; its service layer exports the getter under this name.
    library = os.path.join(os.path.dirname(torch.__file__), "lib",
                           "libtorch_cpu.dylib" if sys.platform == "darwin" else "libtorch_cpu.so")
    try:
        getter = ctypes.CDLL(library).mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    getter.restype, getter.argtypes = ctypes.c_int, [ctypes.c_int]
    code = int(getter(1))  # MKL_CBWR_BRANCH
    name = _MKL_BRANCHES.get(code & ~_MKL_STRICT, str(code & ~_MKL_STRICT))
    return f"{name},STRICT" if code & _MKL_STRICT else name


def _blas(torch: Any) -> str | None:
    """The BLAS torch was built with (``BLAS_INFO``): ``mkl``, ``openblas``, ``accelerate``, ..."""
    found = re.search(r"\bBLAS_INFO=([^,\s]+)", torch.__config__.show())
    return None if found is None else {"open": "openblas"}.get(found[1], found[1])


def _openblas_coretype() -> str | None:
    """The core type OpenBLAS chose at load (``ARMV8``, ``NEOVERSEN1``, ``HASWELL``), or None where it
    cannot be asked (no ``/proc/self/maps``, or a build without ``openblas_get_corename``)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            mapped = (line.split()[-1] for line in maps)
            paths = {path for path in mapped if os.path.basename(path).startswith("libopenblas")}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            getter = ctypes.CDLL(path).openblas_get_corename
        except (OSError, AttributeError):
            continue
        getter.restype, getter.argtypes = ctypes.c_char_p, []
        name = getter()
        return name.decode().upper() if name else None
    return None


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
