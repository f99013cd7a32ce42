"""Score goldens (issue 42): the ``kind`` field of golden format 3, score entries' validation, and
old goldens (formats 1 and 2) still read as generations, their bytes kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_llmdeterminism import GoldenFileError
from pytest_llmdeterminism.generation import Generation, Score
from pytest_llmdeterminism.goldens import codec, schema, store
from tests.helpers.strategies import sample_generation, sample_score

ROOT = Path(__file__).resolve().parents[2]
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
                                            "\"generation\" or \"score\""),
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
