"""One-row products split over the threads (engines/gemv.py) give the bits of ``F.linear``.

The suite pins portable numerics for itself (pyproject.toml), so these run under MKL's reproducible
branch, where the plugin splits. tests/test_cross_cpu.py checks the same bits under emulated CPUs.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from pytest_llmdeterminism import engines
from pytest_llmdeterminism.engines import BUILTIN_MODELS, gemv, numerics
from pytest_llmdeterminism.engines.model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

F = torch.nn.functional
# SmolLM2-135M's projections (query/output, gate/up, down, the LM head, cut to 8192 rows) and a
# layer just at the size where the split starts.
SHAPES = [(576, 576), (1536, 576), (576, 1536), (8192, 576), (512, 512)]


@pytest.fixture(autouse=True)
def _reproducible_branch_in_force():
    if numerics.effective()["mkl_cbwr"] != numerics.MKL_REPRODUCIBLE_BRANCH:
        pytest.fail("the suite pins portable numerics for itself (pyproject.toml); MKL's branch in force is "
                    f"{numerics.effective()['mkl_cbwr']!r}")


@pytest.mark.parametrize("out_features, in_features", SHAPES)
@pytest.mark.parametrize("blocks", [2, 4])
def test_a_split_one_row_product_has_the_bits_of_linear(out_features, in_features, blocks):
    generator = torch.Generator().manual_seed(out_features + in_features)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator)
    for shape in ((1, in_features), (1, 1, in_features), (in_features,)):
        x = torch.randn(shape, generator=generator)
        assert torch.equal(gemv.split_linear(x, weight, None, blocks), F.linear(x, weight)), shape
        assert torch.equal(gemv.split_linear(x, weight, bias, blocks), F.linear(x, weight, bias)), shape


def test_the_split_applies_to_large_float32_cpu_weights_over_several_threads_only():
    large = torch.zeros(1024, 256)
    assert gemv.blocks_for(large, 2) == 2 and gemv.blocks_for(large, 4) == 4
    assert gemv.blocks_for(large, 1) == 0  # nothing to spread over
    assert gemv.blocks_for(large, 3) == 0  # 1024 output features do not split in 3 equal blocks
    assert gemv.blocks_for(large.to(torch.bfloat16), 2) == 0  # not MKL's float32 product
    assert gemv.blocks_for(torch.zeros(256, 1024).t(), 2) == 0  # a transposed view: its blocks are not views
    assert gemv.blocks_for(torch.zeros(192, 576), 2) == 0  # below MIN_WEIGHT_ELEMENTS: dispatch costs more


def test_layers_get_their_own_forward_back_and_several_rows_are_left_to_linear():
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 64))
    rows = torch.randn(5, 512)
    with torch.inference_mode():
        expected_rows = model(rows)
        with gemv.one_row_products_split(model) as split:
            assert split == (1 if torch.get_num_threads() >= 2 else 0)  # the 64x1024 layer is too small
            assert torch.equal(model(rows), expected_rows)
    assert all("forward" not in vars(module) for module in model.modules())


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    """The tiny model's tokenizer on a wider random Llama (hidden 1024): layers the split applies to."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("wide")
    tiny = BUILTIN_MODELS["tiny"]
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny / name, folder / name)
    config = AutoConfig.from_pretrained(tiny, local_files_only=True)
    config.update({"hidden_size": 1024, "intermediate_size": 2048, "num_attention_heads": 16,
                   "num_key_value_heads": 4, "head_dim": 64, "num_hidden_layers": 2,
                   "tie_word_embeddings": False})
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def test_the_plugin_splits_under_portable_numerics_and_the_logits_keep_their_bits(wide_model, monkeypatch):
    if torch.get_num_threads() < 2:
        pytest.skip("one torch thread: nothing to split over")
    loaded = engines.load(str(wide_model), dtype="float32", device="cpu", cpu_numerics="portable")
    assert loaded.engine.split_one_row_products
    calls = []
    split_linear = gemv.split_linear
    monkeypatch.setattr(gemv, "split_linear", lambda *args: calls.append(args[3]) or split_linear(*args))
    llm = LLMModel(loaded, GenerationSettings(BatchShape.parse("1x128"), 6, 0))
    prompts = ["Once upon a time", "The capital of France is"]
    split = llm.generate(prompts)
    assert calls, "the default path at batch 1 no longer splits its one-row products"
    loaded.engine.split_one_row_products = False
    calls.clear()
    plain = llm.generate(prompts)
    assert not calls
    for a, b in zip(split, plain, strict=True):
        assert (a.token_ids, a.logit_hashes, a.top_logprobs) == (b.token_ids, b.logit_hashes, b.top_logprobs)
