"""Batch-invariant kernels in pytest runs of the tiny model: the example suite's goldens recorded at one
shape pass at four others and a planted defect fails; ``llm_batch_invariant`` says where it cannot
hold; by default, goldens of the previous kernels are judged across environments and re-recorded once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT, sessions


@pytest.mark.parametrize("numerics, setting, generation", [
    ("portable", (), "cpu-onednn-avx2-canonical-4"),  # default settings: no llm_batch_invariant
    ("compatible", ("--llm-batch-invariant=true",), "cpu-mkl-compatible-tiles32-canonical-2")],
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
            "compared across environments: batch_invariant None → 'cpu-onednn-avx2-canonical-4'; *the golden "
            "was computed on the previous kernels (shape-dependent), before batch-invariant kernels became "
            "the default: re-record once with --llm-golden-update --llm-tolerance=exact*or keep the "
            "previous kernels with --llm-batch-invariant=false*"])
        assert golden.read_bytes() == previous

    suite.runpytest("--llm-golden-update", "--llm-tolerance=exact").assert_outcomes(passed=1)  # once
    assert b'"batch_invariant": "cpu-onednn-avx2-canonical-4"' in golden.read_bytes()
    for shape in ("4x32", "1x32", "2x48", "8x64", "3x40"):
        result = suite.runpytest(f"--llm-batch-shape={shape}", "--llm-tolerance=exact")
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines(["golden checks: 3 IDENTICAL"])
