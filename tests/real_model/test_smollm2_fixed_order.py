"""The fixed-order kernel (compute/fixed_order.py) on the real SmolLM2-135M: the same bits on the kernel
as on oneDNN (the kernel's own checks: tests/unit/compute/test_fixed_order.py)."""

from __future__ import annotations

import dataclasses

from pytest_llmdeterminism import engines
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings


def test_smollm2_generates_the_same_bits_on_the_kernel_as_on_onednn(smollm2_gguf, tmp_path, monkeypatch):
    loaded = engines.load(str(smollm2_gguf), dtype="float32", device="cpu", cpu_numerics="portable",
                          batch_invariant=False)  # the previous kernels: decode steps on the kernel too
    assert loaded.engine.kernels.fixed_order is not None, loaded.slower
    llm = LLMModel(loaded, GenerationSettings(BatchShape.parse("4x32"), 12, 0))
    prompts = ["Once upon a time", "The capital of France is", "def fibonacci(n):"]
    fast = llm.generate(prompts)
    fixed = loaded.engine.kernels.fixed_order
    assert fixed.checked and all(fixed.checked.values())
    kernels = loaded.engine.kernels
    loaded.engine.kernels = dataclasses.replace(kernels, fixed_order=None)
    try:
        slow = llm.generate(prompts)
    finally:
        loaded.engine.kernels = kernels
    for a, b in zip(fast, slow, strict=True):
        assert (a.token_ids, a.step_hashes, a.top_logprobs) == (b.token_ids, b.step_hashes, b.top_logprobs)
