"""The golden loader fuzzed: a golden file with bytes flipped, deleted or inserted, a field given any
JSON value, or any goldens section either fails as a GoldenFileError or gives goldens that every
consumer (compare, the run's records, the JSON, HTML and Markdown reports, the writer) can use; and
every recorded generation round-trips through the store unchanged. 1000 examples each, every one a
file written and read (the loader's named refusals: tests/unit/goldens/test_golden_safety.py)."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_llmdeterminism.errors import GoldenFileError
from pytest_llmdeterminism.goldens import codec, schema, store
from pytest_llmdeterminism.judge.compare import compare
from pytest_llmdeterminism.judge.decision import Decision
from pytest_llmdeterminism.reporting import documents
from pytest_llmdeterminism.run.session import TestOutcomes
from tests.helpers.golden_safety import VALID_GOLDEN
from tests.helpers.strategies import generations

pytestmark = pytest.mark.slow

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (st.lists(children, max_size=4)
                      | st.dictionaries(st.text(max_size=6), children, max_size=4)),
    max_leaves=12,
)
_FIELD_PATHS = [("batch_shape",), ("finish_reason",), ("fingerprint",), ("fingerprint", "dtype"),
                ("fingerprint", "device_class"), ("generation_config",),
                ("generation_config", "eos_token_id"),
                ("prompt",), ("prompt_token_ids",), ("steps",), ("steps", 0), ("steps", 0, "hash"),
                ("steps", 0, "margin"), ("steps", 0, "token"), ("steps", 0, "top"), ("steps", 0, "top", 0),
                ("steps", 0, "top", 0, 1), ("steps", 0, "piece"), ("text",)]


def _survives(tmp_path, data: bytes) -> None:
    """Loading either fails with GoldenFileError or gives goldens every consumer can use."""
    path = tmp_path / "test_fuzz.json"
    path.write_bytes(data)
    try:
        goldens = store.read(path)
    except GoldenFileError:
        return
    for variants in goldens.values():
        for entry in variants.values():
            generation = schema.from_entry(entry)
            comparison = compare(generation, generation)
            outcomes = TestOutcomes()
            outcomes.decided(path, "k", Decision(comparison, True, generation, generation, "cpu/float32"))
            document = documents.run_report([msgspec.structs.replace(check, test="test_fuzz.py::t")
                                          for check in outcomes.data.checks], [])
            json.dumps(document, allow_nan=False)
            documents.run_report_html(document)
            documents.run_report_markdown(document)
    codec.dumps(goldens)


_FUZZ = settings(max_examples=1000, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])


@_FUZZ
@given(data=st.data())
def test_fuzz_whole_document_byte_mutations(tmp_path, data):
    raw = bytearray(VALID_GOLDEN)
    for _ in range(data.draw(st.integers(1, 4))):
        if not raw:
            break
        position = data.draw(st.integers(0, len(raw) - 1))
        action = data.draw(st.sampled_from(["flip", "delete", "insert", "truncate"]))
        if action == "flip":
            raw[position] = data.draw(st.sampled_from(b'{}[]",:0123456789-.eEtfn \\x'))
        elif action == "delete":
            del raw[position]
        elif action == "insert":
            raw[position:position] = data.draw(
                st.sampled_from([b"[", b"{", b'"', b",", b"NaN", b"1e999", b"-1"]))
        else:
            del raw[position:]
    _survives(tmp_path, bytes(raw))


@_FUZZ
@given(path=st.sampled_from(_FIELD_PATHS), value=_json)
def test_fuzz_typed_field_mutations(tmp_path, path, value):
    document = json.loads(VALID_GOLDEN)
    holder = document["goldens"]["test_x"]["cpu/float32"]
    for part in path[:-1]:
        holder = holder[part]
    holder[path[-1]] = value
    _survives(tmp_path, json.dumps(document).encode())


@_FUZZ
@given(goldens=_json, schema=st.sampled_from([1, "1", 1.0, None, 2, codec.FORMAT,
                                              "pytest-llmdeterminism/golden/3"]),
       logit_hash=st.booleans())
def test_fuzz_arbitrary_goldens_sections(tmp_path, goldens, schema, logit_hash):
    document = {"schema": schema, "goldens": goldens,
                **({"logit_hash": codec.LEGACY_LOGIT_HASH} if logit_hash else {})}
    _survives(tmp_path, json.dumps(document).encode())


@_FUZZ
@given(generation=generations())
def test_fuzz_recorded_generations_round_trip_unchanged(tmp_path, generation):
    path = tmp_path / "test_round.json"
    store.write(path, {"k": {"cpu/float32": schema.to_entry(generation)}})
    assert schema.from_entry(store.read(path)["k"]["cpu/float32"]) == generation
    assert codec.dumps(store.read(path)).encode() == path.read_bytes()
