"""Bad settings in pytest runs: a bad ini or command-line value (the tolerance's too) is a usage error
naming it, a marker's bad argument fails its test with the range, a missing model or a pickle
checkpoint is named, a path option needs an equals sign, and every option pytest shows is declared
in the tables."""

import re

import pytest

from pytest_llmdeterminism.run.options import FLAGS, SETTINGS
from tests.helpers.projects import usage_error


@pytest.mark.parametrize(
    ("ini", "expected"),
    [
        ("llm_batch_shape = 4by64", "llm_batch_shape = '4by64': expected 'BxL'*for example '4x64'"),
        ("llm_dtype = fp32", "llm_dtype = 'fp32': expected one of float32, bfloat16, float16*"),
        ("llm_device = gpu", "llm_device = 'gpu': expected auto, cpu, mps, cuda or cuda:N*"),
        ("llm_seed = abc", "llm_seed = 'abc': expected an integer from 0 to 2**63 - 1*"),
        (f"llm_seed = {2**80}", f"llm_seed = '{2**80}': expected an integer from 0 to 2**63 - 1 "
                                "(9223372036854775807: the largest seed torch, numpy and OpenAI-compatible "
                                "servers all take), e.g. '0'"),
        ("llm_seed = -1", "llm_seed = '-1': expected an integer from 0 to 2**63 - 1*"),
        ("llm_max_new_tokens = 0", "llm_max_new_tokens = '0': expected an integer >= 1*"),
    ],
)
def test_bad_ini_value_is_a_usage_error(pytester, ini, expected):
    usage_error(pytester, ini).stderr.fnmatch_lines([f"ERROR: {expected}"])


def test_bad_ini_tolerance_is_a_usage_error(pytester):
    result = usage_error(pytester, "llm_tolerance = fuzzy")
    result.stderr.fnmatch_lines(
        ["ERROR: llm_tolerance = 'fuzzy': expected one of exact, tokens, close, near_tie*"])


def test_a_seed_beyond_what_torch_takes_is_refused_before_any_test_runs(pytester):
    result = usage_error(pytester, "llm_batch_shape = 4x64", f"--llm-seed={2**64}")
    result.stderr.fnmatch_lines([f"ERROR: llm_seed = '{2**64}': expected an integer from 0 to 2**63 - 1 *"])
    assert "Overflow" not in result.stdout.str() + result.stderr.str()


def test_a_marker_seed_too_large_fails_its_test_with_the_range_not_torchs_overflow(suite):
    suite.makepyfile(f"""
        from pytest_llmdeterminism import deterministic

        @deterministic(seed={2**80})
        def test_x(llm_model):
            llm_model.generate("The sky is")
        """)
    result = suite.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*@deterministic(seed=...) = '{2**80}': expected an integer from 0 to "
                                 "2**63 - 1*"])
    assert "Overflow" not in result.stdout.str()


def test_cli_overrides_ini_and_is_validated(pytester):
    result = usage_error(pytester, "llm_batch_shape = 4x64", "--llm-batch-shape", "2by8")
    result.stderr.fnmatch_lines(["ERROR: llm_batch_shape = '2by8'*"])


def test_update_flag_with_a_path_after_it_explains(pytester):
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest("--llm-golden-update", "tests/")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*expected 'all' or 'new', got 'tests/'*--llm-golden-update=all PATH*"])


def test_no_model_configured_names_the_setting(pytester):
    pytester.makepyfile("def test_x(llm_model): pass")
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([("*llm_model: no model configured*--llm-model=builtin:tiny "
                                  "(pytest.ini: llm_model = builtin:tiny; "
                                  "pyproject.toml: llm_model = \"builtin:tiny\")*")])


@pytest.mark.parametrize(("spec", "message"), [
    ("HuggingFaceTB/SmolLM2-135M", "*cannot load llm_model*no local folder or .gguf file is named*Hugging "
                                   "Face cache*never downloads*`hf download HuggingFaceTB/SmolLM2-135M`*"),
    ("models/SmolLM2", "*cannot load llm_model*no local folder*never downloads*"),
    ("llamacpp:", "*llm_model = 'llamacpp:': names no model after the engine prefix*"),
])
def test_missing_model_path_says_nothing_is_downloaded(pytester, hub_cache, spec, message):
    pytester.makeini(f"[pytest]\nllm_model = {spec}\n")
    pytester.makepyfile("def test_x(llm_model): pass")
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([message])


def test_pickle_checkpoint_is_refused(pytester):
    folder = pytester.mkdir("ckpt")
    (folder / "config.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"not really a pickle")
    pytester.makeini("[pytest]\nllm_model = ckpt\n")
    pytester.makepyfile("def test_x(llm_model): pass")
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([("*holds pickle weights (pytorch_model.bin), which can run code when loaded "
                                  "and are refused*")])


def test_bad_marker_argument_names_it(suite):
    suite.makepyfile(
        """
        from pytest_llmdeterminism import deterministic

        @deterministic(temperature=0.5)
        def test_x(llm_model):
            pass
        """
    )
    result = suite.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*@deterministic(temperature=...)*unknown argument; accepted: batch_shape, "
                                 "concurrency, "
                                 "max_new_tokens, seed, tolerance*"])


def test_path_options_need_an_equals_sign(pytester, tmp_path):
    result = usage_error(pytester, "llm_batch_shape = 4x32", "--llm-model", str(tmp_path))
    result.stderr.fnmatch_lines(
        [f"ERROR: --llm-model = '{tmp_path}': write --llm-model={tmp_path} (with '=')*"])


def test_every_option_pytest_shows_is_declared_in_the_tables(pytester):
    """The tables are the one declaration: the options reference is generated from them, and a
    mistyped option is matched against them."""
    shown = pytester.runpytest("--help").stdout.str()
    assert set(re.findall(r"--llm-[a-z-]+[a-z]", shown)) == set(FLAGS)
    assert all(setting.ini in shown for setting in SETTINGS)
