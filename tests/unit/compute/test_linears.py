"""How linears run under pinned numerics (compute/kernels.py, compute/tensor_ops.py): one-row
products split over the threads give the bits of ``F.linear``; oneDNN's capped GEMM keeps rows
independent of their batch.

The suite pins portable numerics for itself (pyproject.toml), so these run under MKL's reproducible
branch with oneDNN capped at AVX2. tests/emulated/test_cross_cpu.py checks the same bits under emulated CPUs.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pytest_llmdeterminism import engines
from pytest_llmdeterminism.compute import numerics, tensor_ops
from pytest_llmdeterminism.compute.kernels import Kernels, Policy
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

F = torch.nn.functional
# SmolLM2-135M's projections (query/output, gate/up, down, the LM head, cut to 8192 rows) and a
# layer just at the size where the split starts.
SHAPES = [(576, 576), (1536, 576), (576, 1536), (8192, 576), (512, 512)]


@pytest.fixture(autouse=True)
def _portable_numerics_in_force():
    found = numerics.effective()
    if (found["mkl_cbwr"], found["aten_capability"]) != (numerics.MKL_REPRODUCIBLE_BRANCH, "AVX2"):
        pytest.fail("the suite pins portable numerics for itself (pyproject.toml); in force: MKL's branch "
                    f"{found['mkl_cbwr']!r}, ATen's kernels {found['aten_capability']!r}")


@pytest.mark.parametrize("out_features, in_features", SHAPES)
@pytest.mark.parametrize("blocks", [2, 4])
def test_a_split_one_row_product_has_the_bits_of_linear(out_features, in_features, blocks):
    generator = torch.Generator().manual_seed(out_features + in_features)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator)
    for shape in ((1, in_features), (1, 1, in_features), (in_features,)):
        x = torch.randn(shape, generator=generator)
        assert torch.equal(tensor_ops.split_linear(x, weight, None, blocks), F.linear(x, weight)), shape
        assert torch.equal(tensor_ops.split_linear(x, weight, bias, blocks), F.linear(x, weight, bias)), shape


def test_the_split_applies_to_large_float32_cpu_weights_over_several_threads_only():
    large = torch.zeros(1024, 256)
    assert tensor_ops.blocks_for(large, 2) == 2 and tensor_ops.blocks_for(large, 4) == 4
    assert tensor_ops.blocks_for(large, 1) == 0  # nothing to spread over
    assert tensor_ops.blocks_for(large, 3) == 0  # 1024 output features do not split in 3 equal blocks
    assert tensor_ops.blocks_for(large.to(torch.bfloat16), 2) == 0  # not MKL's float32 product
    assert tensor_ops.blocks_for(torch.zeros(256, 1024).t(), 2) == 0  # a transposed view: not views
    assert tensor_ops.blocks_for(torch.zeros(192, 576), 2) == 0  # below MIN_WEIGHT_ELEMENTS: dispatch costs


def test_layers_get_their_own_forward_back_and_several_rows_are_left_to_linear():
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 64))
    rows, row = torch.randn(5, 512), torch.randn(1, 512)
    with torch.inference_mode():
        expected_rows, expected_row = model(rows), model(row)
        with Kernels(Policy.SPLIT_ONE_ROW).routed(model) as routed:
            assert routed == 2
            assert torch.equal(model(rows), expected_rows)
            assert torch.equal(model(row), expected_row)
    assert all("forward" not in vars(module) for module in model.modules())


def kernels_for(mode, in_force):
    """The kernels a float32 model on the CPU gets under ``mode`` with ``in_force`` found."""
    return Kernels.choose(numerics.profile(mode), in_force=in_force, dtype="float32", device="cpu").policy


def test_only_pinned_numerics_route_linears_and_only_float32_ones_on_the_cpu():
    compatible_branch = {"mkl_cbwr": numerics.MKL_REPRODUCIBLE_BRANCH}
    assert kernels_for("portable", compatible_branch) is Policy.ONEDNN_AVX2
    assert kernels_for("compatible", compatible_branch) is Policy.SPLIT_ONE_ROW
    assert kernels_for("native", {"mkl_cbwr": "OFF"}) is Policy.LINEAR
    assert kernels_for("portable", {"mkl_cbwr": None}) is Policy.LINEAR  # arm64: OpenBLAS
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64).to(torch.bfloat16))
    with Kernels(Policy.ONEDNN_AVX2).routed(model) as routed:
        assert routed == 1 and "forward" in vars(model[0]) and "forward" not in vars(model[1])
    with Kernels(Policy.LINEAR).routed(model) as routed:
        assert routed == 0


def test_portable_leaves_small_products_to_mkl_and_sends_large_ones_to_onednn(monkeypatch):
    """oneDNN's fixed cost per call outweighs small products; which kernel runs depends on the shape
    alone (rows x in x out features), so it is the same on every CPU."""
    calls = []
    monkeypatch.setattr(tensor_ops, "onednn_linear",
                        lambda x, w, b: calls.append(tuple(x.shape)) or F.linear(x, w, b))
    splits = []
    monkeypatch.setattr(tensor_ops, "split_linear",
                        lambda x, w, b, blocks: splits.append(blocks) or F.linear(x, w, b))
    model = torch.nn.Sequential(torch.nn.Linear(576, 576))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.inference_mode(), Kernels(Policy.ONEDNN_AVX2).routed(model):
            model(torch.randn(1, 1, 576))  # 331,776 multiply-adds: MKL's reproducible branch, split in two
            model(torch.randn(1, 2, 576))  # 663,552: oneDNN
    finally:
        torch.set_num_threads(threads)
    assert 576 * 576 < tensor_ops.ONEDNN_MIN_PRODUCT <= 2 * 576 * 576
    assert calls == [(1, 2, 576)]
    assert splits == [2]


@pytest.mark.parametrize("out_features, in_features", SHAPES)
def test_onednn_rows_do_not_depend_on_their_companions(out_features, in_features):
    """Portable numerics run the fixed batch shape through oneDNN: a prompt's bits must not depend on
    the rows beside it, and identical rows must give identical bits."""
    generator = torch.Generator().manual_seed(out_features * in_features)
    weight = torch.randn(out_features, in_features, generator=generator) / in_features ** 0.5
    bias = torch.randn(out_features, generator=generator)
    row = torch.randn(in_features, generator=generator)
    for rows in (2, 4, 7, 128):
        same = tensor_ops.onednn_linear(row.expand(rows, in_features).contiguous(), weight, bias)
        assert (same == same[0]).all(), rows
        mixed = torch.randn(rows, in_features, generator=generator)
        mixed[rows // 2] = row
        assert torch.equal(tensor_ops.onednn_linear(mixed, weight, bias)[rows // 2], same[0]), rows
        assert torch.equal(tensor_ops.onednn_linear(mixed.view(1, rows, in_features), weight, bias)[0],
                           tensor_ops.onednn_linear(mixed, weight, bias)), rows
    # close to F.linear: other kernels, the same product
    x = torch.randn(3, in_features, generator=generator)
    torch.testing.assert_close(tensor_ops.onednn_linear(x, weight, bias), F.linear(x, weight, bias))


def test_the_plugin_routes_linears_by_its_numerics_and_the_split_keeps_linears_bits(wide_model, monkeypatch):
    loaded = engines.load(str(wide_model), dtype="float32", device="cpu", cpu_numerics="portable",
                          batch_invariant=False)  # the previous kernels (not the default)
    assert loaded.engine.kernels.policy is Policy.ONEDNN_AVX2
    # oneDNN's products on oneDNN itself, counted (the fixed-order kernel: test_fixed_order.py)
    loaded.engine.kernels = dataclasses.replace(loaded.engine.kernels, fixed_order=None)
    calls: dict[str, int] = {"onednn": 0, "split": 0}

    def counted(name, function):
        def call(*args):
            calls[name] += 1
            return function(*args)
        return call

    monkeypatch.setattr(tensor_ops, "onednn_linear", counted("onednn", tensor_ops.onednn_linear))
    monkeypatch.setattr(tensor_ops, "split_linear", counted("split", tensor_ops.split_linear))
    llm = LLMModel(loaded, GenerationSettings(BatchShape.parse("1x128"), 6, 0))
    prompts = ["Once upon a time", "The capital of France is"]
    splits = torch.get_num_threads() >= 2
    portable = llm.generate(prompts)
    # the key/value projections (256x1024) at one row stay on MKL's reproducible branch, split
    assert calls["onednn"] and bool(calls["split"]) == splits, calls
    with monkeypatch.context() as unsplit:
        unsplit.setattr(tensor_ops, "blocks_for", lambda weight, threads: 0)
        calls.update(onednn=0, split=0)
        whole = llm.generate(prompts)
        assert calls["onednn"] and not calls["split"], calls
    # compatible numerics' route (MKL's reproducible branch is in force here too): the one-row split
    # has the bits of F.linear on the whole model
    results = {}
    for kernels in (Policy.SPLIT_ONE_ROW, Policy.LINEAR):
        loaded.engine.kernels = Kernels(kernels)
        calls.update(onednn=0, split=0)
        results[kernels] = llm.generate(prompts)
        assert not calls["onednn"]
        assert bool(calls["split"]) == (splits and kernels is Policy.SPLIT_ONE_ROW)
    split, plain = results[Policy.SPLIT_ONE_ROW], results[Policy.LINEAR]
    for a, b in [*zip(split, plain, strict=True), *zip(portable, whole, strict=True)]:
        assert (a.token_ids, a.step_hashes, a.top_logprobs) == (b.token_ids, b.step_hashes, b.top_logprobs)
