"""Batch-invariant kernels (engines/batch_invariant.py): a row's bits do not depend on its batch.

Per op (linears, attention) and for the whole model: the same prompt alone and unpadded, or batched
with others at other shapes, gives the same logit hashes; the default kernels are the negative
control (they do not). The suite pins portable numerics for itself (pyproject.toml).
"""

from __future__ import annotations

import pytest
import torch

from pytest_llmdeterminism.engines import batch_invariant
from pytest_llmdeterminism.engines.model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

# SmolLM2-135M's projections (query/output, key/value, gate/up, down) and the tiny model's.
SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (64, 64)]
PROMPTS = ["Once upon a time", "The capital of France is", "def add(a, b):", "Hello there, how"]


@pytest.fixture
def threads():
    """Set torch's thread count for a test; put back afterwards."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("out_features, in_features", SHAPES)
def test_a_rows_linear_bits_do_not_depend_on_how_many_rows_share_the_call(out_features, in_features, threads):
    generator = torch.Generator().manual_seed(out_features + in_features)
    weight = torch.randn(out_features, in_features, generator=generator) / in_features ** 0.5
    bias = torch.randn(out_features, generator=generator)
    row = torch.randn(1, in_features, generator=generator)
    found = {}
    for count in (1, 2, 4):
        threads(count)
        alone = batch_invariant.invariant_linear(row, weight, bias)
        for rows in (2, 3, 5, 8, 17, 64):
            batch = torch.randn(rows, in_features, generator=generator)
            batch[rows // 2] = row
            assert torch.equal(batch_invariant.invariant_linear(batch, weight, bias)[rows // 2], alone[0]), \
                (count, rows)
        found[count] = alone
    assert all(torch.equal(found[1], other) for other in found.values()), "the thread count changed the bits"
    torch.testing.assert_close(found[1], torch.nn.functional.linear(row, weight, bias))


def _causal_padded_mask(lengths: list[int], total: int) -> torch.Tensor:
    """transformers' boolean SDPA mask for left-padded rows: True where a query may see a key."""
    causal = torch.ones(total, total, dtype=torch.bool).tril()
    masks = []
    for length in lengths:
        real = torch.zeros(total, dtype=torch.bool)
        real[total - length:] = True
        masks.append(causal & real[None, :])
    return torch.stack(masks)[:, None]


def test_a_padded_rows_attention_has_the_bits_of_the_row_alone():
    generator = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, total = 4, 2, 16, 32
    module = torch.nn.Module()
    module.num_key_value_groups = heads // kv_heads
    lengths = [5, 32, 1, 17]

    def tensors(rows: int, length: int, n_heads: int) -> torch.Tensor:
        return torch.randn(rows, n_heads, length, dim, generator=generator)

    query, key, value = tensors(4, total, heads), tensors(4, total, kv_heads), tensors(4, total, kv_heads)
    mask = _causal_padded_mask(lengths, total)
    output, _ = batch_invariant.rowwise_attention(module, query, key, value, mask, scaling=dim ** -0.5)
    step_query = tensors(4, 1, heads)
    step_key = torch.cat([key, tensors(4, 1, kv_heads)], dim=2)
    step_value = torch.cat([value, tensors(4, 1, kv_heads)], dim=2)
    step_mask = torch.cat([_causal_padded_mask(lengths, total)[:, :, -1:],
                           torch.ones(4, 1, 1, 1, dtype=torch.bool)], dim=3)
    step, _ = batch_invariant.rowwise_attention(module, step_query, step_key, step_value, step_mask,
                                                scaling=dim ** -0.5)
    for row, length in enumerate(lengths):
        real = slice(total - length, None)
        alone, _ = batch_invariant.rowwise_attention(
            module, query[row:row + 1, :, real], key[row:row + 1, :, real], value[row:row + 1, :, real], None,
            scaling=dim ** -0.5)
        assert torch.equal(output[row, real], alone[0]), row
        assert not output[row, :total - length].any()  # padded queries: zeros, nothing reads them
        decoded, _ = batch_invariant.rowwise_attention(
            module, step_query[row:row + 1], step_key[row:row + 1, :, total - length:],
            step_value[row:row + 1, :, total - length:], None, scaling=dim ** -0.5)
        assert torch.equal(step[row], decoded[0]), row


def _hashes(llm: LLMModel, shape: str) -> list[tuple[list[int], list[str]]]:
    if shape.startswith("1x"):
        generations = [llm.generate([prompt])[0] for prompt in PROMPTS]  # each alone, unpadded
    else:
        generations = llm.generate(PROMPTS)
    return [(generation.token_ids, generation.logit_hashes) for generation in generations]


def test_the_tiny_models_logits_do_not_depend_on_the_batch_shape(tiny):
    shapes = ("1x32", "4x32", "2x48", "8x64", "3x40")
    found = {}
    tiny.engine.batch_invariant = True
    try:
        for shape in shapes:
            found[shape] = _hashes(LLMModel(tiny, GenerationSettings(BatchShape.parse(shape), 8, 0)), shape)
    finally:
        tiny.engine.batch_invariant = False
    for shape in shapes[1:]:
        assert found[shape] == found["1x32"], shape
    # the negative control: today's kernels give a batched prompt other bits than the prompt alone
    default = {shape: _hashes(LLMModel(tiny, GenerationSettings(BatchShape.parse(shape), 8, 0)), shape)
               for shape in ("1x32", "4x32")}
    assert default["4x32"] != default["1x32"]
    assert [tokens for tokens, _ in default["4x32"]] == [tokens for tokens, _ in found["4x32"]]


def test_batch_invariant_kernels_put_the_model_back(tiny):
    model = tiny.engine.model
    before = model.config._attn_implementation
    with batch_invariant.batch_invariant(model) as routed:
        assert routed > 0
        assert model.config._attn_implementation == batch_invariant.ATTENTION
    assert model.config._attn_implementation == before
    assert all("forward" not in vars(module) for module in model.modules())
