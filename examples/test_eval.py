"""An eval as one golden: 60 multiple-choice items, judged item by item on every run.

``llm_model.evaluate(items)`` scores each item's choices teacher-forced in the fixed shape (the best
choice decides; its margin over the runner-up says how sure the model was), and
``golden_tokens.check`` keeps the whole eval as one golden. A failure leads with the accuracy before
and after, the items that flipped and whether each was a near tie, and the paired gate (exact
McNemar test). The built-in tiny model is random: its accuracy means nothing, its mechanics are the
real ones. Run it with `pytest examples`; compare two runs' goldens with `llm-golden eval-diff`.
"""

from pytest_llmdeterminism import deterministic

ITEMS = [{"id": f"sum-{a}-{b}", "prompt": f"{a}+{b}=", "choices": [f" {a + b}", f" {a + b + 1}"], "label": 0}
         for a in range(1, 7) for b in range(1, 11)]


@deterministic
def test_the_sums_eval(llm_model, golden_tokens):
    evaluation = llm_model.evaluate(ITEMS)
    golden_tokens.check(evaluation)  # each item's decision, correctness, margin and hashes
    assert len(evaluation.items) == 60 and 0.0 <= evaluation.accuracy <= 1.0
