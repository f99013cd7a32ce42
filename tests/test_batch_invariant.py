"""Batch-invariant kernels (compute/kernels.py, tensor_ops.py): a row's bits do not depend on its batch.

Per op (linears, attention) and for the whole model: the same prompt alone and unpadded, or batched
with others at other shapes, gives the same logit hashes; the default kernels are the negative
control (they do not). The suite pins portable numerics for itself (pyproject.toml).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from pytest_llmdeterminism import ConfigurationError, engines
from pytest_llmdeterminism.compare import Verdict, compare, input_changes
from pytest_llmdeterminism.compute import fixed_order, numerics, tensor_ops
from pytest_llmdeterminism.compute import kernels as chosen_kernels
from pytest_llmdeterminism.compute.kernels import Kernels, Policy, why_not_batch_invariant
from pytest_llmdeterminism.engines.loaded import LoadedModel
from pytest_llmdeterminism.generation import Generation
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

from . import sessions

ROOT = Path(__file__).resolve().parent.parent
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
        alone = tensor_ops.invariant_linear(row, weight, bias)
        for rows in (2, 3, 5, 8, 17, 64):
            batch = torch.randn(rows, in_features, generator=generator)
            batch[rows // 2] = row
            assert torch.equal(tensor_ops.invariant_linear(batch, weight, bias)[rows // 2], alone[0]), \
                (count, rows)
        found[count] = alone
    assert all(torch.equal(found[1], other) for other in found.values()), "the thread count changed the bits"
    torch.testing.assert_close(found[1], torch.nn.functional.linear(row, weight, bias))


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
def test_a_decode_steps_larger_products_are_each_onednns_one_row_product(out_features, in_features, threads,
                                                                         tmp_path_factory):
    """The portable decode kernel for products of at least ``ONEDNN_MIN_PRODUCT`` (``onednn_rows_linear``):
    a row's bits among 1 to 63 companions, at 1, 2 and 4 threads, on oneDNN and on the fixed-order
    kernel, are the previous kernels' for that row alone (oneDNN's one-row product)."""
    fixed, _ = fixed_order.build(tmp_path_factory.mktemp("kernel"))
    generator = torch.Generator().manual_seed(out_features * in_features + 1)
    weight = torch.randn(out_features, in_features, generator=generator) / in_features ** 0.5
    bias = torch.randn(out_features, generator=generator)
    row = torch.randn(1, 1, in_features, generator=generator)  # (rows, positions, features) as in decode
    previous = tensor_ops.onednn_linear(row, weight, bias)
    for count in (1, 2, 4):
        threads(count)
        for kernel in (None, fixed):
            alone = tensor_ops.onednn_rows_linear(row, weight, bias, kernel)
            assert torch.equal(alone, previous), (count, kernel)
            for rows in (2, 3, 8, 17, 64):
                batch = torch.randn(rows, 1, in_features, generator=generator)
                batch[rows // 2] = row[0]
                assert torch.equal(tensor_ops.onednn_rows_linear(batch, weight, bias, kernel)[rows // 2],
                                   previous[0]), (count, kernel, rows)
    if fixed is not None:  # every one-row shape the fixed-order kernel ran was checked against oneDNN
        assert fixed.checked and all(fixed.checked.values()), fixed.checked


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
    with kernels(tiny, Policy.BATCH_INVARIANT):
        alone, batched = (_generations(LLMModel(tiny, GenerationSettings(BatchShape.parse(shape), 5, 0)),
                                       shape) for shape in ("1x32", "4x32"))
        assert [g.logit_hashes for g in alone] == [g.logit_hashes for g in batched]
        cached = LLMModel(tiny, GenerationSettings(BatchShape.parse("4x32"), 5, 0)).generate(PROMPTS)
        uncached = LLMModel(tiny, GenerationSettings(BatchShape.parse("4x32"), 5, 0)).generate(
            PROMPTS, use_cache=False)
        alone_uncached = [LLMModel(tiny, GenerationSettings(BatchShape.parse("1x32"), 5, 0)).generate(
            [prompt], use_cache=False)[0] for prompt in PROMPTS]
    assert [g.logit_hashes for g in uncached] == [g.logit_hashes for g in alone_uncached]
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


def _generations(llm: LLMModel, shape: str) -> list[Generation]:
    if shape.startswith("1x"):
        return [llm.generate([prompt])[0] for prompt in PROMPTS]  # each alone, unpadded
    return llm.generate(PROMPTS)


def _identical_under_every_shape(loaded: LoadedModel, shapes: tuple[str, ...], tokens: int) -> None:
    """Generations at the first shape are the goldens; every other shape reads IDENTICAL against them,
    the shape only informational."""
    found = {shape: _generations(LLMModel(loaded, GenerationSettings(BatchShape.parse(shape), tokens, 0)),
                                 shape) for shape in shapes}
    for shape in shapes[1:]:
        for golden, now in zip(found[shapes[0]], found[shape], strict=True):
            assert input_changes(golden, now) == (), shape
            assert compare(golden, now).verdict is Verdict.IDENTICAL, (shape, golden.prompt)


@contextmanager
def kernels(loaded: LoadedModel, chosen: Policy) -> Iterator[None]:
    before = loaded.engine.kernels
    # the fingerprint names the kernels: computed again
    chosen_kernels = dataclasses.replace(before, policy=chosen)
    loaded.engine.kernels, loaded.static_fingerprint, loaded.probed = chosen_kernels, None, {}
    try:
        yield
    finally:
        loaded.engine.kernels, loaded.static_fingerprint, loaded.probed = before, None, {}


def test_the_tiny_models_goldens_do_not_depend_on_the_batch_shape(tiny):
    with kernels(tiny, Policy.BATCH_INVARIANT):
        _identical_under_every_shape(tiny, ("1x32", "4x32", "2x48", "8x64", "3x40", "16x32"), 8)
    # the negative control: the previous kernels give a batched prompt other bits than the prompt alone
    with kernels(tiny, Policy.ONEDNN_AVX2):
        previous = {shape: _generations(LLMModel(tiny, GenerationSettings(BatchShape.parse(shape), 8, 0)),
                                        shape) for shape in ("1x32", "4x32")}
    assert [g.logit_hashes for g in previous["4x32"]] != [g.logit_hashes for g in previous["1x32"]]
    assert input_changes(previous["1x32"][0], previous["4x32"][0])  # the shape stays part of those goldens


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


def test_smollm2s_goldens_do_not_depend_on_the_batch_shape(smollm2_gguf):
    """The real model with default settings: recorded alone (one call per prompt), IDENTICAL batched at
    four other shapes."""
    loaded = engines.load(str(smollm2_gguf), dtype="float32", device="cpu")  # the default kernels
    assert loaded.engine.kernels.policy is Policy.BATCH_INVARIANT
    _identical_under_every_shape(loaded, ("1x32", "4x32", "2x48", "8x64", "3x40"), 6)


def test_batch_invariant_kernels_put_the_model_back(tiny):
    model = tiny.engine.model
    before = model.config._attn_implementation
    with Kernels(Policy.BATCH_INVARIANT).routed(model) as routed:
        assert routed > 0
        assert model.config._attn_implementation == chosen_kernels.ATTENTION
    assert model.config._attn_implementation == before
    assert all("forward" not in vars(module) for module in model.modules())


@pytest.mark.parametrize("numerics, setting, generation", [
    ("portable", (), "cpu-onednn-avx2-rowwise-3"),  # default settings: no llm_batch_invariant
    ("compatible", ("--llm-batch-invariant=true",), "cpu-mkl-compatible-tiles32-rowwise-1")],
    ids=["portable-default", "compatible-true"])
@pytest.mark.subprocess
def test_the_example_suites_goldens_recorded_at_one_shape_pass_at_four_others_and_a_defect_fails(
        tmp_path, numerics, setting, generation):
    """The batch-invariant kernels end to end, under portable numerics (oneDNN for the prefill) with
    default settings and compatible ones (MKL tiles) with llm_batch_invariant = true: recorded at 4x32,
    the example suite reads IDENTICAL at 1x32, 2x48, 8x64 and 3x40; a planted defect is a REGRESSION
    there; a run on the previous kernels (false) is another environment and says how to compare
    exactly again."""
    for name in ("pytest.ini", "test_tiny_model.py"):
        shutil.copy(ROOT / "examples" / name, tmp_path / name)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    options = ["-p", "no:cacheprovider", "-p", "no:randomly", *setting, f"--llm-cpu-numerics={numerics}"]

    def child(*runs: tuple[str, ...]) -> list[tuple[int, str]]:
        """The runs as sessions of one child Python (tests/sessions.py): each one's exit status and output."""
        command = sessions.command([sys.executable], [(tmp_path, [*options, *args]) for args in runs])
        run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
                             env=env)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        outputs, codes = sessions.split(run.stdout)
        return list(zip(codes, outputs, strict=True))

    [(code, recorded)] = child(("--llm-golden-update",))  # a process of its own
    assert code == 0, recorded[-3000:]
    assert "golden checks: 9 recorded" in recorded
    assert "(verified at the first generation, against another shape)" in recorded
    golden = (tmp_path / "__golden__" / "test_tiny_model.json").read_bytes()
    assert f'"batch_invariant": "{generation}"'.encode() in golden

    # the checks, in one process of their own
    checks = {shape: ("--llm-tolerance=exact", f"--llm-batch-shape={shape}")
              for shape in ("1x32", "2x48", "8x64", "3x40")}
    checks["defect"] = ("--llm-batch-shape=2x48", "--llm-plant-defect")
    checks["default kernels"] = ("--llm-batch-invariant=false",)  # at the recorded shape: another environment
    results = dict(zip(checks, child(*checks.values()), strict=True))
    for shape in ("1x32", "2x48", "8x64", "3x40"):
        code, output = results[shape]
        assert code == 0, (shape, output[-3000:])
        assert "golden checks: 9 IDENTICAL" in output, shape
    code, output = results["defect"]
    assert code == 1 and "REGRESSION" in output, output[-3000:]
    assert "INPUT_CHANGED" not in output  # the shape is not what it reports
    code, output = results["default kernels"]
    assert code == 0, output[-3000:]
    assert "golden checks: 9 LOGIT_DRIFT" in output
    assert "compare exactly again with --llm-batch-invariant=true" in output
    assert (tmp_path / "__golden__" / "test_tiny_model.json").read_bytes() == golden


@pytest.mark.parametrize("ini, why", [
    ("llm_batch_invariant = yes", "expected true or false"),
    ("llm_batch_invariant = true\nllm_cpu_numerics = native",
     "batch-invariant kernels are not available here: they run under portable or compatible numerics on "
     "x86-64 or arm64"),
    ("llm_batch_invariant = true\nllm_dtype = bfloat16", "they run float32, not bfloat16"),
])
@pytest.mark.subprocess
def test_the_setting_says_where_it_cannot_hold(suite, ini, why):
    suite.makeini(f"[pytest]\nllm_model = builtin:tiny\nllm_batch_shape = 4x32\n{ini}\n")
    suite.makepyfile("""
        import pytest

        @pytest.mark.deterministic
        def test_one(llm_model):
            llm_model.generate("hello")
    """)
    result = suite.runpytest_subprocess("-p", "no:randomly")
    assert result.ret != 0
    assert why in result.stdout.str() + result.stderr.str()


def test_by_default_goldens_of_the_previous_kernels_are_judged_across_environments_and_re_recorded_once(
        suite):
    """Default settings (no llm_batch_invariant line): goldens recorded on the previous kernels
    (``false``) read as a numerics change, tokens judged, passing as LOGIT_DRIFT and never rewritten by
    a plain update; the summary says how to re-record once, after which the goldens read IDENTICAL at
    four other shapes; the session's probe checked a second shape."""
    suite.makepyfile(test_prompts="""
        from pytest_llmdeterminism import deterministic

        @deterministic
        def test_prompts(llm_model, golden_tokens):
            prompts = ["Count: one,", "The colour of the sky is", "def add(a, b):"]
            for prompt, result in zip(prompts, llm_model.generate(prompts), strict=True):
                golden_tokens.check(result, name=prompt)
    """)
    golden = suite.path / "__golden__" / "test_prompts.json"
    suite.runpytest("--llm-golden-update", "--llm-batch-invariant=false").assert_outcomes(passed=1)
    previous = golden.read_bytes()
    assert b'"batch_invariant"' not in previous

    for update in ((), ("--llm-golden-update",)):  # a check, then a plain update: judged, not rewritten
        result = suite.runpytest(*update)
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines([
            "golden checks: 3 LOGIT_DRIFT",
            "*verified at 4x32 (row 0 vs row 3, and against 1x*",
            "compared across environments: batch_invariant None → 'cpu-onednn-avx2-rowwise-3'; *the golden "
            "was computed on the previous kernels (shape-dependent), before batch-invariant kernels became "
            "the default: re-record once with --llm-golden-update --llm-tolerance=exact*or keep the "
            "previous kernels with --llm-batch-invariant=false*"])
        assert golden.read_bytes() == previous

    suite.runpytest("--llm-golden-update", "--llm-tolerance=exact").assert_outcomes(passed=1)  # once
    assert b'"batch_invariant": "cpu-onednn-avx2-rowwise-3"' in golden.read_bytes()
    for shape in ("4x32", "1x32", "2x48", "8x64", "3x40"):
        result = suite.runpytest(f"--llm-batch-shape={shape}", "--llm-tolerance=exact")
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines(["golden checks: 3 IDENTICAL"])
