"""What a golden's fingerprint means: the fields that decide its bits (each engine names its own, by
device class and CPU numerics: ``engines/registry.py``), and the diff of two fingerprints. Pure: no
torch, no I/O. The fingerprint itself is collected from a loaded model by ``model/fingerprint.py``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_llmdeterminism.compute import profiles
from pytest_llmdeterminism.engines.registry import ENGINES
from pytest_llmdeterminism.generation import DEFAULT_ENGINE

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


def numerics_changes(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """Fields that decide the bits and differ between a golden's fingerprint and this run's.

    Pure. A field the golden did not record (it predates the field) counts as changed, except the
    BLAS of a golden that recorded MKL's branch: that torch used MKL, which has no core type.
    """
    recorded, current = _profile(_with_legacy_blas(recorded)), _profile(_with_legacy_blas(current))
    # Each engine names the fields that decide its bits (engines/registry.py); across engines, this
    # run's engine's (a fingerprint of the default engine names none of another's: "engine" alone).
    engines = {side.get("engine", DEFAULT_ENGINE) for side in (recorded, current)}
    engine = ENGINES.get(DEFAULT_ENGINE if engines == {DEFAULT_ENGINE} else str(current.get("engine")))
    if current.get("device_class") != "cpu":
        kind = "gpu"
    else:  # portable only where both sides ran the pinned kernels (not, e.g., a torch without MKL)
        kind = "cpu-portable" if all(_ran_portable(side) for side in (recorded, current)) else "cpu-native"
    fields = ("engine",) if engine is None else engine.fields_for(kind)
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
