"""One verdict per check whatever reads it: the verdicts' facts live on the verdict, the run and the
review tools make one judgement, and a flip within the run's own drift is a flip, said so."""


import pytest

from pytest_llmdeterminism.errors import GoldenFileError
from pytest_llmdeterminism.generation import Generation
from pytest_llmdeterminism.goldens import judged, schema, store
from pytest_llmdeterminism.goldens.acceptance import plan_accept
from pytest_llmdeterminism.goldens.review import (
    case_risk,
    fail_on,
    review,
    review_goldens,
    review_order,
)
from pytest_llmdeterminism.judge.compare import Verdict, compare
from pytest_llmdeterminism.judge.decision import decide
from pytest_llmdeterminism.judge.tolerance import parse_profile
from pytest_llmdeterminism.reporting import failure
from pytest_llmdeterminism.reporting.hints import after_model_change
from pytest_llmdeterminism.reporting.records import CheckRecord
from pytest_llmdeterminism.reporting.run_comparison import compare_runs
from tests.helpers.strategies import moved_score, sample_score

# -- the verdicts' facts ---------------------------------------------------------------------------


def test_every_verdict_carries_its_risk_and_family_and_every_order_is_read_from_them():
    assert len({verdict.risk for verdict in Verdict}) == len(Verdict)  # one order, no ties
    assert [v.value for v in Verdict if v.flip] == ["TIE_FLIP", "SAMPLE_FLIP", "RANK_FLIP"]
    assert {v for v in Verdict if v.tolerable} == {Verdict.LOGIT_DRIFT, *(v for v in Verdict if v.flip)}
    assert Verdict.by_risk()[0] is Verdict.REGRESSION and Verdict.by_risk()[-1] is Verdict.IDENTICAL
    # The review order: every verdict compare() returns has its place (a missing one crashed review).
    order = review_order()
    assert set(order) == {v.value for v in Verdict if v.compared} | {"FIELDS_CHANGED", "NEW", "ABSENT"}
    assert sorted(order, key=case_risk) == list(order)
    assert fail_on("regression") == {"REGRESSION", "INPUT_CHANGED", "FIELDS_CHANGED", "NEW"}
    assert fail_on("tie_flip") - fail_on("regression") == {v.value for v in Verdict if v.flip}
    assert fail_on("drift") - fail_on("tie_flip") == {"LOGIT_DRIFT"}
    assert [v.value for v in Verdict.by_risk() if v.confident_change] == ["REGRESSION", "INPUT_CHANGED"]
    assert Verdict.risk_of("NOT_A_VERDICT") == len(Verdict)


def test_compare_lists_changed_checks_by_the_verdicts_risk():
    before = [{"test": "t", "name": name, "verdict": "IDENTICAL", "passed": True} for name in "abc"]
    after = [{"test": "t", "name": "a", "verdict": "LOGIT_DRIFT", "passed": False},
             {"test": "t", "name": "b", "verdict": "REGRESSION", "passed": False},
             {"test": "t", "name": "c", "verdict": "RANK_FLIP", "passed": False}]
    assert [change.name for change in compare_runs(before, after)] == ["b", "c", "a"]


# -- one judgement: the run and `llm-golden diff/review/accept` ------------------------------------

@pytest.mark.parametrize("explicit", [None, "near_tie(margin=0.05, atol=0.001)", "exact"])
def test_a_score_check_has_the_runs_verdict_in_diff_review_and_accept(explicit):
    """Issue 49 F1: a score whose logprobs moved beyond the profile's atol (and whose near tie at
    position 1 swapped) was a REGRESSION in the run and a RANK_FLIP in `llm-golden diff`, `review` and
    `accept`, each judging with another tolerance; `accept --only LOGIT_DRIFT,TIE_FLIP` left it behind."""
    golden = sample_score()
    actual = moved_score(moved_score(golden, 0, -0.9), 1, -0.6995, rank=1)
    profile = parse_profile(explicit) if explicit else None
    decision = decide(actual, golden=golden, variant="cpu/float32", explicit=profile, update=None)
    assert decision.comparison.verdict is Verdict.RANK_FLIP and not decision.passed  # drift 0.4 > atol
    tolerances = {"test_s": {"cpu/float32": profile}} if profile else {}
    base, candidate = ({"test_s": {"cpu/float32": schema.to_struct(schema.to_entry(score))}}
                       for score in (golden, actual))
    (case,) = review_goldens("t.json", base, candidate, tolerances)
    assert case.verdict == decision.comparison.verdict.value
    assert case.comparison == decision.comparison


def test_an_explicit_margin_judges_the_review_as_it_judged_the_run():
    golden = sample_score()
    flipped = moved_score(golden, 1, -0.6995, rank=1)  # the planted near tie, golden rank margin 0.01
    tight = parse_profile("near_tie(margin=0.005, atol=0.01)")
    decision = decide(flipped, golden=golden, variant="cpu/float32", explicit=tight, update=None)
    assert decision.comparison.verdict is Verdict.REGRESSION  # 0.01 >= the test's own margin
    entries = [{"test_s": {"cpu/float32": schema.to_struct(schema.to_entry(s))}} for s in (golden, flipped)]
    assert review_goldens("t.json", *entries, {"test_s": {"cpu/float32": tight}})[0].verdict == "REGRESSION"
    assert review_goldens("t.json", *entries)[0].verdict == "RANK_FLIP"  # the default margin, 0.05


def test_the_profile_the_run_set_travels_beside_the_candidates_and_a_forged_one_is_refused(tmp_path):
    golden = sample_score()
    flipped = moved_score(golden, 1, -0.6995, rank=1)
    root, cands = tmp_path / "root", tmp_path / "cands"
    store.write(root / "__golden__" / "test_x.json", {"test_s": {"cpu/float32": schema.to_entry(golden)}})
    candidate = cands / "__golden__" / "test_x.json"
    store.write(candidate, {"test_s": {"cpu/float32": schema.to_entry(flipped)}})
    def verdicts():
        return [case.verdict for case in review(root / "__golden__", cands / "__golden__").cases]

    assert verdicts() == ["RANK_FLIP"]  # the default tie margin, 0.05
    judged.merge(candidate, {"test_s": {"cpu/float32": "near_tie(margin=0.005, atol=0.01)"}})
    assert verdicts() == ["REGRESSION"]
    (planned,), problems = plan_accept(cands, root)
    assert problems == [] and [case.verdict for case in planned.cases] == ["REGRESSION"]
    judged.merge(candidate, {"test_s": {"cpu/float32": ""}})  # judged by the default: no entry, no file
    assert not judged.path_for(candidate).exists()
    judged.path_for(candidate).write_text('{"test_s": {"cpu/float32": "near_tie(margin=inf)"}}')
    accepted, problems = plan_accept(cands, root)
    assert accepted == [] and len(problems) == 1
    assert "test_x.tolerances' is no tolerance file of candidates" in problems[0]
    assert "margin must be a finite number" in problems[0]
    assert f"Delete {judged.path_for(candidate)}" in problems[0]
    with pytest.raises(GoldenFileError, match="is no tolerance file"):
        verdicts()


# -- a flip within the run's own drift (DESIGN §14) ------------------------------------------------

def _gen(tokens, tops):
    return Generation(prompt="p", prompt_token_ids=(1, 2), token_ids=tuple(tokens), text="",
                      step_hashes=tuple(f"{i:016x}" for i in range(len(tokens))), top_logprobs=tuple(tops),
                      margins=tuple(top[0][1] - top[1][1] for top in tops), finish_reason="length",
                      generation_config={}, batch_shape="1x8", fingerprint={"dtype": "float32"})


GOLDEN = _gen([5, 8], [((5, -0.1), (6, -3.0)), ((8, -0.6), (9, -0.776))])  # step 1: margin 0.176


def _drifted(drift):
    """The golden's step 0 drifted by ``drift``, then step 1 flipped to the golden's runner-up."""
    return _gen([5, 9], [((5, -0.1 - drift), (6, -3.0)), ((9, -0.5), (8, -0.9))])


def test_a_flip_whose_margin_lies_within_the_drift_before_it_is_a_tie_flip_and_says_so():
    """Issue 49 F2: after a new checkpoint a flip at margin 0.176 under drift 0.61 was a REGRESSION,
    and nothing said the run's own drift covers it."""
    comparison = compare(GOLDEN, _drifted(0.61))
    assert comparison.verdict is Verdict.TIE_FLIP and comparison.max_logprob_delta == pytest.approx(0.61)
    text = failure.mismatch("test_x", "g.json", None, comparison, GOLDEN, _drifted(0.61), str,
                            profile="exact")
    assert ("golden margin 0.176 >= tie margin 0.05, within this run's drift (0.61): near tie"
            in text.splitlines()[0])
    # the drift is still the profile's to judge: a near tie passes only within its atol
    assert not parse_profile("near_tie(margin=0.05, atol=0.1)").accepts(comparison)
    assert parse_profile("near_tie(margin=0.05, atol=1)").accepts(comparison)


def test_the_reports_say_a_flip_was_within_the_runs_drift():
    from pytest_llmdeterminism.reporting.text import margin_text

    check = {"verdict": "TIE_FLIP", "golden_margin": 0.176, "max_logprob_delta": 0.61, "tie_margin": 0.05}
    assert margin_text(check) == "0.176 (within this run's drift 0.61)"
    assert margin_text({**check, "golden_margin": 0.01}) == "0.01"  # below the tie margin itself
    assert margin_text({**check, "verdict": "REGRESSION", "max_logprob_delta": 0.1}) == "0.176"


def test_a_flip_whose_margin_exceeds_both_the_tie_margin_and_the_drift_is_a_regression():
    comparison = compare(GOLDEN, _drifted(0.1))
    assert comparison.verdict is Verdict.REGRESSION
    text = failure.mismatch("test_x", "g.json", None, comparison, GOLDEN, _drifted(0.1), str,
                            profile="exact")
    assert ("golden margin 0.176 >= tie margin 0.05, outside this run's drift (0.1): not a near tie"
            in text.splitlines()[0])


def test_a_score_rank_change_within_the_drift_of_its_other_positions_is_a_rank_flip():
    golden = sample_score()  # position 1: the given token 0.01 below the top-1
    swapped = moved_score(golden, 1, -0.6995, rank=1)
    tight = 0.005  # a tie margin below the golden's rank margin: the swap alone is confident
    assert compare(golden, swapped, tie_margin=tight).verdict is Verdict.REGRESSION
    drifted = compare(golden, moved_score(swapped, 0, -0.52), tie_margin=tight)  # 0.02 of drift elsewhere
    assert drifted.verdict is Verdict.RANK_FLIP
    (change,) = drifted.score.rank_changes
    assert change.drift_elsewhere == pytest.approx(0.02)


# -- the summary suggests only --only lists that take something -----------------------------------

def _check(verdict, drift=0.0):
    return CheckRecord(name="k", variant="cpu/float32", verdict=verdict, passed=False,
                       changed_fingerprint={"weights_hash": ("a", "b")}, max_logprob_delta=drift,
                       tie_margin=0.05)


def test_the_upgrade_advice_names_only_the_verdicts_the_run_has_in_its_only_list():
    only_regressions = after_model_change([_check("REGRESSION"), _check("INPUT_CHANGED")], candidates="c")
    assert not [line for line in only_regressions if "--only" in line]
    mixed = after_model_change([_check("REGRESSION"), _check("RANK_FLIP", 0.3), _check("LOGIT_DRIFT", 0.1)],
                               candidates="c")
    assert mixed[-1] == ("  to accept only the drift and near ties: llm-golden accept c --only "
                         "RANK_FLIP,LOGIT_DRIFT (or -k KEY)")
