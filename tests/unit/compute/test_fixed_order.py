"""The fixed-order kernel for oneDNN's products (compute/fixed_order.py): the same bits as oneDNN's AVX2
GEMM (its one-row kernel and its GEMM), each shape checked once in the process, oneDNN wherever the
kernel cannot run.

The suite pins portable numerics for itself (pyproject.toml), so oneDNN runs capped at AVX2 here.
tests/emulated/test_cross_cpu.py checks the kernel's bits under emulated CPUs of the other vendor.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import re
import shlex
import shutil
import subprocess

import pytest
import torch

from pytest_llmdeterminism import engines
from pytest_llmdeterminism.compute import fixed_order, tensor_ops
from pytest_llmdeterminism.compute.kernels import Policy
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

# SmolLM2-135M's products (query/output, key/value, gate/up, down: two blocks of input features),
# three blocks of input features, a ragged block, and shapes that fill no vector.
SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (512, 3072), (1000, 1100), (50, 7)]


# A shared object with the kernel's entry point that computes something else: the code a swap plants.
WRONG_KERNEL = """
int chain_linear(const float *x, const float *w, const float *bias, float *y, int rows, int K, int out,
                 int kblock, int threads) {
    for (long i = 0; i < (long)rows * out; i++) y[i] = 42.0f;
    return 0;
}
"""


@pytest.fixture
def fresh_kernel(kernels_folder):
    """The kernel with no shape checked yet (the module's ``kernel`` keeps its checks)."""
    built, why = fixed_order.build(kernels_folder)
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
                    expected = tensor_ops.onednn_linear(x, weight, b)
                    assert torch.equal(_bits(kernel._run(x, weight, b, rows, count)), _bits(expected)), \
                        (count, rows, b is not None)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("out_features, in_features", [*SHAPES, (49152, 576)])
def test_copies_of_one_row_are_computed_once_with_the_bits_of_several_rows(fresh_kernel, out_features,
                                                                         in_features):
    """A lone row as a pair (the batch-invariant LM head in decode: copies of one row, stride 0) has
    the bits of oneDNN's product of two or more rows, computed once with the lanes over outputs."""
    kernel = fresh_kernel

    def not_by_rows(*args):
        raise AssertionError("copies of one row went through the kernel of several rows")

    kernel._function = not_by_rows
    generator = torch.Generator().manual_seed(out_features * in_features)
    weight = torch.randn(out_features, in_features, generator=generator) / in_features ** 0.5
    bias = torch.randn(out_features, generator=generator)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 4):
            torch.set_num_threads(count)
            for rows in (2, 3):
                x = torch.randn(1, in_features, generator=generator).expand(rows, in_features)
                for b in (None, bias):
                    expected = tensor_ops.onednn_linear(x.contiguous(), weight, b)
                    assert not torch.equal(_bits(expected[0]),
                                           _bits(tensor_ops.onednn_linear(x[:1], weight, b)[0])) \
                        or in_features < 8, "the order of several rows is not the one-row kernel's"
                    got = kernel._run(x, weight, b, rows, count)
                    assert got.shape == (rows, out_features) and got.is_contiguous()
                    assert torch.equal(_bits(got), _bits(expected)), (count, rows, b is not None)
    finally:
        torch.set_num_threads(threads)


def test_each_shape_is_checked_on_its_first_two_products_then_on_a_sample(fresh_kernel):
    kernel = fresh_kernel
    weight, x = torch.randn(576, 576), torch.randn(1, 4, 576)
    calls = []

    def reference(*args):
        calls.append(args[0].shape)
        return tensor_ops.onednn_linear(*args)

    threads = torch.get_num_threads()
    for rows in (1, 4):
        count = len(calls)
        first = kernel.linear(x[:, :rows], weight, None, reference)
        assert calls[-1] == torch.Size([1, rows, 576])
        assert kernel.checked[576, 576, rows, False, threads] is True
        second = kernel.linear(x[:, :rows], weight, None, reference)
        assert len(calls) == count + 2, "the second product is checked too"
        count = len(calls)
        again = kernel.linear(x[:, :rows], weight, None, reference)
        assert len(calls) == count, "the third product runs on the kernel alone"
        assert torch.equal(_bits(first), _bits(again)) and torch.equal(_bits(second), _bits(again))
        assert again.shape == (1, rows, 576)
    before = len(calls)
    products = 3000
    for _ in range(products):
        kernel.linear(x, weight, None, reference)
    checks = len(calls) - before
    # the gaps double 1, 2, 4, ... 64, then are drawn from 32..95: about one product in 64 is checked
    every = fixed_order.RECHECK_EVERY
    assert products / (1.5 * every) <= checks <= products / (0.5 * every) + 8, checks
    assert kernel.checked[576, 576, 4, False, threads] is True


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


def test_a_kernel_right_on_its_first_product_and_wrong_on_the_second_is_caught_and_never_returned(
        fresh_kernel, monkeypatch):
    kernel, run, products = fresh_kernel, fresh_kernel._run, []

    def wrong_from_the_second(*args):
        y = run(*args)
        products.append(y)
        if len(products) >= 2:
            y.view(-1)[0] = torch.nextafter(y.view(-1)[0], torch.tensor(float("inf")))  # one ulp off
        return y

    monkeypatch.setattr(kernel, "_run", wrong_from_the_second)
    weight, x = torch.randn(576, 576), torch.randn(4, 576)
    expected = tensor_ops.onednn_linear(x, weight, None)
    for _ in range(5):
        assert torch.equal(_bits(kernel.linear(x, weight, None, tensor_ops.onednn_linear)), _bits(expected))
    assert kernel.checked[576, 576, 4, False, torch.get_num_threads()] is False
    assert len(products) == 2, "a shape found wrong runs on the reference alone"


def test_a_kernel_that_goes_wrong_later_is_caught_by_a_sampled_check(fresh_kernel, monkeypatch):
    """Past the first products only a sample is checked: a kernel that goes wrong stops being used at
    the next check, and every product from then on is the reference's."""
    kernel, run, products = fresh_kernel, fresh_kernel._run, []

    def wrong_from_the_fortieth(*args):
        y = run(*args)
        products.append(y)
        if len(products) >= 40:
            y.view(-1)[-1] = torch.nextafter(y.view(-1)[-1], torch.tensor(float("-inf")))
        return y

    monkeypatch.setattr(kernel, "_run", wrong_from_the_fortieth)
    weight, x = torch.randn(192, 576), torch.randn(3, 576)
    expected = _bits(tensor_ops.onednn_linear(x, weight, None))
    returned = [torch.equal(_bits(kernel.linear(x, weight, None, tensor_ops.onednn_linear)), expected)
                for _ in range(300)]
    assert kernel.checked[192, 576, 3, False, torch.get_num_threads()] is False
    caught = len(products)  # the product whose check found it: the kernel ran no more
    assert 40 <= caught < 40 + 2 * fixed_order.RECHECK_EVERY
    assert all(returned[:39]) and all(returned[caught - 1:]), "the product found wrong was not returned"


@pytest.mark.parametrize("case", [
    "x's last dimension is not the input features", "a bias of the wrong length",
    "a bias of one element (broadcast)", "a bias of two dimensions", "a weight on the meta device",
    "a weight that is not contiguous", "a bias that is not contiguous", "a weight of three dimensions",
    "x in float64", "a bias in float64", "no rows", "x requires grad"])
def test_a_call_the_kernel_cannot_take_never_reaches_c_and_does_what_the_reference_does(
        fresh_kernel, monkeypatch, case):
    """Every call's shapes, dtypes, devices and layouts are checked before a pointer goes to C: a wrong
    call raises torch's error (the reference's), as it would without the kernel."""
    weight, bias, x = torch.randn(64, 32), torch.randn(64), torch.randn(3, 32)
    args = {
        "x's last dimension is not the input features": (torch.randn(3, 31), weight, None),
        "a bias of the wrong length": (x, weight, torch.randn(63)),
        "a bias of one element (broadcast)": (x, weight, torch.randn(1)),
        "a bias of two dimensions": (x, weight, bias[None]),
        "a weight on the meta device": (x, torch.empty(64, 32, device="meta"), None),
        "a weight that is not contiguous": (x, torch.randn(32, 64).t(), bias),
        "a bias that is not contiguous": (x, weight, torch.randn(128)[::2]),
        "a weight of three dimensions": (x, torch.randn(2, 64, 32), None),
        "x in float64": (x.double(), weight, None),
        "a bias in float64": (x, weight, bias.double()),
        "no rows": (torch.randn(0, 32), weight, None),
        "x requires grad": (x.clone().requires_grad_(), weight, bias),
    }[case]
    reaching_c, references = [], []
    monkeypatch.setattr(fresh_kernel, "_function", lambda *pointers: reaching_c.append(pointers) or 0)

    def reference(*given):
        references.append(given)
        return tensor_ops.onednn_linear(*given)

    try:
        fresh_kernel.linear(*args, reference)
    except RuntimeError as error:  # torch's own error, from the reference
        with pytest.raises(RuntimeError, match=re.escape(str(error))):
            tensor_ops.onednn_linear(*args)
    assert reaching_c == []
    assert len(references) == 1 and all(a is b for a, b in zip(references[0], args, strict=True))


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
    built, why = fixed_order.build(tmp_path / "kernels")
    assert built is None and "no-such-compiler" in why
    monkeypatch.setenv("CC", "false")
    built, why = fixed_order.build(tmp_path / "kernels")
    assert built is None and why == "false failed (exit status 1)"
    assert not list((tmp_path / "kernels").iterdir()), "a failed build leaves nothing behind"
    monkeypatch.setenv(fixed_order.SWITCH, "0")
    assert fixed_order.build(tmp_path / "kernels") == (None, f"{fixed_order.SWITCH}=0")


def test_a_kernel_built_under_a_permissive_umask_is_loaded(tmp_path):
    """Distributions that give users a group of their own set umask 002: a build must still load."""
    previous = os.umask(0o002)
    try:
        built, why = fixed_order.build(tmp_path / "cache" / "kernels")  # the parent is made too: 0700
    finally:
        os.umask(previous)
    assert built is not None, why


def test_a_kernel_others_could_have_written_is_not_loaded(tmp_path):
    folder = tmp_path / "kernels"
    assert fixed_order.build(folder)[0] is not None
    library = next(folder.iterdir())
    library.chmod(0o777)
    built, why = fixed_order.build(folder)
    assert built is None and f"{library} is not the user's own or others may write it (mode 777)" in why
    library.chmod(0o755)
    folder.chmod(0o777)
    built, why = fixed_order.build(folder)
    assert built is None and f"{folder} is not the user's own" in why
    folder.chmod(0o700)
    assert fixed_order.build(folder)[0] is not None


def test_a_library_swapped_between_its_check_and_its_load_is_not_the_code_that_runs(tmp_path, monkeypatch):
    """The owner, mode and bytes are checked on one open file, and dlopen reads that file: a file put
    in the build's place after the check (by whoever could write the folder) never runs."""
    assert fixed_order.build(tmp_path / "built")[0] is not None
    folder = tmp_path / "kernels"  # a build this process has not loaded (dlopen knows files by name too)
    shutil.copytree(tmp_path / "built", folder)
    (tmp_path / "wrong.c").write_text(WRONG_KERNEL)
    subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / "wrong.c"), "-o", str(tmp_path / "wrong.so")],
                   check=True)
    load = ctypes.CDLL

    def swap_then_load(name, *args, **kwargs):
        for library in folder.glob("chain_linear-*.so"):
            shutil.copy(tmp_path / "wrong.so", tmp_path / "planted.so")  # the user's own, mode 755
            os.replace(tmp_path / "planted.so", library)
        return load(name, *args, **kwargs)

    monkeypatch.setattr(ctypes, "CDLL", swap_then_load)
    built, why = fixed_order.build(folder)
    monkeypatch.setattr(ctypes, "CDLL", load)
    assert built is not None, why
    weight, x = torch.randn(192, 576), torch.randn(4, 576)
    threads = torch.get_num_threads()
    expected = _bits(tensor_ops.onednn_linear(x, weight, None))
    assert torch.equal(_bits(built._run(x, weight, None, 4, threads)), expected), "the checked file runs"
    # the planted bytes do not match the build's name: the next build compiles the kernel again
    again, why = fixed_order.build(folder)
    assert again is not None, why
    assert torch.equal(_bits(again._run(x, weight, None, 4, threads)), expected)


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770])
def test_a_kernel_folder_in_a_folder_others_may_write_is_not_loaded(tmp_path, mode):
    """Whoever may write the kernel folder's parent can rename the user's folder away and put another
    in its place (a sticky bit too, here: the rule is the simple one)."""
    shared = tmp_path / "shared"
    assert fixed_order.build(shared / "kernels")[0] is not None
    shared.chmod(mode)
    try:
        built, why = fixed_order.build(shared / "kernels")
    finally:
        shared.chmod(0o700)
    assert built is None
    assert why == (f"{shared} (the kernel folder's parent) is not the user's own or root's or others may "
                   f"write it (mode {mode:o}): whoever may write it can put another folder in the kernel "
                   "folder's place; the plugin loads no code from it (the products stay on oneDNN): set "
                   f"LLMDET_CACHE_DIR to a private folder, or make it private: chmod go-w {shared}")


def test_a_kernel_reached_through_a_symbolic_link_is_not_loaded(tmp_path):
    assert fixed_order.build(tmp_path / "real")[0] is not None
    (tmp_path / "kernels").symlink_to(tmp_path / "real")
    built, why = fixed_order.build(tmp_path / "kernels")
    assert built is None
    assert why.startswith(f"{tmp_path / 'kernels'} is a symbolic link: the plugin follows no link to code it "
                          "loads; the plugin loads no code from it")


def test_cc_may_be_a_command_line(tmp_path, monkeypatch):
    """CC="ccache gcc" is a compiler behind a wrapper: the build runs it as a command line."""
    wrapper = tmp_path / "wrapper"
    wrapper.write_text('#!/bin/sh\nexec "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", f"{shlex.quote(str(wrapper))} gcc")
    built, why = fixed_order.build(tmp_path / "kernels")
    assert built is not None, why
    monkeypatch.setenv("CC", 'gcc "')
    assert fixed_order.build(tmp_path / "other") == (
        None, "CC='gcc \"' is not a command line (No closing quotation): set CC to a C compiler, e.g. CC=gcc")


def test_a_model_loaded_without_a_compiler_says_so_and_generates_the_same_bits(wide_model, tmp_path,
                                                                               monkeypatch):
    """The kernel is an accelerator: with it and without it, a model's generations are bit for bit
    the same."""
    folder = wide_model
    results = {}
    for compiler in ("gcc", str(tmp_path / "no-such-compiler")):
        monkeypatch.setenv("CC", compiler)
        monkeypatch.setenv("LLMDET_CACHE_DIR", str(tmp_path / f"cache-{len(results)}"))  # nothing built yet
        loaded = engines.load(str(folder), dtype="float32", device="cpu", cpu_numerics="portable",
                              batch_invariant=False)  # the previous kernels (oneDNN's decode steps too)
        assert loaded.engine.kernels.policy is Policy.ONEDNN_AVX2
        llm = LLMModel(loaded, GenerationSettings(BatchShape.parse("4x16"), 8, 0))
        results[compiler] = (llm.generate(["Once upon a time", "The capital of France is", "1 2 3"]),
                             loaded.engine.kernels.fixed_order, loaded.slower)
    (fast, kernel, note), (slow, none, slower) = results.values()
    assert kernel is not None and note == ""
    assert kernel.checked and all(kernel.checked.values()), kernel.checked
    assert {rows for _, _, rows, _, _ in kernel.checked} >= {4, 64}, "decode steps and the prefill"
    assert none is None and "no-such-compiler" in slower
    assert "the same results to the bit, only slower, because" in slower
    for a, b in zip(fast, slow, strict=True):
        assert (a.token_ids, a.step_hashes, a.top_logprobs) == (b.token_ids, b.step_hashes, b.top_logprobs)


def test_batch_invariant_kernels_give_the_same_bits_with_and_without_it(wide_model, tmp_path, monkeypatch):
    """llm_batch_invariant's prefill and LM head run oneDNN with at least two rows: on the kernel too."""
    monkeypatch.setenv("LLMDET_CACHE_DIR", str(tmp_path / "cache"))
    loaded = engines.load(str(wide_model), dtype="float32", device="cpu", cpu_numerics="portable",
                          batch_invariant=True)
    kernels = loaded.engine.kernels
    assert kernels.policy is Policy.BATCH_INVARIANT and kernels.fixed_order is not None
    llm = LLMModel(loaded, GenerationSettings(BatchShape.parse("4x16"), 8, 0))
    prompts = ["Once upon a time", "The capital of France is", "1 2 3"]
    fast = llm.generate(prompts)
    kernel = loaded.engine.kernels.fixed_order
    assert kernel.checked and all(kernel.checked.values()), kernel.checked
    assert 2 in {rows for _, _, rows, _, _ in kernel.checked}, "the LM head's lone row as a pair"
    loaded.engine.kernels = dataclasses.replace(loaded.engine.kernels, fixed_order=None)
    slow = llm.generate(prompts)
    for a, b in zip(fast, slow, strict=True):
        assert (a.token_ids, a.step_hashes, a.top_logprobs) == (b.token_ids, b.step_hashes, b.top_logprobs)


def test_the_cache_folder_made_under_a_group_umask_still_takes_the_kernel(tmp_path, monkeypatch):
    """Under a umask of 002 (Debian's default for a user with a private group) the plugin's cache
    folder is still private, whichever of its parts creates it first: the kernel is not refused."""
    from pytest_llmdeterminism.engines import cached

    monkeypatch.setenv("LLMDET_CACHE_DIR", str(tmp_path / "home" / "cache"))
    (tmp_path / "weights.bin").write_bytes(b"\0" * 64)
    before = os.umask(0o002)
    try:
        cached.file_hash(tmp_path / "weights.bin")  # the fingerprint's hash cache, written first
        built, why = fixed_order.build(cached.cache_dir() / "kernels")
    finally:
        os.umask(before)
    assert built is not None, why
    assert (tmp_path / "home").stat().st_mode & 0o777 == 0o700
    assert cached.cache_dir().stat().st_mode & 0o777 == 0o700
