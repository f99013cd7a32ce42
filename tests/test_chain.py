"""The plugin's own kernel for oneDNN's products (compute/chain.py): the same bits as oneDNN's AVX2
GEMM (its one-row kernel and its GEMM), each shape checked once in the process, oneDNN wherever the
kernel cannot run.

The suite pins portable numerics for itself (pyproject.toml), so oneDNN runs capped at AVX2 here.
tests/test_cross_cpu.py checks the kernel's bits under emulated CPUs of the other vendor.
"""

from __future__ import annotations

import os

import pytest
import torch

from pytest_llmdeterminism import engines
from pytest_llmdeterminism.compute import chain, linears
from pytest_llmdeterminism.compute.linears import LinearKernels
from pytest_llmdeterminism.engines.model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

# SmolLM2-135M's products (query/output, key/value, gate/up, down: two blocks of input features),
# three blocks of input features, a ragged block, and shapes that fill no vector.
SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (512, 3072), (1000, 1100), (50, 7)]


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    built, why = chain.build(tmp_path_factory.mktemp("kernels"))
    assert built is not None, why
    return built


def _bits(tensor):
    return tensor.contiguous().view(torch.int32)


@pytest.mark.parametrize("out_features, in_features", SHAPES)
def test_the_kernel_has_onednns_bits_at_any_row_count_and_thread_count(kernel, out_features, in_features):
    generator = torch.Generator().manual_seed(out_features + in_features)
    weight = torch.randn(out_features, in_features, generator=generator) / in_features ** 0.5
    bias = torch.randn(out_features, generator=generator)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 4):
            torch.set_num_threads(count)
            for rows in (1, 2, 3, 4, 8, 9, 16, 17, 24, 35, 57, 128):
                x = torch.randn(rows, in_features, generator=generator)
                for b in (None, bias):
                    expected = linears.onednn_linear(x, weight, b)
                    assert torch.equal(_bits(kernel._run(x, weight, b, rows, count)), _bits(expected)), \
                        (count, rows, b is not None)
    finally:
        torch.set_num_threads(threads)


def test_each_shape_is_checked_against_onednn_once_then_runs_on_the_kernel(kernel):
    weight, x = torch.randn(576, 576), torch.randn(1, 4, 576)
    calls = []

    def reference(*args):
        calls.append(args[0].shape)
        return linears.onednn_linear(*args)

    threads = torch.get_num_threads()
    for rows in (1, 4):
        first = kernel.linear(x[:, :rows], weight, None, reference)
        assert calls[-1] == torch.Size([1, rows, 576])
        assert kernel.checked[576, 576, rows, False, threads] is True
        count = len(calls)
        again = kernel.linear(x[:, :rows], weight, None, reference)
        assert len(calls) == count, "a checked shape runs on the kernel alone"
        assert torch.equal(_bits(first), _bits(again)) and again.shape == (1, rows, 576)


def test_a_shape_whose_bits_differ_stays_on_the_reference(kernel):
    """A oneDNN that changed its order (another torch) costs the speed, never the bits."""
    weight, x = torch.randn(320, 640), torch.randn(5, 640)
    calls = []

    def another_order(x, w, b):  # F.linear runs MKL here: the same product, other bits
        calls.append(1)
        return torch.nn.functional.linear(x, w, b)

    first = kernel.linear(x, weight, None, another_order)
    assert kernel.checked[320, 640, 5, False, torch.get_num_threads()] is False
    later = kernel.linear(x, weight, None, another_order)
    assert len(calls) == 2
    assert torch.equal(first, torch.nn.functional.linear(x, weight)) and torch.equal(later, first)


def test_other_dtypes_and_layouts_go_to_the_reference(kernel):
    weight = torch.randn(576, 576)
    calls = []

    def reference(x, w, b):
        calls.append(x.dtype)
        return torch.nn.functional.linear(x.float(), w.float(), b)

    kernel.linear(torch.randn(4, 576, dtype=torch.float64), weight.double(), None, reference)
    kernel.linear(torch.randn(4, 576), weight.t().contiguous().t(), None, reference)  # not contiguous
    assert calls == [torch.float64, torch.float32]


def test_without_a_compiler_or_switched_off_the_products_stay_on_onednn_and_say_why(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    built, why = chain.build(tmp_path / "kernels")
    assert built is None and "no-such-compiler" in why
    monkeypatch.setenv("CC", "false")
    built, why = chain.build(tmp_path / "kernels")
    assert built is None and why == "false failed (exit status 1)"
    assert not list((tmp_path / "kernels").iterdir()), "a failed build leaves nothing behind"
    monkeypatch.setenv(chain.SWITCH, "0")
    assert chain.build(tmp_path / "kernels") == (None, f"{chain.SWITCH}=0")


def test_a_kernel_built_under_a_permissive_umask_is_loaded(tmp_path):
    """Distributions that give users a group of their own set umask 002: a build must still load."""
    previous = os.umask(0o002)
    try:
        built, why = chain.build(tmp_path / "kernels")
    finally:
        os.umask(previous)
    assert built is not None, why


def test_a_kernel_others_could_have_written_is_not_loaded(tmp_path):
    folder = tmp_path / "kernels"
    assert chain.build(folder)[0] is not None
    library = next(folder.iterdir())
    library.chmod(0o777)
    built, why = chain.build(folder)
    assert built is None and f"{library} is not the user's own or others may write it (mode 777)" in why
    library.chmod(0o755)
    folder.chmod(0o777)
    built, why = chain.build(folder)
    assert built is None and f"{folder} is not the user's own" in why
    folder.chmod(0o700)
    assert chain.build(folder)[0] is not None


def test_a_model_loaded_without_a_compiler_says_so_and_generates_the_same_bits(wide_model, tmp_path,
                                                                               monkeypatch):
    """The kernel is an accelerator: with it and without it, a model's generations are bit for bit
    the same."""
    folder = wide_model
    results = {}
    for compiler in ("gcc", str(tmp_path / "no-such-compiler")):
        monkeypatch.setenv("CC", compiler)
        monkeypatch.setenv("LLMDET_CACHE_DIR", str(tmp_path / f"cache-{len(results)}"))  # nothing built yet
        loaded = engines.load(str(folder), dtype="float32", device="cpu", cpu_numerics="portable")
        assert loaded.engine.linears is LinearKernels.ONEDNN_AVX2
        llm = LLMModel(loaded, GenerationSettings(BatchShape.parse("4x16"), 8, 0))
        results[compiler] = (llm.generate(["Once upon a time", "The capital of France is", "1 2 3"]),
                             loaded.engine.chain, loaded.slower)
    (fast, kernel, note), (slow, none, slower) = results.values()
    assert kernel is not None and note == ""
    assert kernel.checked and all(kernel.checked.values()), kernel.checked
    assert {rows for _, _, rows, _, _ in kernel.checked} >= {4, 64}, "decode steps and the prefill"
    assert none is None and "no-such-compiler" in slower
    assert "oneDNN's products stay on oneDNN (the same bits, slower)" in slower
    for a, b in zip(fast, slow, strict=True):
        assert (a.token_ids, a.logit_hashes, a.top_logprobs) == (b.token_ids, b.logit_hashes, b.top_logprobs)


def test_smollm2_generates_the_same_bits_on_the_kernel_as_on_onednn(smollm2_gguf, tmp_path, monkeypatch):
    loaded = engines.load(str(smollm2_gguf), dtype="float32", device="cpu", cpu_numerics="portable")
    assert loaded.engine.chain is not None, loaded.slower
    llm = LLMModel(loaded, GenerationSettings(BatchShape.parse("4x32"), 12, 0))
    prompts = ["Once upon a time", "The capital of France is", "def fibonacci(n):"]
    fast = llm.generate(prompts)
    assert loaded.engine.chain.checked and all(loaded.engine.chain.checked.values())
    kernel, loaded.engine.chain = loaded.engine.chain, None
    try:
        slow = llm.generate(prompts)
    finally:
        loaded.engine.chain = kernel
    for a, b in zip(fast, slow, strict=True):
        assert (a.token_ids, a.logit_hashes, a.top_logprobs) == (b.token_ids, b.logit_hashes, b.top_logprobs)


def test_batch_invariant_kernels_give_the_same_bits_with_and_without_it(wide_model, tmp_path, monkeypatch):
    """llm_batch_invariant's prefill and LM head run oneDNN with at least two rows: on the kernel too."""
    monkeypatch.setenv("LLMDET_CACHE_DIR", str(tmp_path / "cache"))
    loaded = engines.load(str(wide_model), dtype="float32", device="cpu", cpu_numerics="portable",
                          batch_invariant=True)
    assert loaded.engine.linears is LinearKernels.BATCH_INVARIANT and loaded.engine.chain is not None
    llm = LLMModel(loaded, GenerationSettings(BatchShape.parse("4x16"), 8, 0))
    prompts = ["Once upon a time", "The capital of France is", "1 2 3"]
    fast = llm.generate(prompts)
    kernel = loaded.engine.chain
    assert kernel.checked and all(kernel.checked.values()), kernel.checked
    assert 2 in {rows for _, _, rows, _, _ in kernel.checked}, "the LM head's lone row as a pair"
    loaded.engine.chain = None
    slow = llm.generate(prompts)
    for a, b in zip(fast, slow, strict=True):
        assert (a.token_ids, a.logit_hashes, a.top_logprobs) == (b.token_ids, b.logit_hashes, b.top_logprobs)
