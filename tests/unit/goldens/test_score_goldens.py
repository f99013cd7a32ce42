"""Score goldens (issue 42): the ``kind`` field of golden format 3, score entries' validation, and
old goldens (formats 1 and 2) still read as generations, their bytes kept."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pytest_llmdeterminism import GoldenFileError
from pytest_llmdeterminism.generation import Generation, HashDefinition, Score
from pytest_llmdeterminism.goldens import codec, schema, store
from pytest_llmdeterminism.goldens.review import review_goldens
from pytest_llmdeterminism.judge.compare import Verdict, compare
from pytest_llmdeterminism.judge.decision import Written, decide
from pytest_llmdeterminism.judge.judgement import judge_with
from pytest_llmdeterminism.judge.tolerance import Profile, ProfileName, default_profile, parse_profile
from pytest_llmdeterminism.reporting import failure
from pytest_llmdeterminism.reporting.records import CheckRecord
from tests.helpers.strategies import moved_score, sample_generation, sample_score

ROOT = Path(__file__).resolve().parents[3]  # the checkout: this module is in tests/unit/goldens/
near_tie = default_profile("float32", same_environment=False)
OLD_GOLDENS = ["tests/data/test_tiny_model.portable-avx2-format-1.json",
               "tests/data/test_tiny_model.portable-generic-0.2.json",
               "examples/__golden__/test_tiny_model.json"]


def _file(tmp_path: Path, goldens: dict) -> Path:
    path = tmp_path / "test_m.json"
    path.write_text(codec.dumps(goldens))
    return path


@pytest.mark.parametrize("prompt_logprobs", [False, True])
def test_a_score_round_trips_through_a_format_3_golden(tmp_path, prompt_logprobs):
    score = sample_score(prompt_logprobs=prompt_logprobs)
    path = _file(tmp_path, {"test_x": {"cpu/float32": schema.to_entry(score)}})
    data = path.read_bytes()
    document = json.loads(data)
    assert document["schema"] == "pytest-llmdeterminism/golden/3"
    entry = document["goldens"]["test_x"]["cpu/float32"]
    assert entry["kind"] == "score" and entry["steps"] == [] and len(entry["positions"]) == 3
    goldens = store.read(path)
    assert schema.from_entry(goldens["test_x"]["cpu/float32"]) == score
    assert codec.dumps(goldens).encode() == data  # written as read
    # the fast duplicate-key proof counts a score entry's keys (no fallback to the slow check)
    assert codec._no_duplicate_keys(data, goldens, header_keys=1)


def test_a_file_of_generations_is_still_written_in_format_2_and_a_score_makes_it_3():
    generation = {"test_g": {"cpu/float32": schema.to_entry(sample_generation())}}
    assert json.loads(codec.dumps(generation))["schema"] == "pytest-llmdeterminism/golden/2"
    both = {**generation, "test_s": {"cpu/float32": schema.to_entry(sample_score())}}
    assert json.loads(codec.dumps(both))["schema"] == "pytest-llmdeterminism/golden/3"


@pytest.mark.parametrize("name", OLD_GOLDENS)
def test_format_1_and_2_goldens_read_as_generations_and_keep_their_bits(tmp_path, name):
    committed = (ROOT / name).read_text()
    goldens = store.read(ROOT / name)
    entries = [entry for variants in goldens.values() for entry in variants.values()]
    assert entries and all(entry.kind == "generation" for entry in entries)
    assert all(isinstance(schema.from_entry(entry), Generation) for entry in entries)
    copy = tmp_path / "test_m.json"
    copy.write_text(committed)
    store.merge(copy, {})  # rewritten: a format-2 file keeps every byte, a format-1 file its entries
    rewritten = copy.read_text()
    assert json.loads(rewritten)["schema"] == "pytest-llmdeterminism/golden/2"
    if '"schema": 1' not in committed:
        assert rewritten == committed
    assert store.read(copy) == goldens


def _broken(tmp_path: Path, edit) -> Path:
    document = json.loads(codec.dumps({"test_x": {"cpu/float32": schema.to_entry(sample_score())}}))
    edit(document["goldens"]["test_x"]["cpu/float32"])
    path = tmp_path / "test_m.json"
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda e: e.update(kind="perplexity"), "kind: Invalid enum value 'perplexity' (an entry's kind is "
                                            "\"generation\", \"score\" or \"eval\""),
    (lambda e: e.pop("kind"), "has 'positions', which only a score entry has: add \"kind\": \"score\""),
    (lambda e: e.update(positions=[]), "is a score entry (\"kind\": \"score\") without its 'positions'"),
    (lambda e: e.update(steps=[{"hash": "0" * 16, "margin": 1.0, "piece": "", "token": 1,
                                "top": [[1, -1.0]]}]), "with a generation's fields"),
    (lambda e: e["positions"][0].update(rank=0), "Expected `int` >= 1"),
    (lambda e: e["positions"][0].update(logprob=0.5), "Expected `float` <= 0.0"),
    (lambda e: e["positions"][0].update(top=[]), "position 0 has an empty 'top'"),
    (lambda e: e.update(prompt_logprobs=[-1.0]), "'prompt_logprobs' has 1 values for 2 prompt tokens"),
])
def test_a_corrupt_score_entry_is_one_golden_file_error_naming_the_fix(tmp_path, edit, problem):
    path = _broken(tmp_path, edit)
    with pytest.raises(GoldenFileError) as raised:
        store.read(path)
    message = str(raised.value)
    assert "has a malformed golden: ['test_x']['cpu/float32'] " in message
    assert problem in message
    assert "git checkout --" in message  # the fix


def test_a_score_entry_in_memory_converts_to_a_score_and_is_validated_once():
    entry = schema.to_struct(schema.to_entry(sample_score()))
    assert schema.to_struct(entry) is entry
    assert isinstance(schema.from_entry(entry), Score)
    assert schema.entry_problem({**schema.to_entry(sample_score()), "positions": []})


# -- comparing two scores --------------------------------------------------------------------------

def test_the_same_score_is_identical():
    comparison = compare(sample_score(), sample_score())
    assert comparison.verdict is Verdict.IDENTICAL and comparison.score is not None
    assert comparison.score.moved == () and comparison.score.expected_total == sample_score().total


def test_a_logprob_moved_within_the_tolerance_is_logit_drift_and_named_by_position():
    golden = sample_score()
    comparison = compare(golden, moved_score(golden, 2, -1.0004))
    assert comparison.verdict is Verdict.LOGIT_DRIFT and comparison.first_hash_step == 2
    (change,) = comparison.score.moved
    assert (change.position, change.token, change.expected_logprob, change.actual_logprob) \
        == (2, 32, -1.0, -1.0004)
    assert comparison.max_logprob_delta == pytest.approx(4e-4)
    assert comparison.score.actual_total == pytest.approx(golden.total - 4e-4)
    assert near_tie.accepts(comparison) and not Profile(ProfileName.EXACT).accepts(comparison)


def test_a_logprob_moved_beyond_the_tolerance_is_logit_drift_the_profile_fails_as_for_a_generation():
    # The verdict says what happened whatever the tolerance (issue 49 F1: a tolerance's atol made it a
    # REGRESSION in the run, while `llm-golden diff`, judging without it, said otherwise).
    golden = sample_score()
    comparison = compare(golden, moved_score(golden, 0, -0.7))
    assert comparison.verdict is Verdict.LOGIT_DRIFT and comparison.score.moved[0].delta == pytest.approx(0.2)
    assert not near_tie.accepts(comparison) and Profile(ProfileName.TOKENS).accepts(comparison)
    assert judge_with(golden, moved_score(golden, 0, -0.7), near_tie) == (comparison, False)


def test_a_rank_change_at_a_planted_near_tie_is_rank_flip_judged_like_tie_flip():
    golden = sample_score()  # position 1: the given token is 0.01 below the top-1
    flipped = moved_score(golden, 1, -0.6995, rank=1)
    comparison = compare(golden, flipped, tie_margin=0.05)
    assert comparison.verdict is Verdict.RANK_FLIP
    (change,) = comparison.score.rank_changes
    assert (change.position, change.expected_rank, change.actual_rank, change.rank_margin) == (1, 2, 1, 0.01)
    assert near_tie.accepts(comparison) and not Profile(ProfileName.TOKENS).accepts(comparison)
    # the same change where the golden's margin was confident is a regression
    assert compare(golden, flipped, tie_margin=0.005).verdict is Verdict.REGRESSION
    assert compare(golden, moved_score(golden, 0, -0.5001, rank=2)).verdict is Verdict.REGRESSION


def test_judge_takes_the_atol_and_the_tie_margin_from_the_profile():
    golden = sample_score()
    assert judge_with(golden, moved_score(golden, 2, -1.0004), near_tie) == (
        compare(golden, moved_score(golden, 2, -1.0004)), True)
    close = parse_profile("close(atol=1e-4)")
    comparison, passed = judge_with(golden, moved_score(golden, 2, -1.0004), close)
    assert comparison.verdict is Verdict.LOGIT_DRIFT and not passed
    assert judge_with(golden, moved_score(golden, 2, -1.5), Profile(ProfileName.TOKENS)) == (
        compare(golden, moved_score(golden, 2, -1.5)), True)


@pytest.mark.parametrize(("change", "field"), [
    ({"token_ids": (30, 31, 99)}, "continuation"),
    ({"prompt_token_ids": (1, 3)}, "prompt_token_ids"),
    ({"batch_shape": "2x8"}, "batch_shape"),
    ({"prompt_logprobs": (None, -1.0)}, "settings.prompt_logprobs"),
    ({"top_logprobs": tuple(top[:1] for top in sample_score().top_logprobs)}, "settings.top_k"),
])
def test_a_changed_input_of_a_score_is_input_changed_naming_it(change, field):
    comparison = compare(sample_score(), dataclasses.replace(sample_score(), **change))
    assert comparison.verdict is Verdict.INPUT_CHANGED
    assert [name for name, _, _ in comparison.input_changes] == [field]


def test_a_generation_golden_checked_with_a_score_is_input_changed_naming_the_kind():
    assert compare(sample_generation(), sample_score()).input_changes == (("kind", "generation", "score"),)
    assert compare(sample_score(), sample_generation()).input_changes == (("kind", "score", "generation"),)


def test_scores_of_two_engines_are_never_identical_and_report_every_moved_position():
    golden = sample_score()
    other = dataclasses.replace(golden, hash_definition=HashDefinition.SERVED_TOPK)
    comparison = compare(golden, other)
    assert comparison.verdict is Verdict.LOGIT_DRIFT
    assert comparison.hash_definitions == ("logits", "served-topk")


# -- deciding, wording and recording a score check -------------------------------------------------

def test_a_failing_score_check_names_the_positions_that_moved_most_and_the_log_likelihood():
    golden = sample_score()
    actual = moved_score(moved_score(golden, 0, -0.9), 2, -1.0002, hash_="eeeeeeeeeeeeeeee")
    decision = decide(actual, golden=golden, variant="cpu/float32", explicit=None, update=None)
    assert decision.comparison.verdict is Verdict.LOGIT_DRIFT and decision.fails  # as a generation's drift
    text = failure.message(decision, "test_s", location="g.json", nodeid="t.py::test_s", attempt=1)
    assert text.splitlines()[0] == (
        "golden mismatch in 'test_s': LOGIT_DRIFT (score) at position 0 — 2 of 3 positions' logprobs moved, "
        "max |Δlogprob| in top-k 0.4 — fails under 'exact'")
    assert "log-likelihood of the continuation (3 tokens): -2.200000 -> -2.600200" in text
    assert "[0] 'x' (id 30): -0.500000 -> -0.900000 (Δ -0.4)" in text
    assert "[2] 'z' (id 32): -1.000000 -> -1.000200" in text
    assert text.index("[0] 'x'") < text.index("[2] 'z'")  # the largest move first
    record = CheckRecord.of(decision, name="test_s")
    assert record.kind == "score" and record.log_likelihood == (golden.total, actual.total)
    assert [(p.position, p.piece, p.actual_logprob) for p in record.moved_positions] == [
        (0, "x", -0.9), (2, "z", -1.0002)]
    assert record.expected_text == record.actual_text == "xyz"


def test_a_rank_flip_names_the_token_its_ranks_and_the_near_tie():
    golden = sample_score()
    decision = decide(moved_score(golden, 1, -0.6995, rank=1), golden=golden, variant="cpu/float32",
                      explicit=Profile(ProfileName.EXACT), update=None)
    assert decision.comparison.verdict is Verdict.RANK_FLIP and decision.fails
    text = failure.message(decision, "k", location="g.json", nodeid="t.py::t", attempt=1)
    assert ("the rank of 'y' (id 31) at position 1 changed #2 -> #1; golden rank margin 0.01 < tie margin "
            "0.05: near tie") in text
    assert "the given token's rank changed at 1 position(s): 1 (#2 -> #1)" in text
    # judged like TIE_FLIP: the near_tie profile passes it, and an update re-records it
    assert decide(moved_score(golden, 1, -0.6995, rank=1), golden=golden, variant="cpu/float32",
                  explicit=near_tie, update="all").write is Written.UPDATED


def test_a_score_checked_against_a_generation_golden_is_input_changed_with_the_fix():
    decision = decide(sample_score(), golden=sample_generation(), variant="cpu/float32", explicit=None,
                      update=None)
    assert decision.comparison.verdict is Verdict.INPUT_CHANGED
    text = failure.message(decision, "k", location="g.json", nodeid="t.py::t", attempt=1)
    assert "INPUT_CHANGED — kind" in text
    assert "kind: generation -> score (the golden holds a generation, this check gave a score: give the " \
           "score check its own name" in text


def test_a_changed_continuation_is_shown_as_text_and_ids():
    golden = sample_score()
    changed = dataclasses.replace(golden, token_ids=(30, 31, 77), continuation="xyQ")
    decision = decide(changed, golden=golden, variant="cpu/float32", explicit=None, update=None)
    text = failure.message(decision, "k", location="g.json", nodeid="t.py::t", attempt=1)
    assert "INPUT_CHANGED — continuation" in text
    assert "continuation: 'xyz' -> 'xyQ'" in text and "differ from position 2 (3 -> 3 ids)" in text


# -- the review tools: diff, show, review, accept ----------------------------------------------------

def _score_files(tmp_path: Path) -> tuple[Path, Path]:
    """A project with a score golden (and a generation's) and a candidates folder whose score moved at
    its planted near tie (RANK_FLIP)."""
    root, cands = tmp_path / "root", tmp_path / "root" / "cands"
    golden, candidate = root / "__golden__" / "test_x.json", cands / "__golden__" / "test_x.json"
    for path in (golden, candidate):
        path.parent.mkdir(parents=True)
    (root / "tox.ini").write_text("[pytest]\n")
    (root / "test_x.py").write_text("")
    generation = {"cpu/float32": schema.to_entry(sample_generation())}
    golden.write_text(codec.dumps({"test_s": {"cpu/float32": schema.to_entry(sample_score())},
                                   "test_g": generation}))
    moved = moved_score(sample_score(), 1, -0.6995, rank=1)
    candidate.write_text(codec.dumps({"test_s": {"cpu/float32": schema.to_entry(moved)}}))
    return root, cands


def test_diff_show_and_review_word_a_score_golden(tmp_path, capsys):
    from pytest_llmdeterminism.cli import review as review_cli
    from pytest_llmdeterminism.cli.diff import diff
    from pytest_llmdeterminism.cli.show import show

    root, cands = _score_files(tmp_path)
    golden, candidate = root / "__golden__" / "test_x.json", cands / "__golden__" / "test_x.json"
    assert diff(golden, candidate, fail_on="regression") == 0  # a RANK_FLIP is no regression
    assert diff(golden, candidate, fail_on="tie_flip") == 1
    out = capsys.readouterr().out
    assert "RANK_FLIP" in out and "score: log-likelihood -2.2000 -> -2.1995" in out
    assert "rank at position 1 2 -> 1 (rank margin 0.01 < tie margin 0.05: near tie)" in out
    (case,) = [c for c in review_goldens("test_x.json", store.read(golden), store.read(candidate))
               if c.key == "test_s"]
    assert case.verdict == "RANK_FLIP"
    detail = "\n".join(review_cli._detail(case))
    assert "log-likelihood of the continuation (3 tokens): -2.200000 -> -2.199500" in detail
    assert "[1] 'y' (id 31): -0.700000 -> -0.699500 (Δ +0.0005, rank #2 -> #1)" in detail
    assert show(golden) == 0
    shown = capsys.readouterr().out
    assert "test_s [cpu/float32]  score, shape 1x8, log-likelihood -2.200000 over 3 tokens" in shown
    assert ("     1  'y'              id 31      logprob  -0.700000 rank    2 rank margin    0.010  "
            "<- near tie") in shown


def test_accept_only_rank_flip_writes_the_score_golden(tmp_path, monkeypatch, capsys):
    from pytest_llmdeterminism import cli

    root, cands = _score_files(tmp_path)
    monkeypatch.chdir(root)
    assert cli.main(["accept", "cands", "--only", "RANK_FLIP"]) == 0
    assert "accepted RANK_FLIP" in capsys.readouterr().out
    accepted = store.read(root / "__golden__" / "test_x.json")
    expected = moved_score(sample_score(), 1, -0.6995, rank=1)
    assert schema.from_entry(accepted["test_s"]["cpu/float32"]) == expected
    assert "test_g" in accepted  # the generation golden beside it kept


def test_a_rank_one_side_does_not_know_is_no_rank_change_unless_it_fell_inside_the_others_top_k():
    golden = sample_score()  # top-2 at every position; ranks 1, 2, 1
    unknown = dataclasses.replace(golden, ranks=(1, 2, None))  # a server: position 2 outside its top-k
    assert compare(golden, unknown).score.rank_changes[0].position == 2  # rank 1 was inside the top-2
    deep = dataclasses.replace(golden, ranks=(1, 2, 40))
    assert compare(deep, dataclasses.replace(golden, ranks=(1, 2, None))).verdict is Verdict.IDENTICAL


def test_assert_on_two_scores_shows_the_positions_thatmoved_score():
    from pytest_llmdeterminism.plugin import pytest_assertrepr_compare

    golden = sample_score()
    lines = pytest_assertrepr_compare("==", moved_score(golden, 0, -0.9), golden)
    assert lines[0].startswith("Score == Score: LOGIT_DRIFT (score) at position 0")
    assert "    [0] 'x' (id 30): -0.500000 -> -0.900000 (Δ -0.4)" in lines


def test_a_score_that_fails_only_on_its_drift_across_environments_names_the_atol_that_would_pass():
    from pytest_llmdeterminism.reporting.hints import wider_tolerance

    golden = sample_score()
    drifted = compare(golden, moved_score(golden, 0, -0.62))  # beyond atol, no rank changed
    assert drifted.verdict is Verdict.LOGIT_DRIFT
    assert wider_tolerance(drifted, dtype="float32").endswith(
        "--llm-tolerance='near_tie(margin=0.05, atol=0.2)'")
    confident = compare(golden, moved_score(golden, 0, -0.62, rank=2))  # a confident rank change
    assert wider_tolerance(confident, dtype="float32") == ""
