"""Tolerance profiles: parsing, defaults per device and dtype, and which verdicts each accepts."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_llmdeterminism.errors import ConfigurationError
from pytest_llmdeterminism.judge.compare import Comparison, Divergence, Verdict
from pytest_llmdeterminism.judge.tolerance import (
    Profile,
    ProfileName,
    default_profile,
    parse_profile,
    parse_setting,
)


@pytest.mark.parametrize(("text", "profile"), [
    ("exact", Profile(ProfileName.EXACT)),
    ("tokens", Profile(ProfileName.TOKENS)),
    ("close(atol=1e-3)", Profile(ProfileName.CLOSE, atol=1e-3)),
    ("close", Profile(ProfileName.CLOSE)),
    (" near_tie( margin=0.1 , atol=1e-2 ) ", Profile(ProfileName.NEAR_TIE, atol=1e-2, margin=0.1)),
    ("near_tie(margin=0.2)", Profile(ProfileName.NEAR_TIE, margin=0.2)),
])
def test_profiles_parse_and_print_back(text, profile):
    assert parse_profile(text) == profile
    assert parse_profile(str(profile)) == profile


@pytest.mark.parametrize(("text", "problem"), [
    ("exactly", "expected one of exact, tokens, close, near_tie"),
    ("close(margin=0.1)", "close takes atol; got 'margin'"),
    ("exact(atol=1)", "exact takes no arguments"),
    ("near_tie(margin=-1)", "margin must be a finite number >= 0"),
    ("close(atol=abc)", "atol must be a finite number >= 0"),
    ("near_tie(margin=0.1", "expected one of"),
    # an infinite threshold accepts every flip or every drift: a profile that passes everything
    ("near_tie(margin=inf)", "margin must be a finite number >= 0"),
    ("close(atol=inf)", "atol must be a finite number >= 0"),
    ("near_tie(margin=0.1, atol=1e999)", "atol must be a finite number >= 0"),
    ("close(atol=nan)", "atol must be a finite number >= 0"),
])
def test_bad_profiles_name_the_problem_and_an_example(text, problem):
    with pytest.raises(ConfigurationError, match=r"llm_tolerance = .*" + problem.replace("(", r"\(")) as info:
        parse_profile(text)
    assert "near_tie(margin=0.1, atol=1e-2)" in str(info.value)


@pytest.mark.parametrize(("name", "argument", "value"), [
    ("near_tie", "margin", math.inf), ("close", "atol", math.inf), ("near_tie", "atol", -1e-3),
    ("close", "atol", math.nan), ("close", "atol", "0.1"), ("close", "atol", True),
])
def test_a_profile_built_in_python_refuses_a_threshold_that_is_not_finite_and_non_negative(
        name, argument, value):
    with pytest.raises(ConfigurationError, match=rf"{name}\({argument}=\.\.\.\) = .*: {argument} must be a"):
        Profile(ProfileName(name), **{argument: value})


def test_a_profile_takes_numpy_thresholds_as_plain_floats():
    import numpy as np

    profile = Profile(ProfileName.NEAR_TIE, margin=np.float32(0.5), atol=np.float64(1e-2))
    assert type(profile.margin) is float and type(profile.atol) is float
    assert profile == Profile(ProfileName.NEAR_TIE, margin=0.5, atol=1e-2)


def test_device_mapping_and_defaults():
    setting = parse_setting("cpu: exact, cuda: near_tie(margin=0.2, atol=0.05)")
    assert setting.explicit_for("cpu") == Profile(ProfileName.EXACT)
    assert setting.explicit_for("cuda") == Profile(ProfileName.NEAR_TIE, atol=0.05, margin=0.2)
    assert setting.explicit_for("mps") is None  # unset: the default decides, by environment
    multi_line = parse_setting("\ncpu: tokens\n*: close(atol=0.01)\n")
    assert multi_line.explicit_for("cpu") == Profile(ProfileName.TOKENS)
    assert multi_line.explicit_for("cuda") == Profile(ProfileName.CLOSE, atol=0.01)
    assert default_profile("float32", same_environment=True) == Profile(ProfileName.EXACT)
    cuda_bf16, cuda_fp32 = (default_profile(dtype, same_environment=False)
                            for dtype in ("bfloat16", "float32"))
    assert cuda_bf16.name == cuda_fp32.name == "near_tie"
    assert cuda_bf16.margin > cuda_fp32.margin and cuda_bf16.atol > cuda_fp32.atol
    with pytest.raises(ConfigurationError, match="expected 'device: profile' pairs"):
        parse_setting("gpu: exact")


def _comparison(verdict, delta, golden_margin=0.01, tie_margin=0.05):
    divergence = None
    if verdict in (Verdict.TIE_FLIP, Verdict.REGRESSION):
        divergence = Divergence(3, 1, 2, ((1, -0.6), (2, -0.7)), ((2, -0.6), (1, -0.7)), golden_margin)
    return Comparison(verdict, divergence=divergence, first_hash_step=0, steps_compared=3, total_steps=8,
                      max_logprob_delta=delta, tie_margin=tie_margin)


comparisons = st.builds(
    _comparison,
    st.sampled_from([v for v in Verdict if v is not Verdict.MISSING]),
    st.floats(min_value=0, max_value=5, allow_nan=False),
)
atols = st.floats(min_value=0, max_value=1, allow_nan=False)


@given(comparisons, atols, st.floats(min_value=0, max_value=2, allow_nan=False))
def test_profiles_are_monotone(comparison, atol, margin):
    exact, tokens = Profile(ProfileName.EXACT), Profile(ProfileName.TOKENS)
    close = Profile(ProfileName.CLOSE, atol=atol)
    near_tie = Profile(ProfileName.NEAR_TIE, atol=atol, margin=margin)
    if exact.accepts(comparison):
        assert tokens.accepts(comparison) and close.accepts(comparison) and near_tie.accepts(comparison)
    if close.accepts(comparison):
        assert near_tie.accepts(comparison)
        assert Profile(ProfileName.CLOSE, atol=atol * 2 + 1e-9).accepts(comparison)


@given(st.floats(min_value=0, max_value=5, allow_nan=False))
def test_input_changes_and_regressions_fail_under_every_profile(delta):
    for verdict in (Verdict.INPUT_CHANGED, Verdict.REGRESSION, Verdict.NONDETERMINISTIC):
        comparison = _comparison(verdict, delta)
        for profile in ("exact", "tokens", "close(atol=100)", "near_tie(margin=100, atol=100)"):
            assert not parse_profile(profile).accepts(comparison), (verdict, profile)


def test_what_each_profile_accepts():
    drift, big_drift = _comparison(Verdict.LOGIT_DRIFT, 1e-4), _comparison(Verdict.LOGIT_DRIFT, 0.5)
    flip = _comparison(Verdict.TIE_FLIP, 1e-4)
    assert not Profile(ProfileName.EXACT).accepts(drift)
    assert Profile(ProfileName.TOKENS).accepts(drift) and Profile(ProfileName.TOKENS).accepts(big_drift)
    close = Profile(ProfileName.CLOSE, atol=1e-3)
    assert close.accepts(drift) and not close.accepts(big_drift)
    assert not Profile(ProfileName.CLOSE, atol=1).accepts(flip)
    assert not Profile(ProfileName.TOKENS).accepts(flip)
    assert Profile(ProfileName.NEAR_TIE, atol=1e-3, margin=0.1).accepts(flip)
    assert Profile(ProfileName.CLOSE).accepts(drift, "float32")  # dtype default atol 1e-3
    assert not Profile(ProfileName.CLOSE).accepts(big_drift, "float32")
