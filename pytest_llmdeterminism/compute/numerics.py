"""CPU numerics: which kernels torch's CPU math takes, pinned so that goldens travel between machines.

Measured with torch 2.13 (MKL 2024.2) on the tiny model and SmolLM2-135M, fp32 and bf16, 4x32:

- ATen dispatches its vectorised kernels by the CPU's SIMD level (AVX512, AVX2, none), and
  MKL picks its GEMM code path by CPU *and vendor*: the same binaries gave different logit hashes
  on a native AMD EPYC, an emulated Intel Haswell and an emulated Intel Nehalem, and multithreaded
  SDPA decode made rows of one batch differ from each other.
- ``ATEN_CPU_CAPABILITY=default`` plus ``MKL_CBWR=COMPATIBLE`` gives one hash on all of them, at
  1, 2 and 4 threads, and restores row invariance. Neither variable alone does. (Large GEMMs still
  differ at 3 or 6 threads: the thread count stays part of a golden's numerics.) That is
  ``compatible``: any x86-64 CPU, at the generic kernels' cost (prefill about twice native).
  ``MKL_CBWR=AVX2`` is ignored by MKL on AMD (it falls back to AUTO), so it is not portable:
  re-measured on an Intel host (``benchmarks/mkl_branches.py``), AVX2 agreed with an emulated
  Haswell and differed on an emulated EPYC for every ``linear`` shape.
- oneDNN honours its ISA cap on every vendor. ``portable`` sets ``ATEN_CPU_CAPABILITY=avx2`` and
  ``ONEDNN_MAX_CPU_ISA=AVX2``, keeps ``MKL_CBWR=COMPATIBLE`` for what still calls MKL, and runs the
  model's float32 linears on oneDNN (``linears.py``): one hash natively on an AMD EPYC with AVX-512
  and under emulated Haswell, EPYC and Skylake-Client, at 1 and 2 threads, for a SmolLM2-shaped
  model's prefill and decode logits. It needs AVX2 and FMA; ATen would take ``avx2`` without asking
  the CPU, so ``pin`` asks first and pins ATen's generic kernels where they are missing, and
  ``check`` refuses the run there with the settings that work.

The variables are read lazily, at torch's first CPU kernel, MKL's and oneDNN's first call, so the plugin
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
import importlib
import os
import platform
import re
import sys
from collections.abc import Mapping
from typing import Any

from pytest_llmdeterminism.errors import ConfigurationError, LLMDeterminismError, pasteable

PORTABLE = "portable"
COMPATIBLE = "compatible"
NATIVE = "native"
MODES = (PORTABLE, COMPATIBLE, NATIVE)
DEFAULT_MODE = PORTABLE
# MKL's branch that portable and compatible numerics pin on x86-64: the same bits on every CPU.
MKL_REPRODUCIBLE_BRANCH = "COMPATIBLE"
# oneDNN's instruction set cap under portable numerics on x86-64 (linears.py sends float32 GEMMs there).
ONEDNN_ISA = "AVX2"
# What each pinned mode sets before torch starts, and must then find in force, per machine.
_X86_COMPATIBLE = ({"MKL_CBWR": MKL_REPRODUCIBLE_BRANCH, "ATEN_CPU_CAPABILITY": "default"},
                   {"aten_capability": "DEFAULT", "mkl_cbwr": MKL_REPRODUCIBLE_BRANCH})
_X86_PORTABLE = ({"MKL_CBWR": MKL_REPRODUCIBLE_BRANCH, "ATEN_CPU_CAPABILITY": "avx2",
                  "ONEDNN_MAX_CPU_ISA": ONEDNN_ISA},
                 {"aten_capability": "AVX2", "mkl_cbwr": MKL_REPRODUCIBLE_BRANCH})
_ARM64 = ({"ATEN_CPU_CAPABILITY": "default", "OPENBLAS_CORETYPE": "ARMV8",
           "TORCH_MKLDNN_MATMUL_MIN_DIM": "1000000000"},
          {"aten_capability": "DEFAULT", "blas_coretype": "ARMV8"})
# Elsewhere (macOS on Apple silicon, ppc64le, ...) ATen's generic kernels; the BLAS is not pinned there.
_GENERIC = ({"ATEN_CPU_CAPABILITY": "default"}, {"aten_capability": "DEFAULT"})
_X86 = {PORTABLE: _X86_PORTABLE, COMPATIBLE: _X86_COMPATIBLE}
# arm64 has one profile: OpenBLAS's generic kernels are already the same bits on every arm64 CPU.
_ARM = {PORTABLE: _ARM64, COMPATIBLE: _ARM64}
_PINNED_BY_MACHINE: Mapping[str, Mapping[str, tuple[Mapping[str, str], Mapping[str, str]]]] = {
    "x86_64": _X86, "AMD64": _X86, "aarch64": _ARM, "arm64": _ARM,
}
_PINNED = _PINNED_BY_MACHINE.get(platform.machine(), {PORTABLE: _GENERIC, COMPATIBLE: _GENERIC})
ENVIRONMENTS: Mapping[str, Mapping[str, str]] = {mode: pinned[0] for mode, pinned in _PINNED.items()}
_EFFECTIVE: Mapping[str, Mapping[str, str]] = {mode: pinned[1] for mode, pinned in _PINNED.items()}
PORTABLE_ENVIRONMENT = ENVIRONMENTS[PORTABLE]
# Every variable some mode pins (tests and benchmarks start children without them).
PINNED_VARIABLES = tuple(sorted({name for environment in ENVIRONMENTS.values() for name in environment}))
# Portable numerics on x86-64 need ATen's AVX2 kernels and oneDNN's AVX2 GEMMs: x86-64-v3.
_NEEDS_AVX2 = _PINNED is _X86

# MKL's branch codes (mkl_cbwr.h); the STRICT flag is bit 16.
_MKL_BRANCHES = {0: "UNSET", 1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1",
                 8: "SSE4_2", 9: "AVX", 10: "AVX2", 11: "AVX512_MIC", 12: "AVX512", 13: "AVX512_MIC_E1",
                 14: "AVX512_E1"}
_MKL_STRICT = 0x10000


class CPUNumericsError(LLMDeterminismError):
    """The CPU numerics in force are not the ones the run asked for."""

    def __init__(self, mode: str, effective: Mapping[str, Any], wrong: Mapping[str, Any], *,
                 pinned_late: bool = False, without_avx2: bool = False) -> None:
        self.mode = mode
        self.effective = dict(effective)
        self.pinned_late = pinned_late
        found = ", ".join(f"{name} is {value!r} ({mode} needs {_EFFECTIVE[mode][name]!r})"
                          for name, value in wrong.items())
        environment = " ".join(f"{k}={v}" for k, v in ENVIRONMENTS[mode].items())
        if without_avx2:
            why = (f"This CPU ({cpu_name()}) has no AVX2 and FMA, which portable numerics use on x86-64 "
                   "(x86-64-v3: Intel CPUs since Haswell, 2013; AMD since Excavator, 2015), so this run "
                   "would not give the bits portable goldens hold. Choose "
                   f"{pasteable('llm_cpu_numerics', COMPATIBLE)} (the same bits on any x86-64 CPU, "
                   "prefill about twice as slow; goldens of its own) or "
                   f"{pasteable('llm_cpu_numerics', NATIVE)}.")
        elif pinned_late:
            why = ("torch ran CPU kernels before the first model load, where pytest-llmdeterminism pinned "
                   "them: this project does not configure the plugin in its ini file or command line, so "
                   "nothing was pinned before conftests ran, and this run would record machine-specific "
                   f"goldens as {mode}. Set llm_model in the ini file (pytest.ini: llm_model = "
                   "builtin:tiny; pyproject.toml: llm_model = \"builtin:tiny\", with your model) so the "
                   "plugin pins them before conftests load, or start pytest with the variables set: "
                   f"`{environment} python -m pytest ...`, or choose "
                   f"{pasteable('llm_cpu_numerics', NATIVE)} to accept machine-specific numerics.")
        else:
            why = ("torch ran CPU kernels before pytest-llmdeterminism could pin them (a plugin, conftest "
                   "or script imported and used torch first), so this run would record machine-specific "
                   f"goldens as {mode}. Start pytest with the variables set: "
                   f"`{environment} python -m pytest ...`, or choose "
                   f"{pasteable('llm_cpu_numerics', NATIVE)} to accept machine-specific numerics.")
        super().__init__(f"llm_cpu_numerics = {mode!r} is not in force: {found}. {why}")


def parse_mode(raw: str | None, *, setting: str = "llm_cpu_numerics") -> str:
    mode = (raw or DEFAULT_MODE).strip()
    if mode not in MODES:
        raise ConfigurationError(setting, raw, f"expected {PORTABLE!r} (the default: the same bits on any "
                                 f"x86-64 CPU with AVX2, or any arm64 CPU, at a thread count), "
                                 f"{COMPATIBLE!r} (the same bits on any x86-64 CPU, AVX2 or not; slower) or "
                                 f"{NATIVE!r} (the CPU's fastest kernels)")
    return mode


def pinned(mode: str) -> bool:
    """Whether ``mode`` pins kernels whose bits travel between CPUs (portable or compatible)."""
    return mode in _EFFECTIVE


def pin(mode: str) -> dict[str, str | None]:
    """Set the environment for ``mode`` before torch starts; returns the values it replaced."""
    if not pinned(mode):
        return {}
    replaced = {name: os.environ.get(name) for name in ENVIRONMENTS[mode]}
    os.environ.update(ENVIRONMENTS[mode])
    if _missing_avx2(mode):
        # ATen takes ATEN_CPU_CAPABILITY=avx2 without asking the CPU: its AVX2 kernels would die of an
        # illegal instruction. ATen's generic kernels run instead, and the load refuses the run with
        # the settings that work here (check). Importing torch picks no kernels: they are picked at
        # the first computation (measured under qemu-x86_64 -cpu Nehalem).
        os.environ["ATEN_CPU_CAPABILITY"] = "default"
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
    """The effective numerics, or :class:`CPUNumericsError` when a pinned mode is not in force
    (``pinned_late``: the plugin set the variables at the first load, not before conftests)."""
    __tracebackhide__ = True
    found = effective()
    if pinned(mode):
        wrong = {name: found[name] for name, wanted in _EFFECTIVE[mode].items()
                 if found[name] is not None and found[name] != wanted}
        if wrong:
            raise CPUNumericsError(mode, found, wrong, pinned_late=pinned_late,
                                   without_avx2=_missing_avx2(mode))
    return found


def _missing_avx2(mode: str) -> bool:
    """``mode`` needs AVX2 and FMA here (portable on x86-64) and the CPU lacks them."""
    return mode == PORTABLE and _NEEDS_AVX2 and not _has_avx2()


def _has_avx2() -> bool:
    """AVX2 and FMA with the OS saving their registers (what ATen's AVX2 kernels need), as numpy's
    CPU feature table says (numpy asks CPUID and XGETBV in C at import, also under qemu-user, without
    executable memory; torch need not be imported: the plugin pins before conftests, in runs that
    may never load a model). ``/proc/cpuinfo`` is the fallback without numpy."""
    features = _cpu_features()
    if features is not None:
        return all(features.get(name) for name in ("AVX", "AVX2", "FMA3"))  # AVX: the OS saves its state
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            flags = next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), [])
    except OSError:
        return True  # nothing to ask: ATen's own dispatch decides, and check() reads what it chose
    return "avx2" in flags and "fma" in flags


def _cpu_features() -> Mapping[str, bool] | None:
    """numpy's table of the CPU's features (``AVX2``, ``FMA3``, ...; an AVX feature counts only where
    the OS saves the AVX registers), or None without numpy. Tests replace this function to fake a CPU."""
    for name in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):  # numpy 2, numpy 1
        try:
            features = importlib.import_module(name).__cpu_features__
        except (ImportError, AttributeError):
            continue
        return {str(feature): bool(present) for feature, present in features.items()}
    return None


def describe(mode: str) -> str:
    """One line for the pytest header."""
    if pinned(mode):
        variables = ", ".join(f"{k}={v}" for k, v in ENVIRONMENTS[mode].items())
        return f"cpu numerics: {mode} ({variables}; {platform.machine()})"
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
