"""`llm-golden eval-diff` (cli/eval_diff.py) on synthetic lm-evaluation-harness samples files, written
as lm-eval writes them (one [loglikelihood, is_greedy] pair per choice, numbers as strings too): the
seed's 14/10 on 1,000 items is INCONCLUSIVE with p = 0.54 and the MDE, the same flips at near ties
ALLOW, 40/5 REJECT; generative items' flips are unclassified; bad input is one message and exit 2."""

import json
import math

import pytest

from pytest_llmdeterminism import cli


def sample(doc_id, choice, label, margin, *, strings=False, filter_name="none", choices=4, doc_hash=None):
    """One multiple-choice line: ``choice`` wins by ``margin`` over the runner-up."""
    lls = [-5.0 - index for index in range(choices)]
    lls[choice] = -2.0
    lls[(choice + 1) % choices] = -2.0 - margin
    pairs = [[f"{ll:.6f}" if strings else ll, str(i == choice) if strings else i == choice]
             for i, ll in enumerate(lls)]
    line = {"doc_id": doc_id, "doc": {"question": f"question {doc_id}"}, "target": label,
            "arguments": [[f"question {doc_id}", f" answer {i}"] for i in range(choices)],
            "resps": [[pair] for pair in pairs], "filtered_resps": pairs, "filter": filter_name,
            "metrics": ["acc"], "acc": 1.0 if choice == label else 0.0}
    if doc_hash is not None:
        line["doc_hash"] = doc_hash
    return line


def eval_files(tmp_path, items=1000, worse=0, better=0, *, margin=2.0, accuracy=0.86, strings=False):
    """Two samples files of ``items`` items: ``worse`` flip right to wrong, ``better`` wrong to right;
    each flipped item's margin in A is ``margin``."""
    right = round(items * accuracy)
    before, after = [], []
    for doc_id in range(items):
        correct = doc_id < right
        flipped = doc_id < worse or right <= doc_id < right + better
        first = 0 if correct else 1
        before.append(sample(doc_id, first, 0, margin if flipped else 3.0, strings=strings))
        second = (1 - first) if flipped else first
        after.append(sample(doc_id, second, 0, 1.0 if flipped else 3.0, strings=strings))
    return write(tmp_path / "samples_mc_A.jsonl", before), write(tmp_path / "samples_mc_B.jsonl", after)


def write(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def eval_diff(capsys, *args):
    status = cli.main(["eval-diff", *map(str, args)])
    out, err = capsys.readouterr()
    return status, out, err


def test_the_seeds_case_is_inconclusive_with_its_p_value_mde_and_the_items_it_would_take(tmp_path, capsys):
    a, b = eval_files(tmp_path, 1000, 14, 10, strings=True)
    status, out, _ = eval_diff(capsys, a, b, "--json")
    result = json.loads(out)
    assert status == 1 and result["gate"] == "INCONCLUSIVE"
    assert result["p_value"] == pytest.approx(0.5413, abs=1e-4)
    assert result["mde"] == pytest.approx(2.8016 * math.sqrt(0.024 / 1000), rel=1e-3)  # ~1.4 points
    assert result["accuracy"] == {"before": 0.86, "after": 0.856} and result["items_needed"] > 10_000
    flips = result["flips"]
    assert [f["direction"] for f in flips].count("right_to_wrong") == 14 and len(flips) == 24
    assert {f["id"] for f in flips if f["direction"] == "right_to_wrong"} == {str(i) for i in range(14)}
    assert all(f["margin_before"] == pytest.approx(2.0) and f["margin_after"] == pytest.approx(1.0)
               and not f["near_tie"] for f in flips)
    status, out, _ = eval_diff(capsys, a, b)
    assert status == 1
    assert "accuracy 86.00 % -> 85.60 % (-0.40 points)" in out
    assert "flips: 14 right->wrong, 10 wrong->right (churn 2.4 %); 0 at a near tie" in out
    assert "exact McNemar p = 0.541; minimum detectable effect 1.37 points" in out
    assert "gate: INCONCLUSIVE" in out and "takes about 11,774 items" in out
    assert "  right->wrong  0  margin 2 -> 1  choice 0 -> 1  (confident)" in out


def test_the_same_flips_at_near_ties_are_allowed_and_a_large_loss_is_rejected(tmp_path, capsys):
    a, b = eval_files(tmp_path, 1000, 14, 10, margin=0.03)
    status, out, _ = eval_diff(capsys, a, b, "--json")
    assert status == 0 and json.loads(out)["gate"] == "ALLOW"
    assert all(flip["near_tie"] for flip in json.loads(out)["flips"])
    # the tie margin is the user's: at 0.01 the same flips are confident
    status, out, _ = eval_diff(capsys, a, b, "--json", "--tie-margin", "0.01")
    assert status == 1 and json.loads(out)["gate"] == "INCONCLUSIVE"
    a, b = eval_files(tmp_path, 1000, 40, 5)
    status, out, _ = eval_diff(capsys, a, b, "--json")
    assert status == 1 and json.loads(out)["gate"] == "REJECT" and json.loads(out)["p_value"] < 1e-6
    status, out, _ = eval_diff(capsys, b, a)  # the other way round: a significant gain
    assert status == 0 and "gate: ALLOW - the accuracy rose significantly" in out


def test_identical_runs_allow_with_no_flip(tmp_path, capsys):
    a, _ = eval_files(tmp_path, 50)
    status, out, _ = eval_diff(capsys, a, a)
    assert status == 0 and "gate: ALLOW - no item changed its correctness" in out


def test_acc_norm_margins_are_per_character_of_the_continuation(tmp_path, capsys):
    line = sample(0, 1, 1, 0.5)
    line["arguments"] = [["q", " a"], ["q", " a much longer answer"], ["q", " c"], ["q", " d"]]
    line["filtered_resps"] = [[-2.0, True], [-2.5, False], [-9.0, False], [-9.0, False]]
    line["acc_norm"] = 1.0  # per character, the long answer wins: -2.5/21 against -2.0/2
    worse = {**line, "acc_norm": 0.0,
             "filtered_resps": [[-0.1, True], [-2.5, False], [-9.0, False], [-9.0, False]]}
    a, b = write(tmp_path / "a.jsonl", [line]), write(tmp_path / "b.jsonl", [worse])
    _, out, _ = eval_diff(capsys, a, b, "--json", "--metric", "acc_norm")
    flip = json.loads(out)["flips"][0]
    assert flip["margin_before"] == pytest.approx(-2.5 / 21 - -2.0 / 2)
    assert flip["margin_after"] == pytest.approx(-0.1 / 2 - -2.5 / 21)
    _, out, _ = eval_diff(capsys, a, b, "--json", "--metric", "acc")  # raw log-likelihoods: choice 0 by 0.5
    assert json.loads(out)["flips"] == []  # acc, taken from the lines, did not change


def test_generative_items_flips_are_unclassified_never_near_ties(tmp_path, capsys):
    def line(doc_id, answer, right):
        return {"doc_id": doc_id, "target": "4", "resps": [[answer]], "filtered_resps": [answer],
                "filter": "strict-match", "metrics": ["exact_match"], "exact_match": float(right)}

    a = write(tmp_path / "a.jsonl", [line(0, "4", True), line(1, "5", False)])
    b = write(tmp_path / "b.jsonl", [line(0, "3", False), line(1, "5", False)])
    status, out, _ = eval_diff(capsys, a, b)
    assert status == 1 and "gate: INCONCLUSIVE" in out
    assert "right->wrong  0  margin - -> -  choice '4' -> '3'  (unclassified: no margin recorded)" in out


def test_bad_input_is_one_message_naming_the_fix_and_exit_2(tmp_path, capsys):
    a, b = eval_files(tmp_path, 10)
    results = write(tmp_path / "results_x.json", [{"results": {"mc": {"acc,none": 0.86}}}])
    status, _, err = eval_diff(capsys, a, results)
    assert status == 2 and "results_x.json:1 is not a line of an lm-evaluation-harness samples file" in err
    assert "not its results_*.json" in err
    status, _, err = eval_diff(capsys, a, tmp_path / "missing.jsonl")
    assert status == 2 and "missing.jsonl: no such file" in err
    short = write(tmp_path / "short.jsonl", [sample(i, 0, 0, 3.0) for i in [*range(8), 99]])
    status, _, err = eval_diff(capsys, a, short)
    assert status == 2
    assert ("the runs hold different items: 2 only in the first run ('8', '9'); "
            "1 only in the second run ('99')") in err
    two = write(tmp_path / "two.jsonl", [sample(i, 0, 0, 3.0, filter_name=name)
                                         for name in ("strict-match", "flexible-extract") for i in range(10)])
    status, _, err = eval_diff(capsys, a, two)
    assert status == 2
    assert "several lm-eval filters (flexible-extract, strict-match). Choose one with --filter" in err
    status, _, err = eval_diff(capsys, two, two, "--filter", "strict-match")
    assert status == 0
    graded = write(tmp_path / "graded.jsonl", [{**sample(i, 0, 0, 3.0), "acc": 0.37} for i in range(10)])
    status, _, err = eval_diff(capsys, a, graded)
    assert status == 2 and "the metric 'acc' is 0.37, not a per-item 0 or 1" in err
    moved = write(tmp_path / "moved.jsonl", [sample(i, 0, 0, 3.0, doc_hash=f"h{i}") for i in range(10)])
    other = write(tmp_path / "other.jsonl", [sample(i, 0, 0, 3.0, doc_hash=f"h{i}" if i != 4 else "x")
                                             for i in range(10)])
    status, _, err = eval_diff(capsys, moved, other)
    assert status == 2 and "1 item(s) hold another input in the second run ('4')" in err
    with pytest.raises(SystemExit) as stopped:
        cli.main(["eval-diff", str(a), str(b), "--alpha", "1.5"])
    assert stopped.value.code == 2 and "not a probability" in capsys.readouterr().err


def test_an_item_id_cannot_write_to_the_terminal(tmp_path, capsys):
    a = write(tmp_path / "a.jsonl", [sample("\x1b]52;c;cHduZWQ=\x07", 0, 0, 3.0)])
    b = write(tmp_path / "b.jsonl", [sample("\x1b]52;c;cHduZWQ=\x07", 1, 0, 3.0)])
    status, out, _ = eval_diff(capsys, a, b)
    assert status == 1 and "\x1b" not in out and "\\x1b]52;c;cHduZWQ=\\x07" in out


def eval_golden_file(path, goldens):
    from pytest_llmdeterminism.goldens import schema, store

    store.write(path, {key: {"cpu/float32": schema.to_entry(value)} for key, value in goldens.items()})
    return path


def evaluation(wrong=()):
    from pytest_llmdeterminism.generation import CHOICE, EvalItem, Evaluation, digest

    items = tuple(EvalItem(id=f"q{i}", form=CHOICE, choice=0, correct=i % 4 != 0 and f"q{i}" not in wrong,
                           margin=2.0, input=digest("prompt", i), numbers=digest("n", i), scores=(-1.0, -3.0))
                  for i in range(20))
    return Evaluation(items=items, batch_shape="4x32", settings={"acc_norm": False},
                      fingerprint={"device_class": "cpu", "dtype": "float32"})


def test_eval_golden_files_are_runs_too_and_a_file_of_several_is_read_by_key(tmp_path, capsys):
    from tests.helpers.strategies import sample_generation

    a = eval_golden_file(tmp_path / "a.json", {"test_eval": evaluation(), "test_other": evaluation()})
    b = eval_golden_file(tmp_path / "b.json", {"test_eval": evaluation(wrong={"q0", "q1", "q2"}),
                                               "test_other": evaluation()})
    status, out, err = eval_diff(capsys, a, b)
    assert status == 2 and "a.json holds 2 eval goldens. Name one with --key (test_eval, test_other)" in err
    status, out, _ = eval_diff(capsys, a, b, "--key", "test_eval", "--json")
    result = json.loads(out)
    assert status == 1 and [flip["id"] for flip in result["flips"]] == ["q1", "q2"]  # q0 was wrong already
    status, out, _ = eval_diff(capsys, a, b, "--key", "test_other")
    assert status == 0 and "no item changed its correctness" in out
    generations = eval_golden_file(tmp_path / "g.json", {"test_gen": sample_generation()})
    status, _, err = eval_diff(capsys, generations, a)
    assert status == 2 and "g.json holds no eval golden. Give a golden file that" in err


def test_a_fifo_is_refused_without_blocking(tmp_path, capsys):
    import os

    a, _ = eval_files(tmp_path, 10)
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    status, _, err = eval_diff(capsys, a, fifo)
    assert status == 2 and "pipe.jsonl is not a regular file" in err
