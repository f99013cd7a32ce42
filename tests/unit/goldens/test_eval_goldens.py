"""The eval kind (goldens/kinds/eval.py) without a model: an eval golden judged item by item (a label
swap is a REGRESSION at its item, a flip at a near tie a TIE_FLIP, other numbers LOGIT_DRIFT, a
changed prompt INPUT_CHANGED), its failure led by the accuracy, the flips and the gate, and its entry
stored and read back whole through a golden file beside built-in entries."""

import dataclasses
import json

import pytest

from pytest_llmdeterminism.errors import GoldenFileError
from pytest_llmdeterminism.generation import CHOICE, EvalItem, Evaluation, digest
from pytest_llmdeterminism.goldens import kinds, schema, store
from pytest_llmdeterminism.judge.compare import Verdict, compare
from pytest_llmdeterminism.reporting import failure
from tests.helpers.strategies import sample_generation

FINGERPRINT = {"device_class": "cpu", "dtype": "float32", "engine": "transformers"}


def item(index, choice=0, label=0, margin=2.0, numbers="n"):
    scores = [-5.0, -6.0, -7.0]
    scores[choice] = -5.0 + margin if choice else -5.0
    if choice:
        scores[0] = -5.0
    top = max(scores)
    scores = [s - top - 1.0 for s in scores]
    return EvalItem(id=f"q{index}", form=CHOICE, choice=choice, correct=choice == label, margin=margin,
                    input=digest("prompt", index), numbers=digest(numbers, index), scores=tuple(scores),
                    label=label)


def evaluation(items):
    return Evaluation(items=tuple(items), batch_shape="4x32", settings={"acc_norm": False},
                      fingerprint=FINGERPRINT)


GOLDEN = evaluation([item(i, label=0 if i % 4 else 1) for i in range(40)])


def with_item(base, index, **changes):
    items = list(base.items)
    items[index] = dataclasses.replace(items[index], **changes)
    return evaluation(items)


def test_the_same_run_is_identical_and_other_numbers_are_logit_drift():
    assert compare(GOLDEN, evaluation(GOLDEN.items)).verdict is Verdict.IDENTICAL
    drifted = with_item(GOLDEN, 5, numbers=digest("other"), scores=(-1.0, -3.0001, -3.0))
    comparison = compare(GOLDEN, drifted)
    assert comparison.verdict is Verdict.LOGIT_DRIFT and comparison.first_hash_step == 5
    assert comparison.max_logprob_delta > 0


def test_a_label_swap_is_a_regression_at_its_item_and_the_failure_leads_with_the_eval():
    swapped = with_item(GOLDEN, 7, correct=False, label=2)  # the answer key changed: same decision, now wrong
    comparison = compare(GOLDEN, swapped)
    assert comparison.verdict is Verdict.REGRESSION and comparison.first_hash_step == 7
    message = failure.mismatch("test_eval", "__golden__/test_e.json", "test_e.py::test_eval", comparison,
                               GOLDEN, swapped, str, profile="exact")
    headline, *lines = message.splitlines()
    assert "REGRESSION at item 7 — accuracy 75.00 % -> 72.50 %: 1 right->wrong, 0 wrong->right, " \
           "1 decision(s) changed; gate INCONCLUSIVE" in headline
    assert any(line.startswith("  exact McNemar p = 1, churn 2.5 %, minimum detectable effect")
               for line in lines)
    assert "  changed items (the confident first):" in lines
    assert any("q7: REGRESSION, choice 0 -> 0 (right -> wrong; its label changed: 0 -> 2); margin 2 in the "
               "golden (not a near tie)" in line for line in lines)
    # a swap between two wrong choices leaves the item wrong, and is found all the same
    still_wrong = with_item(GOLDEN, 0, label=2)
    assert not GOLDEN.items[0].correct and compare(GOLDEN, still_wrong).verdict is Verdict.REGRESSION
    assert any(line.startswith("  forecast: 0 of 40 item(s) sit within the tie margin 0.05")
               for line in lines)


def test_a_flip_at_a_near_tie_is_a_tie_flip_and_a_confident_one_a_regression():
    tied = evaluation([*GOLDEN.items[:3], item(3, choice=0, label=1, margin=0.01), *GOLDEN.items[4:]])
    flipped = with_item(tied, 3, choice=1, correct=True, margin=0.02)
    assert compare(tied, flipped).verdict is Verdict.TIE_FLIP
    comparison = compare(GOLDEN, with_item(GOLDEN, 3, choice=2, correct=False, margin=1.0))
    assert comparison.verdict is Verdict.REGRESSION
    # the worst item decides: a tie flip and a confident flip together are a REGRESSION
    both = with_item(flipped, 9, choice=2, correct=False)
    assert compare(tied, both).verdict is Verdict.REGRESSION


def test_a_changed_prompt_or_item_set_or_setting_is_input_changed():
    changed = compare(GOLDEN, with_item(GOLDEN, 2, input=digest("another prompt")))
    assert changed.verdict is Verdict.INPUT_CHANGED
    assert changed.input_changes == (("items' prompts or choices", "40 item(s) as recorded", "changed: q2"),)
    fewer = compare(GOLDEN, evaluation(GOLDEN.items[:-1]))
    assert fewer.verdict is Verdict.INPUT_CHANGED and fewer.input_changes[0][0] == "items"
    normed = dataclasses.replace(GOLDEN, settings={"acc_norm": True})
    assert compare(GOLDEN, normed).input_changes[0] == ("settings", {"acc_norm": False}, {"acc_norm": True})


def test_an_eval_golden_is_stored_and_read_back_whole_beside_a_generation(tmp_path):
    path = tmp_path / "test_e.json"
    store.write(path, {"test_eval": {"cpu/float32": schema.to_entry(GOLDEN)},
                       "test_gen": {"cpu/float32": schema.to_entry(sample_generation())}})
    goldens = store.read(path)
    assert kinds.named(goldens["test_eval"]["cpu/float32"].kind) is kinds.EVAL
    assert schema.from_entry(goldens["test_eval"]["cpu/float32"]) == GOLDEN
    assert schema.from_entry(goldens["test_gen"]["cpu/float32"]) == sample_generation()
    stored = json.loads(path.read_text())["goldens"]["test_eval"]["cpu/float32"]
    assert stored["accuracy"] == 0.75 and stored["items"][0] == {
        "id": "q0", "form": "choice", "choice": 0, "correct": False, "margin": 2.0, "label": 1,
        "input": digest("prompt", 0), "numbers": digest("n", 0), "scores": list(GOLDEN.items[0].scores)}


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda e: e.update(accuracy=0.9), "says accuracy 0.9, but its items' is 0.75"),
    (lambda e: e["items"][1].update(id="q0"), "holds item 'q0' twice"),
    (lambda e: e["items"][0].update(choice=7), "item 'q0': a choice item's choice is the index of one"),
    (lambda e: e["items"][0].update(margin=-1.0), r"items\[0\].margin: Expected `float` >= 0.0"),
    (lambda e: e.update(items=[]), "without items"),
    (lambda e: e["items"][0].update(label=5), "item 'q0': a choice item's label is the index of one"),
])
def test_a_broken_eval_entry_is_one_golden_file_error(tmp_path, edit, problem):
    path = tmp_path / "test_e.json"
    store.write(path, {"test_eval": {"cpu/float32": schema.to_entry(GOLDEN)}})
    document = json.loads(path.read_text())
    edit(document["goldens"]["test_eval"]["cpu/float32"])
    path.write_text(json.dumps(document))
    with pytest.raises(GoldenFileError, match=problem):
        store.read(path)


def test_the_gate_profile_passes_an_eval_on_its_gate_not_on_its_verdict():
    from pytest_llmdeterminism.judge.tolerance import parse_profile

    gate, exact, near_tie = parse_profile("gate"), parse_profile("exact"), parse_profile("near_tie")
    assert str(parse_profile("gate(margin=0.2)")) == "gate(margin=0.2)"
    assert gate.describe("float32") == "gate(margin=0.05, atol=0.001)"
    # 12 wrong items become right, confidently: REGRESSION items, a significant gain: ALLOW
    better = evaluation([dataclasses.replace(item, choice=1, correct=True) if not item.correct else item
                         for item in GOLDEN.items][:40])
    gain = compare(GOLDEN, better, tie_margin=0.05)
    assert gain.verdict is Verdict.REGRESSION and gain.gate == "ALLOW"
    assert gate.accepts(gain) and not exact.accepts(gain) and not near_tie.accepts(gain)
    # one confident right-to-wrong flip: INCONCLUSIVE, which the gate fails
    loss = compare(GOLDEN, with_item(GOLDEN, 7, correct=False), tie_margin=0.05)
    assert loss.gate == "INCONCLUSIVE" and not gate.accepts(loss)
    # a changed input has no gate: it fails as under near_tie
    changed = compare(GOLDEN, with_item(GOLDEN, 2, input=digest("another prompt")), tie_margin=0.05)
    assert changed.gate is None and not gate.accepts(changed)


def test_an_eval_entry_takes_the_fast_duplicate_key_proof_and_a_repeated_key_is_still_found(tmp_path):
    from pytest_llmdeterminism.goldens import codec

    path = tmp_path / "test_e.json"
    store.write(path, {"test_eval": {"cpu/float32": schema.to_entry(GOLDEN)}})
    data = path.read_bytes()
    assert codec._no_duplicate_keys(data, codec.parse(path, data), header_keys=1)  # counted, not read twice
    repeated = data.replace(b'"correct":false,', b'"correct":true,"correct":false,', 1)
    assert repeated != data
    path.write_bytes(repeated)
    with pytest.raises(GoldenFileError, match="has the key 'correct' twice in one object"):
        store.read(path)


def test_a_label_the_golden_did_not_record_is_no_change():
    unlabelled = evaluation([dataclasses.replace(item, label=None) for item in GOLDEN.items])
    assert compare(unlabelled, GOLDEN).verdict is Verdict.IDENTICAL
