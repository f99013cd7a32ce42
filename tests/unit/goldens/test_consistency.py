"""A golden's text and pieces against what a check decoded for the same ids (pure)."""

import dataclasses
import json

from pytest_llmdeterminism.goldens import schema
from pytest_llmdeterminism.goldens.consistency import stored_text_problem
from tests.helpers import DATA

ENTRY = json.loads((DATA / "test_tiny_model.intel-avx512-native-0.1.0.json").read_text())[
    "goldens"]["test_capital"]["cpu/float32"]
GOLDEN = schema.from_entry(ENTRY)


def test_a_golden_agrees_with_the_same_output():
    assert stored_text_problem(GOLDEN, GOLDEN) is None


def test_an_edited_text_is_named_with_what_the_ids_decode_to():
    edited = dataclasses.replace(GOLDEN, text=" Lyon.")
    assert stored_text_problem(edited, GOLDEN) == (
        "its text is ' Lyon.', but its ids decode to ' Paris.': the same tokenizer decodes them otherwise, "
        "so the golden was edited after it was recorded")


def test_a_changed_decoder_is_named_as_the_likely_cause():
    edited = dataclasses.replace(GOLDEN, text=" Lyon.")
    newer = dataclasses.replace(GOLDEN, fingerprint={**GOLDEN.fingerprint, "transformers": "9.0"})
    assert stored_text_problem(edited, newer).endswith(
        "the decoding changed since it was recorded (transformers '5.24.0' -> '9.0')")


def test_other_ids_or_another_engine_are_not_its_business():
    other_ids = dataclasses.replace(GOLDEN, text=" Lyon.", token_ids=(1, 2, 3))
    assert stored_text_problem(other_ids, GOLDEN) is None
    served = dataclasses.replace(GOLDEN, fingerprint={**GOLDEN.fingerprint, "engine": "openai"})
    assert stored_text_problem(dataclasses.replace(GOLDEN, text=" Lyon."), served) is None
