"""Golden files: round trips, stable formatting, atomic writes, and loud failures on bad files."""

import dataclasses
import difflib
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_llmdeterminism.errors import GoldenFileError
from pytest_llmdeterminism.generation import HashDefinition
from pytest_llmdeterminism.goldens import codec, schema, store
from tests.helpers import ROOT
from tests.helpers.strategies import generations


@given(generations())
def test_generation_round_trips_through_the_file_format(gen):
    text = codec.dumps({"test_x": {gen.variant: schema.to_entry(gen)}})
    loaded = schema.from_entry(json.loads(text)["goldens"]["test_x"][gen.variant])
    assert loaded == gen
    assert loaded.fingerprint == gen.fingerprint


@given(st.lists(generations(steps=st.integers(1, 4)), min_size=1, max_size=4))
def test_formatting_is_stable_and_sorted(gens):
    goldens = {f"test_{i}": {g.variant: schema.to_entry(g)} for i, g in enumerate(gens)}
    text = codec.dumps(goldens)
    again = codec.dumps(json.loads(text)["goldens"])
    assert text == again
    assert text.endswith("}\n")
    # One line per generated step, so a review diff shows exactly the steps that changed.
    step_lines = [line for line in text.splitlines() if line.lstrip().startswith('{"hash"')]
    assert len(step_lines) == sum(len(g.token_ids) for g in gens)


def _write_one(tmp_path, gen):
    path = tmp_path / "__golden__" / "test_m.json"
    store.write(path, {"test_x": {gen.variant: schema.to_entry(gen)}})
    return path


@given(gen=generations(steps=st.integers(1, 3)), cut=st.integers(min_value=2, max_value=10_000))
@settings(max_examples=50)
def test_truncated_file_never_passes_silently(tmp_path_factory, gen, cut):
    # Cutting only the final newline leaves valid JSON; any deeper cut must be caught.
    path = _write_one(tmp_path_factory.mktemp("g"), gen)
    data = path.read_bytes()
    path.write_bytes(data[: max(0, len(data) - cut)])
    with pytest.raises(GoldenFileError) as info:
        store.read(path)
    assert str(path) in str(info.value)


def test_corrupt_file_error_names_the_file_and_the_fix(tmp_path):
    path = tmp_path / "test_m.json"
    path.write_text('{"schema": 1, "goldens": {')
    with pytest.raises(GoldenFileError,
                       match=r"test_m.json' is not valid JSON.*left untouched.*git checkout"):
        store.read(path)


@pytest.mark.parametrize(("content", "problem"), [
    ('{"schema": 99, "goldens": {}}', "has schema version 99, which no pytest-llmdeterminism wrote; this "
     "pytest-llmdeterminism reads \"schema\": 'pytest-llmdeterminism/golden/3' and, from older files, "
     "'pytest-llmdeterminism/golden/2' and \"schema\": 1"),
    ('{"goldens": {}}', "no 'schema' field"),
    ("[1, 2]", "no 'schema' field"),
])
def test_unknown_schema_is_named(tmp_path, content, problem):
    path = tmp_path / "test_m.json"
    path.write_text(content)
    with pytest.raises(GoldenFileError, match=re.escape(problem)):
        store.read(path)


def test_changed_hash_definition_is_a_schema_error(tmp_path):
    path = tmp_path / "test_m.json"
    path.write_text(json.dumps({"schema": 1, "logit_hash": "md5 of something else", "goldens": {}}))
    with pytest.raises(GoldenFileError, match="hashes logits as 'md5 of something else'"):
        store.read(path)


def test_a_golden_file_names_its_format_by_a_versioned_id_not_a_sentence(tmp_path):
    from tests.helpers.strategies import sample_generation

    text = codec.dumps({"test_x": {"cpu/float32": schema.to_entry(sample_generation())}})
    document = json.loads(text)
    assert set(document) == {"goldens", "schema"} and document["schema"] == "pytest-llmdeterminism/golden/2"
    assert text.endswith('  "schema": "pytest-llmdeterminism/golden/2"\n}\n')
    path = tmp_path / "test_m.json"
    path.write_text(text)
    assert list(store.read(path)) == ["test_x"]


@pytest.mark.parametrize("engine", ["served-topk", "vllm-topk"])
def test_a_server_golden_says_what_its_own_hashes_hash(engine):
    """Format 1's header named the logits for the whole file, false for an entry of a server."""
    from tests.helpers.strategies import sample_generation

    generation = dataclasses.replace(sample_generation(), hash_definition=HashDefinition(engine))
    document = json.loads(codec.dumps({"test_x": {"cpu/float32": schema.to_entry(generation)}}))
    assert "logit_hash" not in document
    assert document["goldens"]["test_x"]["cpu/float32"]["step_hash"] == engine


FORMAT_1_EXAMPLES = "tests/data/test_tiny_model.portable-avx2-format-1.json"


@pytest.mark.parametrize("name", [FORMAT_1_EXAMPLES,
                                  "tests/data/test_tiny_model.intel-avx512-native-0.1.0.json",
                                  "tests/data/test_tiny_model.portable-generic-0.2.json"])
def test_format_1_goldens_still_read_and_are_rewritten_in_format_2_only_when_written(tmp_path, name):
    committed = ROOT / name
    legacy = committed.read_text()
    assert '  "schema": 1\n' in legacy and '"logit_hash": ' in legacy
    goldens = store.read(committed)
    assert goldens and committed.read_text() == legacy  # read as they are, never rewritten on reading
    copy = tmp_path / "test_m.json"
    copy.write_text(legacy)
    store.merge(copy, {})
    assert store.read(copy) == goldens
    assert json.loads(copy.read_text())["schema"] == "pytest-llmdeterminism/golden/2"


def test_rewriting_a_format_1_golden_changes_only_its_header(tmp_path):
    """No churn: a format-1 file keeps its entries' lines when it is next written."""
    legacy = (ROOT / FORMAT_1_EXAMPLES).read_text()
    copy = tmp_path / "test_m.json"
    copy.write_text(legacy)
    store.merge(copy, {})
    changed = [line for line in difflib.ndiff(legacy.splitlines(), copy.read_text().splitlines())
               if line[:2] in ("- ", "+ ")]
    assert sorted(line[:2] + line[2:].split(":")[0].strip() for line in changed) == [
        '+ "schema"', '- "logit_hash"', '- "schema"']


@pytest.mark.parametrize(("schema_value", "problem"), [
    ("pytest-llmdeterminism/golden/4",
     "is in golden format 4 ('pytest-llmdeterminism/golden/4'), newer than this pytest-llmdeterminism "
     "reads (format 3, 'pytest-llmdeterminism/golden/3', and older). The file was left untouched. A newer "
     "pytest-llmdeterminism wrote it: upgrade (pip install -U pytest-llmdeterminism)."),
    ("pytest-llmdeterminism/golden/12", "is in golden format 12"),
    ("pytest-llmdeterminism/report", "has schema version 'pytest-llmdeterminism/report' (a str), which no"),
])
def test_a_golden_of_a_newer_format_names_the_version_and_the_upgrade(tmp_path, schema_value, problem):
    path = tmp_path / "test_m.json"
    path.write_text(json.dumps({"goldens": {"test_x": {"cpu/float32": {"future": "field"}}},
                                "schema": schema_value}))
    with pytest.raises(GoldenFileError, match=re.escape(problem)):
        store.read(path)


def test_format_2_has_no_logit_hash_sentence(tmp_path):
    path = tmp_path / "test_m.json"
    path.write_text(json.dumps({"goldens": {}, "logit_hash": codec.LEGACY_LOGIT_HASH,
                                "schema": "pytest-llmdeterminism/golden/2"}))
    with pytest.raises(GoldenFileError, match="has a 'logit_hash' field, which format "
                                              "'pytest-llmdeterminism/golden/2' does not have"):
        store.read(path)


def test_malformed_entry_is_named(tmp_path):
    path = tmp_path / "test_m.json"
    path.write_text(codec.dumps({"test_x": {"cpu/float32": {"prompt": "x"}}}))
    with pytest.raises(GoldenFileError, match=r"malformed golden: \['test_x'\]\['cpu/float32'\] "
                       r"Object missing required field `batch_shape`"):
        store.read(path)


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda step: step.pop("hash"),
     r"\['test_x'\]\['cpu/float32'\] steps\[0\]: Object missing required field `hash`"),
    (lambda step: step.update(token="x"), r"steps\[0\].token: Expected `int`, got `str`"),
    (lambda step: step.update(top=[[1]]), r"steps\[0\].top\[0\]: Expected `array` of length 2, got 1"),
    (lambda step: step.update(margin=None), r"steps\[0\].margin: Expected `float`, got `null`"),
    (lambda step: step.update(margin=-1.0), r"steps\[0\].margin: Expected `float` >= 0.0"),
    (lambda step: step.update(token=-3), r"steps\[0\].token: Expected `int` >= 0"),
])
def test_hand_edited_step_is_named(tmp_path, edit, problem):
    from tests.helpers.strategies import sample_generation

    entry = schema.to_entry(sample_generation())
    edit(entry["steps"][0])
    path = tmp_path / "test_m.json"
    path.write_text(codec.dumps({"test_x": {"cpu/float32": entry}}))
    with pytest.raises(GoldenFileError, match=problem):
        store.read(path)


def test_missing_file_reads_as_empty(tmp_path):
    assert store.read(tmp_path / "nope.json") == {}


@given(generations(steps=st.integers(1, 3)), generations(steps=st.integers(1, 3)))
@settings(max_examples=20)
def test_merge_keeps_other_keys_and_variants(tmp_path_factory, first, second):
    path = tmp_path_factory.mktemp("m") / "test_m.json"
    store.write(path, {"test_a": {"cpu/float32": schema.to_entry(first)},
                       "test_b": {"cuda/bfloat16": schema.to_entry(first)}})
    store.merge(path, {"test_b": {"cpu/float32": schema.to_entry(second)}})
    goldens = store.read(path)
    assert schema.from_entry(goldens["test_a"]["cpu/float32"]) == first
    assert schema.from_entry(goldens["test_b"]["cuda/bfloat16"]) == first
    assert schema.from_entry(goldens["test_b"]["cpu/float32"]) == second
    assert [p.name for p in path.parent.iterdir()] == ["test_m.json"]  # no temp file left behind


def test_write_failure_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "test_m.json"
    path.write_text("original")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(store.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        store.write(path, {})
    assert path.read_text() == "original"
    assert [p.name for p in tmp_path.iterdir()] == ["test_m.json"]
