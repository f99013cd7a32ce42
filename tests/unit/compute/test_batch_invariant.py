"""Batch-invariant kernels (compute/kernels.py, compute/tensor_ops.py): a row's bits do not depend on
its batch.

Per op (linears, attention) and for the whole model: the same prompt alone and unpadded, or batched
with others at other shapes, gives the same logit hashes; the default kernels are the negative
control (they do not). The suite pins portable numerics for itself (pyproject.toml).
"""

from __future__ import annotations

import pytest
import torch

from pytest_llmdeterminism import ConfigurationError, engines
from pytest_llmdeterminism.compute import kernels as chosen_kernels
from pytest_llmdeterminism.compute import numerics, tensor_ops
from pytest_llmdeterminism.compute.kernels import Kernels, Policy, why_not_batch_invariant
from pytest_llmdeterminism.goldens.kinds.generation import input_changes
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings
from tests.helpers.batch_invariant import PROMPTS, generations_at, identical_under_every_shape, on_policy

# SmolLM2-135M's projections (query/output, key/value, gate/up, down) and the tiny model's.
SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (64, 64)]


@pytest.fixture
def threads():
    """Set torch's thread count for a test; put back afterwards."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("out_features, in_features", SHAPES)
def test_a_rows_linear_bits_do_not_depend_on_how_many_rows_share_the_call(out_features, in_features, threads,
                                                                          kernel):
    """The portable kernel of both phases (``invariant_linear``: oneDNN with at least two rows, on the
    fixed-order kernel where built): a row's bits among 1 to 63 companions, at 1, 2 and 4 threads, are
    its bits alone (a decode step's lone row, computed as two)."""
    generator = torch.Generator().manual_seed(out_features + in_features)
    weight = torch.randn(out_features, in_features, generator=generator) / in_features ** 0.5
    bias = torch.randn(out_features, generator=generator)
    row = torch.randn(1, in_features, generator=generator)
    found = {}
    for count in (1, 2, 4):
        threads(count)
        for fixed in (None, kernel):
            alone = tensor_ops.invariant_linear(row, weight, bias, fixed)
            for rows in (2, 3, 5, 8, 17, 64):
                batch = torch.randn(rows, in_features, generator=generator)
                batch[rows // 2] = row
                assert torch.equal(tensor_ops.invariant_linear(batch, weight, bias, fixed)[rows // 2],
                                   alone[0]), (count, rows, fixed)
            found[count, fixed] = alone
    assert all(torch.equal(found[1, None], other) for other in found.values()), "threads or kernel moved bits"
    torch.testing.assert_close(found[1, None], torch.nn.functional.linear(row, weight, bias))
    assert kernel.checked and all(kernel.checked.values()), kernel.checked  # checked against oneDNN


@pytest.mark.parametrize("out_features, in_features", SHAPES)
def test_a_decode_steps_rows_are_each_a_one_row_product_whatever_their_number(out_features, in_features,
                                                                              threads):
    """The decode kernel (``rows_linear``): a row's bits among 1 to 63 companions are its bits alone,
    whatever the split of its output features and the thread count, and those of ``F.linear`` at one
    row on MKL's reproducible branch."""
    generator = torch.Generator().manual_seed(out_features * in_features)
    weight = torch.randn(out_features, in_features, generator=generator) / in_features ** 0.5
    bias = torch.randn(out_features, generator=generator)
    row = torch.randn(1, 1, in_features, generator=generator)  # (rows, positions, features) as in decode
    found = []
    for count in (1, 2, 4):
        threads(count)
        for blocks in (0, 2, 4):
            alone = tensor_ops.rows_linear(row, weight, bias, blocks)
            found.append(alone)
            for rows in (2, 3, 8, 17, 64):
                batch = torch.randn(rows, 1, in_features, generator=generator)
                batch[rows // 2] = row[0]
                assert torch.equal(tensor_ops.rows_linear(batch, weight, bias, blocks)[rows // 2],
                                   alone[0]), (count, blocks, rows)
    assert all(torch.equal(found[0], other) for other in found), "threads or the split changed the bits"
    assert torch.equal(found[0], torch.nn.functional.linear(row, weight, bias))


@pytest.mark.parametrize("out_features, in_features", SHAPES)
def test_a_tiled_rows_bits_do_not_depend_on_how_many_rows_share_the_call(out_features, in_features, threads):
    """The prefill's kernel under compatible numerics (``tiled_linear``, MKL in tiles of 32 rows): a
    row's bits among 1 to 99 companions, at 1, 2 and 4 threads, are its bits alone."""
    generator = torch.Generator().manual_seed(out_features - in_features)
    weight = torch.randn(out_features, in_features, generator=generator) / in_features ** 0.5
    bias = torch.randn(out_features, generator=generator)
    row = torch.randn(1, in_features, generator=generator)
    found = []
    for count in (1, 2, 4):
        threads(count)
        alone = tensor_ops.tiled_linear(row, weight, bias)
        found.append(alone)
        for rows in (2, 31, 32, 33, 100):
            batch = torch.randn(rows, in_features, generator=generator)
            batch[rows // 2] = row
            assert torch.equal(tensor_ops.tiled_linear(batch, weight, bias)[rows // 2], alone[0]), \
                (count, rows)
    assert all(torch.equal(found[0], other) for other in found), "the thread count changed the bits"
    torch.testing.assert_close(found[0], torch.nn.functional.linear(row, weight, bias))


def test_without_a_cache_every_forward_is_a_prefill_and_stays_invariant(tiny):
    """use_cache=False: every forward holds every position (none is a decode step), and a prompt's
    bits alone and batched still agree."""
    with on_policy(tiny, Policy.BATCH_INVARIANT):
        alone, batched = (generations_at(LLMModel(tiny, GenerationSettings(BatchShape.parse(shape), 5, 0)),
                                       shape) for shape in ("1x32", "4x32"))
        assert [g.step_hashes for g in alone] == [g.step_hashes for g in batched]
        cached = LLMModel(tiny, GenerationSettings(BatchShape.parse("4x32"), 5, 0)).generate(PROMPTS)
        uncached = LLMModel(tiny, GenerationSettings(BatchShape.parse("4x32"), 5, 0)).generate(
            PROMPTS, use_cache=False)
        alone_uncached = [LLMModel(tiny, GenerationSettings(BatchShape.parse("1x32"), 5, 0)).generate(
            [prompt], use_cache=False)[0] for prompt in PROMPTS]
    assert [g.step_hashes for g in uncached] == [g.step_hashes for g in alone_uncached]
    assert [g.token_ids for g in uncached] == [g.token_ids for g in cached]


def _causal_padded_mask(lengths: list[int], total: int) -> torch.Tensor:
    """transformers' boolean SDPA mask for left-padded rows: True where a query may see a key."""
    causal = torch.ones(total, total, dtype=torch.bool).tril()
    masks = []
    for length in lengths:
        real = torch.zeros(total, dtype=torch.bool)
        real[total - length:] = True
        masks.append(causal & real[None, :])
    return torch.stack(masks)[:, None]


@pytest.mark.parametrize("count", [1, 2, 4])
def test_a_padded_rows_attention_has_the_bits_of_the_row_alone(count, threads):
    threads(count)
    generator = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, total = 4, 2, 16, 32
    module = torch.nn.Module()
    module.num_key_value_groups = heads // kv_heads
    lengths = [5, 32, 1, 17]

    def tensors(rows: int, length: int, n_heads: int) -> torch.Tensor:
        return torch.randn(rows, n_heads, length, dim, generator=generator)

    query, key, value = tensors(4, total, heads), tensors(4, total, kv_heads), tensors(4, total, kv_heads)
    mask = _causal_padded_mask(lengths, total)
    output, _ = tensor_ops.rowwise_attention(module, query, key, value, mask, scaling=dim ** -0.5)
    step_query = tensors(4, 1, heads)
    step_key = torch.cat([key, tensors(4, 1, kv_heads)], dim=2)
    step_value = torch.cat([value, tensors(4, 1, kv_heads)], dim=2)
    step_mask = torch.cat([_causal_padded_mask(lengths, total)[:, :, -1:],
                           torch.ones(4, 1, 1, 1, dtype=torch.bool)], dim=3)
    step, _ = tensor_ops.rowwise_attention(module, step_query, step_key, step_value, step_mask,
                                                scaling=dim ** -0.5)
    for row, length in enumerate(lengths):
        real = slice(total - length, None)
        alone, _ = tensor_ops.rowwise_attention(
            module, query[row:row + 1, :, real], key[row:row + 1, :, real], value[row:row + 1, :, real], None,
            scaling=dim ** -0.5)
        assert torch.equal(output[row, real], alone[0]), row
        assert not output[row, :total - length].any()  # padded queries: zeros, nothing reads them
        decoded, _ = tensor_ops.rowwise_attention(
            module, step_query[row:row + 1], step_key[row:row + 1, :, total - length:],
            step_value[row:row + 1, :, total - length:], None, scaling=dim ** -0.5)
        assert torch.equal(step[row], decoded[0]), row


def test_the_tiny_models_goldens_do_not_depend_on_the_batch_shape(tiny):
    with on_policy(tiny, Policy.BATCH_INVARIANT):
        identical_under_every_shape(tiny, ("1x32", "4x32", "2x48", "8x64", "3x40", "16x32"), 8)
    # the negative control: the previous kernels give a batched prompt other bits than the prompt alone
    with on_policy(tiny, Policy.ONEDNN_AVX2):
        previous = {shape: generations_at(LLMModel(tiny, GenerationSettings(BatchShape.parse(shape), 8, 0)),
                                        shape) for shape in ("1x32", "4x32")}
    assert [g.step_hashes for g in previous["4x32"]] != [g.step_hashes for g in previous["1x32"]]
    assert input_changes(previous["1x32"][0], previous["4x32"][0])  # the shape stays part of those goldens


def test_batch_invariant_kernels_put_the_model_back(tiny):
    model = tiny.engine.model
    before = model.config._attn_implementation
    with Kernels(Policy.BATCH_INVARIANT).routed(model) as routed:
        assert routed > 0
        assert model.config._attn_implementation == chosen_kernels.ATTENTION
    assert model.config._attn_implementation == before
    assert all("forward" not in vars(module) for module in model.modules())


def test_the_default_load_runs_the_batch_invariant_kernels_and_false_the_previous_ones():
    """Unset (None), the setting chooses the batch-invariant kernels wherever they run; false keeps the
    previous kernels; where they do not run (native numerics) the default falls back silently and true
    is an error."""
    default = engines.load("builtin:tiny", dtype="float32", device="cpu")
    assert default.engine.kernels.policy is Policy.BATCH_INVARIANT
    previous = engines.load("builtin:tiny", dtype="float32", device="cpu", batch_invariant=False)
    assert previous.engine.kernels.policy is Policy.ONEDNN_AVX2
    assert why_not_batch_invariant(numerics.profile("portable"), "float32", "cpu") == ""
    assert "float32, not bfloat16" in why_not_batch_invariant(numerics.profile("portable"), "bfloat16", "cpu")
    assert "cpu numerics 'native'" in why_not_batch_invariant(numerics.profile("native"), "float32", "cpu")
    native = {"profile": numerics.profile("native"), "in_force": {"mkl_cbwr": "OFF"}, "dtype": "float32",
              "device": "cpu"}
    assert Kernels.choose(**native, batch_invariant=None).policy is Policy.LINEAR
    with pytest.raises(ConfigurationError, match="batch-invariant kernels are not available here"):
        Kernels.choose(**native, batch_invariant=True)
