"""The fingerprint of a loaded model: what produced a generation (versions, device, CPU numerics,
kernels, the hashes of the weights and the tokenizer), stored with every golden. Each engine
describes its own (``Engine.fingerprint``, ``engines/fingerprints.py``); this module keeps it once per
loaded model and adds the flags of a call. What its fields mean for a comparison is
``judge/fingerprint.py``'s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_llmdeterminism.engines.loaded import LoadedModel

__all__ = ["fingerprint"]


def fingerprint(loaded: LoadedModel, flags: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What produced a generation. Cached per loaded model, except the determinism ``flags`` the
    engine had in force (by default the live torch flags)."""
    from pytest_llmdeterminism.compute import determinism

    if loaded.static_fingerprint is None:
        loaded.static_fingerprint = loaded.engine.fingerprint(loaded)
    return {**loaded.static_fingerprint, "flags": dict(determinism.flags() if flags is None else flags)}
