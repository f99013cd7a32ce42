"""The pure comparator: one verdict per check, input changes first, first divergence only."""

import dataclasses

from hypothesis import assume, given
from hypothesis import strategies as st

from pytest_llmdeterminism.generation import Generation
from pytest_llmdeterminism.judge.compare import Verdict, compare
from tests.helpers.strategies import generations


def replace_step(gen, step, *, token=None, hash_=None, top=None):
    def swap(seq, value):
        return tuple(value if i == step else v for i, v in enumerate(seq))

    changes = {}
    if token is not None:
        changes["token_ids"] = swap(gen.token_ids, token)
    if hash_ is not None:
        changes["step_hashes"] = swap(gen.step_hashes, hash_)
    if top is not None:
        changes["top_logprobs"] = swap(gen.top_logprobs, top)
    return dataclasses.replace(gen, **changes)


@given(generations())
def test_identical_inputs_are_identical(gen):
    result = compare(gen, gen)
    assert result.verdict is Verdict.IDENTICAL
    assert result.divergence is None and result.first_hash_step is None


@given(generations(steps=st.integers(1, 10)), st.data())
def test_hash_only_change_is_logit_drift_at_that_step(gen, data):
    step = data.draw(st.integers(0, len(gen.token_ids) - 1))
    actual = replace_step(gen, step, hash_="ffffffffffffffff")
    assume(actual.step_hashes[step] != gen.step_hashes[step])
    result = compare(gen, actual)
    assert result.verdict is Verdict.LOGIT_DRIFT
    assert result.first_hash_step == step


@given(generations(steps=st.integers(2, 10)), st.data())
def test_divergence_at_step_t_never_inspects_later_steps(gen, data):
    step = data.draw(st.integers(0, len(gen.token_ids) - 2))
    diverged = replace_step(gen, step, token=gen.token_ids[step] + 1)
    first = compare(gen, diverged)
    assert first.divergence is not None and first.divergence.step == step
    assert first.verdict in (Verdict.REGRESSION, Verdict.TIE_FLIP)
    # Rewrite everything after the divergence: the comparison must not change.
    rest = len(gen.token_ids) - step - 1
    later = {"token_ids": diverged.token_ids[: step + 1] + (7,) * rest,
             "step_hashes": diverged.step_hashes[: step + 1] + ("0" * 16,) * rest}
    assert compare(gen, dataclasses.replace(diverged, **later)) == first


def test_confident_divergence_is_a_regression_and_near_tie_is_a_tie_flip():
    def gen(tokens, margins, tops):
        n = len(tokens)
        return Generation(prompt="p", prompt_token_ids=(1, 2), token_ids=tuple(tokens), text="",
                          step_hashes=tuple(f"{i:016x}" for i in range(n)), top_logprobs=tuple(tops),
                          margins=tuple(margins), finish_reason="length", generation_config={},
                          batch_shape="1x8", fingerprint={"dtype": "float32"})

    tops = [((5, -0.1), (6, -3.0)), ((8, -0.693), (9, -0.694))]
    golden = gen([5, 8], [2.9, 0.001], tops)
    regression = compare(golden, gen([6, 8], [1.0, 0.001], [((6, -0.5), (5, -1.5)), tops[1]]))
    assert regression.verdict is Verdict.REGRESSION and regression.divergence.step == 0
    assert regression.divergence.golden_margin == 2.9
    flip = compare(golden, gen([5, 9], [2.9, 0.002], [tops[0], ((9, -0.692), (8, -0.694))]))
    assert flip.verdict is Verdict.TIE_FLIP and flip.divergence.step == 1
    assert flip.first_hash_step is None  # hashes here were equal up to the flip
    outside_top = compare(golden, gen([5, 42], [2.9, 0.002], [tops[0], ((42, -0.1), (8, -3.0))]))
    assert outside_top.verdict is Verdict.REGRESSION  # a near tie, but not with the golden's runner-up
    stopped = compare(golden, gen([5], [2.9], tops[:1]))  # actual hit EOS one step early
    assert stopped.divergence.step == 1 and stopped.divergence.actual_token == -1
    assert stopped.verdict is Verdict.REGRESSION


@given(generations(steps=st.integers(1, 6)))
def test_input_changes_are_reported_first_and_outputs_not_compared(gen):
    changed = dataclasses.replace(
        gen, prompt_token_ids=gen.prompt_token_ids + (3,), batch_shape="2x40",
        generation_config={**gen.generation_config, "repetition_penalty": 1.7},
        token_ids=tuple(t + 1 for t in gen.token_ids),
    )
    result = compare(gen, changed)
    assert result.verdict is Verdict.INPUT_CHANGED and result.divergence is None
    fields = {name: (old, new) for name, old, new in result.input_changes}
    assert fields["batch_shape"] == (gen.batch_shape, "2x40")
    penalty = gen.generation_config.get("repetition_penalty")
    assert fields["generation_config.repetition_penalty"] == (penalty, 1.7)
    assert fields["prompt_token_ids"][1] == changed.prompt_token_ids


def budgeted(tokens, budget, finish="length", *, hashes=None):
    n = len(tokens)
    return Generation(prompt="p", prompt_token_ids=(1, 2), token_ids=tuple(tokens), text="",
                      step_hashes=tuple(hashes or (f"{t:016x}" for t in tokens)),
                      top_logprobs=tuple(((t, -0.1), (t + 1, -3.0)) for t in tokens), margins=(2.9,) * n,
                      finish_reason=finish, generation_config={"max_new_tokens": budget, "eos_token_id": [2]},
                      batch_shape="1x8", fingerprint={"dtype": "float32"})


def test_a_larger_budget_judges_the_goldens_steps_and_leaves_the_new_ones_unjudged():
    golden = budgeted([5, 6, 7, 8], 4)
    longer = compare(golden, budgeted([5, 6, 7, 8, 9, 10], 6))
    assert longer.verdict is Verdict.IDENTICAL and not longer.input_changes
    assert (longer.budgets, longer.steps_compared, longer.new_steps,
            longer.unchecked_steps) == ((4, 6), 4, 2, 0)
    drifted = compare(golden, budgeted([5, 6, 7, 8, 9], 5, hashes=["0" * 16] * 5))
    assert drifted.verdict is Verdict.LOGIT_DRIFT and drifted.first_hash_step == 0
    diverged = compare(golden, budgeted([5, 6, 42, 8, 9, 10], 6))
    assert diverged.verdict is Verdict.REGRESSION and diverged.divergence.step == 2
    # Only the steps both budgets cover are evidence: what came after the golden's end is not judged.
    tail = compare(golden, budgeted([5, 6, 7, 8, 99, 99], 6,
                                    hashes=[*(f"{t:016x}" for t in (5, 6, 7, 8)), "0" * 16, "0" * 16]))
    assert tail.verdict is Verdict.IDENTICAL and tail.new_steps == 2


def test_a_golden_that_stopped_at_eos_is_complete_and_a_larger_budget_must_stop_there_too():
    golden = budgeted([5, 6, 2], 4, finish="eos")
    same_stop = compare(golden, budgeted([5, 6, 2], 8, finish="eos"))
    assert same_stop.verdict is Verdict.IDENTICAL and same_stop.new_steps == 0 and same_stop.budgets == (4, 8)
    went_on = compare(golden, budgeted([5, 6, 7, 8, 9, 10, 11, 12], 8))
    assert went_on.verdict is Verdict.REGRESSION and went_on.divergence.step == 2
    assert went_on.divergence.expected_token == 2  # the golden's EOS


def test_a_smaller_budget_judges_the_steps_it_has():
    golden = budgeted([5, 6, 7, 8, 9, 10], 6)
    shorter = compare(golden, budgeted([5, 6, 7, 8], 4))
    assert shorter.verdict is Verdict.IDENTICAL
    assert (shorter.budgets, shorter.steps_compared, shorter.new_steps,
            shorter.unchecked_steps) == ((6, 4), 4, 0, 2)
    assert compare(golden, budgeted([5, 6, 7, 42], 4)).divergence.step == 3
    # The golden stopped at EOS before the smaller budget ran out: the run must stop there too.
    early = budgeted([5, 2], 6, finish="eos")
    assert compare(early, budgeted([5, 2], 4, finish="eos")).verdict is Verdict.IDENTICAL
    assert compare(early, budgeted([5, 6, 7, 8], 4)).divergence.step == 1


def test_the_step_hashes_earlier_name_still_reads_them():
    """``Generation.logit_hashes`` was the name of ``step_hashes`` (a step's hash is not always of logits):
    code that reads it keeps working."""
    from tests.helpers.strategies import sample_generation

    generation = sample_generation()
    assert generation.logit_hashes == generation.step_hashes and generation.step_hashes
