"""What a golden's fingerprint means: the fields that decide its bits, by device class, CPU numerics
and engine, and the diff of two fingerprints. Pure: no torch, no I/O. The fingerprint itself is
collected from a loaded model by ``model/fingerprint.py``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_llmdeterminism.compute import profiles

__all__ = ["describe_changes", "diff", "numerics_changes"]


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """Fields that differ, flattened with dotted names: ``[(field, old, new), ...]``."""
    changes = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            changes += [(f"{key}.{k}", x, y) for k, x, y in diff(a, b)]
        elif a != b:
            changes.append((key, a, b))
    return changes


# The fields that decide a golden's bits, by device class and CPU numerics mode. Equal fields:
# the same numerics, so exact comparison is the default; any difference: near-tie tolerance.
_NUMERICS_COMMON = ("device_class", "machine", "dtype", "torch", "transformers", "attention_implementation")
_NUMERICS_BY_KIND = {
    # MKL's COMPATIBLE branch is bit-identical across thread counts 1, 2, 4, 8 and 16 but not 3 or 6
    # (measured), and Intel documents it for a fixed thread count only: threads stay a field.
    # cpu_numerics and cpu_capability name the pinned profile: portable's AVX2 kernels or the
    # compatible (and older portable) generic ones.
    "cpu-portable": ("cpu_numerics", "cpu_capability", "blas", "torch_threads", "batch_invariant"),
    # native kernels depend on the SIMD level, MKL's branch (picked by CPU and vendor), OpenBLAS's
    # core type (picked by CPU: arm64 Neoverse vs generic ARMv8 kernels differ) and threads
    "cpu-native": ("cpu_numerics", "device_name", "cpu_capability", "mkl_cbwr", "blas", "blas_coretype",
                   "torch_threads"),
    "gpu": ("device_name", "compute_capability", "cuda", "cudnn", "cuda_driver"),
}
# Other engines: their own version and pinned knobs decide the bits (and, in process, the CPU).
_NUMERICS_BY_ENGINE = {
    "llamacpp": ("engine", "engine_version", "machine", "device_name", "cpu_features", "dtype", "threads",
                 "n_batch", "n_ubatch", "n_ctx", "weights_hash"),
    "openai": ("engine", "server_model", "server_version", "flags", "dtype"),  # flags: system_fingerprint
    "vllm": ("engine", "engine_version", "device_name", "compute_capability", "cuda", "dtype", "torch",
             "batch_invariant"),
}


def numerics_changes(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """Fields that decide the bits and differ between a golden's fingerprint and this run's.

    Pure. A field the golden did not record (it predates the field) counts as changed, except the
    BLAS of a golden that recorded MKL's branch: that torch used MKL, which has no core type.
    """
    recorded, current = _profile(_with_legacy_blas(recorded)), _profile(_with_legacy_blas(current))
    engines = {side.get("engine", "transformers") for side in (recorded, current)}
    if engines != {"transformers"}:
        fields = _NUMERICS_BY_ENGINE.get(str(current.get("engine")), ("engine",))
        return [(name, recorded.get(name), current.get(name)) for name in fields
                if recorded.get(name) != current.get(name)]
    if current.get("device_class") != "cpu":
        kind = "gpu"
    else:  # portable only where both sides ran the pinned kernels (not, e.g., a torch without MKL)
        kind = "cpu-portable" if all(_ran_portable(side) for side in (recorded, current)) else "cpu-native"
    fields = _NUMERICS_COMMON + _NUMERICS_BY_KIND[kind]
    return [(name, recorded.get(name), current.get(name)) for name in fields
            if recorded.get(name) != current.get(name)]


def _ran_portable(fingerprint: Mapping[str, Any]) -> bool:
    """A pinned mode asked for and in force: a numerics profile whose bits travel ran (profiles.py)."""
    return profiles.profile_that_ran(fingerprint) is not None


def _profile(fingerprint: Mapping[str, Any]) -> Mapping[str, Any]:
    """Names the pinned kernels, not the word the ini file used: goldens recorded as ``portable``
    before it moved to AVX2 kernels ran the generic ones, which ``compatible`` pins now; on arm64
    both modes pin the same kernels."""
    ran = profiles.profile_that_ran(fingerprint)
    return fingerprint if ran is None else {**fingerprint, "cpu_numerics": ran.mode}


def _with_legacy_blas(fingerprint: Mapping[str, Any]) -> Mapping[str, Any]:
    if "blas" in fingerprint or fingerprint.get("mkl_cbwr") is None:
        return fingerprint
    return {**fingerprint, "blas": "mkl", "blas_coretype": None}


def describe_changes(changes: list[tuple[str, Any, Any]]) -> str:
    """``cpu_capability 'AVX512' → 'AVX2', torch '2.12.0' → '2.13.0'``"""
    return ", ".join(f"{name} {old!r} → {new!r}" for name, old, new in changes)
