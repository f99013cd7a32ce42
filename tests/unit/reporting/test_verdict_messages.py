"""How a failure words its verdict (reporting/failure.py, reporting/hints.py): a golden recorded padded
at one row reads as a changed shape with the reason, the cross-environment hint fits the field that
changed, and ``assert_tokens_match`` names the condition that failed (verdicts from real numeric
effects in pytest runs: tests/pytester/test_verdicts.py)."""


import pytest

from tests.helpers import ROOT


def test_a_golden_recorded_padded_at_one_row_reads_as_a_changed_shape_with_the_reason(make_llm, tiny):
    """Goldens of 1xL from before lone prompts ran unpadded: INPUT_CHANGED, saying why, never a drift.
    (Those goldens ran the previous kernels: a padded golden of the batch-invariant ones never existed.)"""
    import dataclasses

    from pytest_llmdeterminism.compute.kernels import Policy
    from pytest_llmdeterminism.judge.compare import Verdict, compare
    from pytest_llmdeterminism.reporting.failure import mismatch
    from tests.helpers.batch_invariant import on_policy

    with on_policy(tiny, Policy.ONEDNN_AVX2):
        now = make_llm("1x128", max_new_tokens=4).generate("Hello there")
    before = dataclasses.replace(now, batch_shape="1x128",
                                 step_hashes=tuple("0" * 16 for _ in now.step_hashes))
    comparison = compare(before, now)
    assert comparison.verdict is Verdict.INPUT_CHANGED
    message = mismatch("test_x", "__golden__/t.json", "t.py::test_x", comparison, before, now, str,
                       profile="exact")
    n = len(now.prompt_token_ids)
    assert f"batch_shape: '1x128' -> '1x{n}' (at B = 1 a prompt now runs alone at its own length" in message


def test_the_cross_environment_hint_fits_the_field_that_changed():
    from pytest_llmdeterminism.reporting.hints import across_environments

    def hint(changes, explicit=False):
        return across_environments(changes, tolerance="near_tie(margin=0.05, atol=0.001)", explicit=explicit,
                                   run_variant="cpu/bfloat16")

    dtype = hint([("dtype", "float32", "bfloat16")])
    assert "record this run's own 'cpu/bfloat16' golden" in dtype and "--llm-tolerance=exact" not in dtype
    assert "record this run's own" in hint([("dtype", "float32", "bfloat16")], explicit=True)
    upgrade = hint([("transformers", "4.57.1", "5.24.0")])
    assert upgrade.endswith("; after an upgrade (transformers) keep the goldens and let the tolerance judge "
                            "the drift, or accept the new numbers: --llm-golden-update --llm-tolerance=exact "
                            "re-records every check that is not IDENTICAL")
    machine = hint([("cpu_capability", "AVX512", "DEFAULT")])
    assert machine.endswith("; to compare exactly again, re-record with --llm-golden-update "
                            "--llm-tolerance=exact")
    explicit = hint([("cpu_capability", "AVX512", "DEFAULT")], explicit=True)
    assert explicit.endswith("tolerance near_tie(margin=0.05, atol=0.001) as set")
    # a golden of the generic kernels (recorded as portable before its AVX2 kernels): the setting that
    # compares it exactly again, pasteable
    profile = hint([("cpu_numerics", "compatible", "portable"), ("cpu_capability", "DEFAULT", "AVX2")])
    assert ("compare exactly again with --llm-cpu-numerics=compatible (pytest.ini: llm_cpu_numerics = "
            "compatible; pyproject.toml: llm_cpu_numerics = \"compatible\"), or re-record with "
            "--llm-golden-update --llm-tolerance=exact") in profile
    assert "compare exactly again with" not in hint([("cpu_numerics", "native", "portable")])
    # with a library upgrade too, compatible would not compare exactly: the upgrade's hint
    both = hint([("torch", "2.12.0", "2.13.0"), ("cpu_numerics", "compatible", "portable")])
    assert "compare exactly again with" not in both and "after an upgrade (torch)" in both
    # an earlier generation of the batch-invariant kernels: no setting brings it back, re-record once
    earlier = hint([("batch_invariant", "cpu-onednn-avx2-rowwise-3", "cpu-onednn-avx2-canonical-4")])
    assert earlier.endswith("; the golden was computed on an earlier generation of the batch-invariant "
                            "kernels (this release computes them otherwise: decode steps now equal the "
                            "prefill, bit for bit): re-record once with --llm-golden-update "
                            "--llm-tolerance=exact (it re-records every check that is not IDENTICAL)")
    assert "--llm-batch-invariant" not in earlier  # the setting would not compare it exactly
    # a portable golden judged under compatible numerics: each profile's own kernels, not an earlier
    # generation; the profile's setting compares it exactly again
    other_profile = hint([("cpu_numerics", "portable", "compatible"), ("cpu_capability", "AVX2", "DEFAULT"),
                          ("batch_invariant", "cpu-onednn-avx2-canonical-4",
                           "cpu-mkl-compatible-tiles32-canonical-2")])
    assert "compare exactly again with --llm-cpu-numerics=portable" in other_profile
    assert "earlier generation" not in other_profile


def test_assert_tokens_match_names_the_condition_that_failed():
    """The in-memory assertion words a failure as a golden check does: the failed condition, both numbers."""
    import dataclasses

    from pytest_llmdeterminism import GoldenMismatchError, assert_tokens_match
    from pytest_llmdeterminism.goldens import schema
    from pytest_llmdeterminism.goldens.store import read

    examples = ROOT / "examples" / "__golden__" / "test_tiny_model.json"
    expected = schema.from_entry(read(examples)["test_capital"]["cpu/float32"])
    moved = tuple((token, logprob - 0.25) for token, logprob in expected.top_logprobs[0])
    actual = dataclasses.replace(expected, top_logprobs=(moved, *expected.top_logprobs[1:]),
                                 step_hashes=("0" * 16, *expected.step_hashes[1:]))
    with pytest.raises(GoldenMismatchError) as raised:
        assert_tokens_match(expected, actual, tolerance="close(atol=0.01)")
    assert "LOGIT_DRIFT at step 0" in str(raised.value)
    assert "max |Δlogprob| in top-k 0.25 > atol 0.01" in str(raised.value), str(raised.value)
