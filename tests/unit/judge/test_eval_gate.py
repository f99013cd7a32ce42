"""The eval gate (judge/eval_gate.py): the exact McNemar p-value against scipy's exact binomial test,
the minimum detectable effect against its normal-approximation formula, the test's error rate under
the null over many simulated paired evals (and its power on a real loss, the negative control), and
the gate's rules: near ties, significant gains and losses, the seed's worked example."""

import math

import numpy
import pytest
from scipy import stats

from pytest_llmdeterminism.judge import eval_gate
from pytest_llmdeterminism.judge.eval_gate import EvalMismatch, Gate, Outcome, compare_evals


def runs(items=1000, worse=0, better=0, *, margin=2.0, after_margin=1.5, accuracy=0.86):
    """Two runs of ``items`` items: ``worse`` flip right to wrong, ``better`` wrong to right, every
    flip's golden margin ``margin``."""
    right = round(items * accuracy)
    before, after = [], []
    for index in range(items):
        correct = index < right
        flips = index < worse or right <= index < right + better
        before.append(Outcome(f"q{index}", correct, margin=margin if flips else 3.0, choice=0))
        after.append(Outcome(f"q{index}", correct != flips, margin=after_margin if flips else 3.0,
                             choice=1 if flips else 0))
    return before, after


@pytest.mark.parametrize("worse, better", [(b, c) for b in range(0, 41, 3) for c in range(0, 41, 4)])
def test_the_p_value_is_scipys_exact_binomial_test_of_the_flips(worse, better):
    expected = 1.0 if worse + better == 0 else stats.binomtest(worse, worse + better, 0.5).pvalue
    assert eval_gate.mcnemar_p(worse, better) == pytest.approx(expected, rel=1e-12)


def test_the_mde_and_the_items_needed_are_the_paired_normal_formula():
    z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)
    assert eval_gate.minimum_detectable_effect(1000, 24) == pytest.approx(z * math.sqrt(0.024 / 1000))
    assert 0.013 < eval_gate.minimum_detectable_effect(1000, 24) < 0.014  # "about 1.4 points"
    assert eval_gate.items_needed(1000, 24, 4) == math.ceil(z**2 * 0.024 / 0.004**2)
    assert eval_gate.items_needed(1000, 24, 0) is None
    # the MDE shrinks as the eval grows, and grows with its churn
    assert eval_gate.minimum_detectable_effect(4000, 96) < eval_gate.minimum_detectable_effect(1000, 24)
    assert eval_gate.minimum_detectable_effect(1000, 96) > eval_gate.minimum_detectable_effect(1000, 24)


def test_the_tests_false_alarm_rate_is_at_most_alpha_and_it_finds_a_real_loss():
    """Statistics tested as statistics: 2,000 simulated pairs of runs of a 500-item eval whose items
    flip at random (4 % churn). With no real change (each flip as likely either way) the gate rejects
    at most alpha of them; where flips go right-to-wrong three times as often, it rejects most."""
    generator = numpy.random.default_rng(20261207)
    gates: dict[tuple[int, int], Gate] = {}  # the gate of each (right-to-wrong, wrong-to-right) pair

    def rejections(loss_share, trials=2000, items=500, churn=0.04):
        flips = generator.binomial(items, churn, size=trials)
        worse = generator.binomial(flips, loss_share)
        for pair in {(int(w), int(f - w)) for w, f in zip(worse, flips, strict=True)} - gates.keys():
            gates[pair] = compare_evals(*runs(items, *pair)).gate
        rejected = [gates[int(w), int(f - w)] is Gate.REJECT for w, f in zip(worse, flips, strict=True)]
        return sum(rejected) / trials

    null = rejections(0.5)
    # one-sided half of a two-sided 5 % test, and the exact test is conservative
    assert null <= 0.025 + 3 * math.sqrt(0.025 * 0.975 / 2000)
    assert rejections(0.75) > 0.5  # the negative control: a real loss is found


def test_the_seeds_worked_example_is_inconclusive_and_the_same_flips_at_near_ties_are_allowed():
    result = compare_evals(*runs(1000, 14, 10))
    assert result.gate is Gate.INCONCLUSIVE
    assert result.p_value == pytest.approx(0.5413, abs=1e-4)
    assert (result.right_to_wrong, result.wrong_to_right, result.churn) == (14, 10, 0.024)
    assert result.accuracy == (0.86, 0.856)
    assert result.items_needed == eval_gate.items_needed(1000, 24, 4) > 1000
    at_ties = compare_evals(*runs(1000, 14, 10, margin=0.02))
    assert at_ties.gate is Gate.ALLOW and at_ties.near_ties == 24 and at_ties.items_needed is None


@pytest.mark.parametrize("worse, better, margin, gate", [
    (0, 0, 2.0, Gate.ALLOW),  # nothing flipped
    (40, 5, 2.0, Gate.REJECT),  # a significant loss
    (5, 40, 2.0, Gate.ALLOW),  # a significant gain
    (40, 5, 0.05, Gate.ALLOW),  # every flip at a near tie (below the default margin 0.1)
    (40, 5, None, Gate.REJECT),  # no margin recorded: never a near tie
    (3, 0, None, Gate.INCONCLUSIVE),
])
def test_the_gate(worse, better, margin, gate):
    assert compare_evals(*runs(1000, worse, better, margin=margin)).gate is gate


def test_one_confident_flip_among_near_ties_makes_the_move_a_question():
    before, after = runs(1000, 6, 6, margin=0.01)
    before[0] = Outcome("q0", True, margin=5.0, choice=0)
    result = compare_evals(before, after)
    assert result.gate is Gate.INCONCLUSIVE and result.near_ties == 11
    # right-to-wrong first, the surest first
    assert [flip.id for flip in result.flips][:1] == ["q0"] and not result.flips[0].near_tie
    assert result.flips[0].margin_before == 5.0 and result.flips[0].margin_after == 1.5


def test_runs_of_different_items_are_refused_naming_what_differs():
    before, after = runs(20)
    with pytest.raises(EvalMismatch, match=r"1 only in the first run \('q19'\); 1 only in the second run "
                                           r"\('extra'\)"):
        compare_evals(before, [*after[:-1], Outcome("extra", True)])
    with pytest.raises(EvalMismatch, match="the second run holds item 'q3' twice"):
        compare_evals(before, [*after, after[3]])
    changed = [Outcome(o.id, o.correct, o.margin, o.choice, input="a") for o in before]
    with pytest.raises(EvalMismatch, match=r"1 item\(s\) hold another input in the second run \('q7'\)"):
        compare_evals(changed, [Outcome(o.id, o.correct, o.margin, o.choice,
                                        input="b" if o.id == "q7" else "a") for o in after])
    with pytest.raises(EvalMismatch, match="no item"):
        compare_evals([], [])
