"""Batch invariance on the real SmolLM2-135M: its goldens do not depend on the batch shape (the tiny
model's, and each op's, are checked in tests/unit/compute/test_batch_invariant.py)."""

from __future__ import annotations

from pytest_llmdeterminism import engines
from pytest_llmdeterminism.compute.kernels import Policy
from tests.helpers.batch_invariant import identical_under_every_shape


def test_smollm2s_goldens_do_not_depend_on_the_batch_shape(smollm2_gguf):
    """The real model with default settings: recorded alone (one call per prompt), IDENTICAL batched at
    four other shapes."""
    loaded = engines.load(str(smollm2_gguf), dtype="float32", device="cpu")  # the default kernels
    assert loaded.engine.kernels.policy is Policy.BATCH_INVARIANT
    identical_under_every_shape(loaded, ("1x32", "4x32", "2x48", "8x64", "3x40"), 6)
