"""CPU numerics: which kernels torch's CPU math takes, pinned so that goldens travel between machines.

One frozen :class:`NumericsProfile` per machine and ``llm_cpu_numerics`` mode says what the mode
sets before torch starts, what it must then find in force (``check``), whether a fingerprint shows
it ran (``ran``) and which of the plugin's kernels it supports (``kernels.py`` asks it). The
variables are read lazily, at torch's first CPU kernel, so the plugin sets them early
(``environment.py``) and checks them when the model loads. Measurements: ``docs/design/kernels.md``.
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

from pytest_llmdeterminism.compute.profiles import (  # noqa: F401 - the profiles' data, read on as numerics.X
    COMPATIBLE,
    DEFAULT_MODE,
    MKL_REPRODUCIBLE_BRANCH,
    MODES,
    NATIVE,
    ONEDNN_ISA,
    ONEDNN_ROWS,
    PORTABLE,
    TILES,
    TRAVELLING,
    NumericsProfile,
    profile,
    profile_that_ran,
)
from pytest_llmdeterminism.errors import ConfigurationError, LLMDeterminismError, pasteable

ENVIRONMENTS: Mapping[str, Mapping[str, str]] = {mode: profile(mode).environment
                                                 for mode in (PORTABLE, COMPATIBLE)}
PORTABLE_ENVIRONMENT = ENVIRONMENTS[PORTABLE]
# Every variable some mode pins (tests and benchmarks start children without them).
PINNED_VARIABLES = tuple(sorted({name for environment in ENVIRONMENTS.values() for name in environment}))

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
        found = ", ".join(f"{name} is {value!r} ({mode} needs {profile(mode).in_force[name]!r})"
                          for name, value in wrong.items())
        environment = " ".join(f"{k}={v}" for k, v in profile(mode).environment.items())
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
    return profile(mode).pinned


def pin(mode: str) -> dict[str, str | None]:
    """Set the environment for ``mode`` before torch starts; returns the values it replaced."""
    if not pinned(mode):
        return {}
    environment = profile(mode).environment
    replaced = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)
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
        wrong = {name: found[name] for name, wanted in profile(mode).in_force.items()
                 if found[name] is not None and found[name] != wanted}
        if wrong:
            raise CPUNumericsError(mode, found, wrong, pinned_late=pinned_late,
                                   without_avx2=_missing_avx2(mode))
    return found


def _missing_avx2(mode: str) -> bool:
    """``mode`` needs AVX2 and FMA here (portable on x86-64) and the CPU lacks them."""
    return profile(mode).needs_avx2 and not _has_avx2()


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
        variables = ", ".join(f"{k}={v}" for k, v in profile(mode).environment.items())
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
