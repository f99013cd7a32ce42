"""The CPU numerics profiles as data: one frozen :class:`NumericsProfile` per machine and
``llm_cpu_numerics`` mode, what it sets and must find in force, and whether a golden's fingerprint
shows it ran. Pure (no environment read, no torch): the judgement's fingerprint policy reads it;
``numerics.py`` pins and checks it."""

from __future__ import annotations

import dataclasses
import platform
from collections.abc import Mapping
from typing import Any

PORTABLE = "portable"
COMPATIBLE = "compatible"
NATIVE = "native"
MODES = (PORTABLE, COMPATIBLE, NATIVE)
DEFAULT_MODE = PORTABLE
# MKL's branch that portable and compatible numerics pin on x86-64: the same bits on every CPU.
MKL_REPRODUCIBLE_BRANCH = "COMPATIBLE"
# oneDNN's instruction set cap under portable numerics on x86-64 (the kernels send float32 GEMMs there).
ONEDNN_ISA = "AVX2"
# The batch-invariant constructions a profile may support (kernels.py): the prefill on oneDNN, or in
# tiles of rows on the BLAS; both run decode steps and attention row by row.
ONEDNN_ROWS = "onednn"
TILES = "tiles"
# A fingerprint records effective()'s aten_capability as cpu_capability; the other names are the same.
_FINGERPRINT_NAMES = {"aten_capability": "cpu_capability"}


@dataclasses.dataclass(frozen=True)
class NumericsProfile:
    """The CPU numerics of one machine under one mode: what it sets before torch starts, what it must
    then find in force, whether a fingerprint shows it ran, and the kernels it supports."""

    mode: str  # the llm_cpu_numerics word (TRAVELLING's name the kernels: arm64's is "portable")
    machine: str  # "x86-64", "arm64" or "other"
    environment: Mapping[str, str] = dataclasses.field(default_factory=dict)  # set before torch starts
    in_force: Mapping[str, str] = dataclasses.field(default_factory=dict)  # must be found (as effective())
    # the llm_cpu_numerics words a golden computed on these kernels may carry (before portable moved
    # to AVX2 kernels, "portable" ran the generic ones that compatible pins now)
    recorded_as: frozenset[str] = frozenset()
    travels: bool = False  # the same bits on every CPU of the machine (at a thread count)
    needs_avx2: bool = False  # x86-64-v3: ATen's AVX2 kernels and oneDNN's AVX2 GEMMs
    onednn_isa: str | None = None  # float32 linears on oneDNN capped at this instruction set
    batch_invariant: str | None = None  # ONEDNN_ROWS, TILES, or None: no batch-invariant kernels

    @property
    def pinned(self) -> bool:
        """Whether the profile pins kernels (portable or compatible; native pins nothing)."""
        return self.mode != NATIVE

    @property
    def pins_mkl(self) -> bool:
        """Whether the profile's kernels rely on MKL's reproducible branch being in force."""
        return self.in_force.get("mkl_cbwr") == MKL_REPRODUCIBLE_BRANCH

    def ran(self, fingerprint: Mapping[str, Any]) -> bool:
        """Whether a golden's ``fingerprint`` shows these kernels computed it: a mode word it may carry,
        and everything the profile must find recorded as found."""
        return (self.travels and fingerprint.get("cpu_numerics") in self.recorded_as
                and all(fingerprint.get(_FINGERPRINT_NAMES.get(name, name)) == value
                        for name, value in self.in_force.items()))


_X86_PORTABLE = NumericsProfile(
    PORTABLE, "x86-64",
    {"MKL_CBWR": MKL_REPRODUCIBLE_BRANCH, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": ONEDNN_ISA},
    {"aten_capability": "AVX2", "mkl_cbwr": MKL_REPRODUCIBLE_BRANCH},
    recorded_as=frozenset({PORTABLE}), travels=True, needs_avx2=True, onednn_isa=ONEDNN_ISA,
    batch_invariant=ONEDNN_ROWS)
_X86_COMPATIBLE = NumericsProfile(
    COMPATIBLE, "x86-64", {"MKL_CBWR": MKL_REPRODUCIBLE_BRANCH, "ATEN_CPU_CAPABILITY": "default"},
    {"aten_capability": "DEFAULT", "mkl_cbwr": MKL_REPRODUCIBLE_BRANCH},
    recorded_as=frozenset({COMPATIBLE, PORTABLE}), travels=True, batch_invariant=TILES)
# arm64 has one pinned profile: OpenBLAS's generic ARMV8 kernels are the same bits on every arm64 CPU.
_ARM64_ENVIRONMENT = {"ATEN_CPU_CAPABILITY": "default", "OPENBLAS_CORETYPE": "ARMV8",
                      "TORCH_MKLDNN_MATMUL_MIN_DIM": "1000000000"}
_ARM64_IN_FORCE = {"aten_capability": "DEFAULT", "blas_coretype": "ARMV8"}


def _arm64(batch_invariant: str | None) -> NumericsProfile:
    return NumericsProfile(PORTABLE, "arm64", _ARM64_ENVIRONMENT, _ARM64_IN_FORCE,
                           recorded_as=frozenset({PORTABLE, COMPATIBLE}), travels=True,
                           batch_invariant=batch_invariant)


# Linux arm64 (torch's wheels: OpenBLAS) runs the tiles; macOS on Apple silicon has no such kernels.
_LINUX_ARM64, _OTHER_ARM64 = _arm64(TILES), _arm64(None)
# Elsewhere (ppc64le, ...) ATen's generic kernels; the BLAS is not pinned there, so nothing travels.
_GENERIC = NumericsProfile(PORTABLE, "other", {"ATEN_CPU_CAPABILITY": "default"},
                           {"aten_capability": "DEFAULT"})
_PROFILES: Mapping[str, Mapping[str, NumericsProfile]] = {
    "x86_64": {PORTABLE: _X86_PORTABLE, COMPATIBLE: _X86_COMPATIBLE},
    "AMD64": {PORTABLE: _X86_PORTABLE, COMPATIBLE: _X86_COMPATIBLE},
    "aarch64": {PORTABLE: _LINUX_ARM64, COMPATIBLE: _LINUX_ARM64},
    "arm64": {PORTABLE: _OTHER_ARM64, COMPATIBLE: _OTHER_ARM64},
}
# The profiles whose bits travel, on any machine: a golden's fingerprint shows which one ran.
TRAVELLING = (_X86_PORTABLE, _X86_COMPATIBLE, _LINUX_ARM64)


def profile(mode: str, machine: str | None = None) -> NumericsProfile:
    """The profile of ``mode`` on ``machine`` (``platform.machine()``'s name; default: this one)."""
    machine = platform.machine() if machine is None else machine
    if mode not in (PORTABLE, COMPATIBLE):
        family = {"x86_64": "x86-64", "AMD64": "x86-64", "aarch64": "arm64", "arm64": "arm64"}
        return NumericsProfile(NATIVE, family.get(machine, "other"))
    found = _PROFILES.get(machine, {PORTABLE: _GENERIC, COMPATIBLE: _GENERIC})[mode]
    return found if found.mode == mode else dataclasses.replace(found, mode=mode)


def profile_that_ran(fingerprint: Mapping[str, Any]) -> NumericsProfile | None:
    """The travelling profile whose kernels computed a golden with this fingerprint, if any."""
    return next((candidate for candidate in TRAVELLING if candidate.ran(fingerprint)), None)
