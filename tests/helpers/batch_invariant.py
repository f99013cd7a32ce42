"""Batch invariance as tests/unit/compute/test_batch_invariant.py and
tests/real_model/test_smollm2_batch_invariance.py check it: the
same prompts generated at several shapes read IDENTICAL."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

from pytest_llmdeterminism.compute.kernels import Policy
from pytest_llmdeterminism.engines.loaded import LoadedModel
from pytest_llmdeterminism.generation import Generation
from pytest_llmdeterminism.goldens.kinds.generation import input_changes
from pytest_llmdeterminism.judge.compare import Verdict, compare
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings


@contextmanager
def on_policy(loaded: LoadedModel, chosen: Policy) -> Iterator[None]:
    """``loaded`` on the kernels of ``chosen`` within the block; its fingerprint and probe results,
    which name the kernels, are computed again on each side."""
    before = loaded.engine.kernels
    loaded.engine.kernels = dataclasses.replace(before, policy=chosen)
    loaded.static_fingerprint, loaded.probed = None, {}
    try:
        yield
    finally:
        loaded.engine.kernels, loaded.static_fingerprint, loaded.probed = before, None, {}


PROMPTS = ["Once upon a time", "The capital of France is", "def add(a, b):", "Hello there, how"]


def generations_at(llm: LLMModel, shape: str) -> list[Generation]:
    if shape.startswith("1x"):
        return [llm.generate([prompt])[0] for prompt in PROMPTS]  # each alone, unpadded
    return llm.generate(PROMPTS)


def identical_under_every_shape(loaded: LoadedModel, shapes: tuple[str, ...], tokens: int) -> None:
    """Generations at the first shape are the goldens; every other shape reads IDENTICAL against them,
    the shape only informational."""
    found = {shape: generations_at(LLMModel(loaded, GenerationSettings(BatchShape.parse(shape), tokens, 0)),
                                 shape) for shape in shapes}
    for shape in shapes[1:]:
        for golden, now in zip(found[shapes[0]], found[shape], strict=True):
            assert input_changes(golden, now) == (), shape
            assert compare(golden, now).verdict is Verdict.IDENTICAL, (shape, golden.prompt)

