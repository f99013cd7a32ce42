"""The float32 copy a ``.gguf`` file is converted into once (engines/cached.py) is checked against its
digest at every load: a changed, cut or unlisted file, or a copy with no digest, is converted again
from the file, and the load line says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_llmdeterminism import engines
from pytest_llmdeterminism.engines.cached import DIGEST, copy_damage
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings
from tests.helpers.converted_copy import flip_a_byte

PROMPTS = ["Q: What is the capital of Japan? A:", "def fibonacci(n):"]
SETTINGS = GenerationSettings(BatchShape(2, 32), 6, 0)


def generated(loaded):
    return [(g.token_ids, g.step_hashes) for g in LLMModel(loaded, SETTINGS).generate(PROMPTS)]


def truncate(folder: Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def remove_digest(folder: Path) -> None:
    (folder / DIGEST).unlink()  # how every copy made before the digest looks


def remove_tokenizer(folder: Path) -> None:
    (folder / "tokenizer.json").unlink()


def add_a_file(folder: Path) -> None:
    (folder / "adapter_config.json").write_text("{}")


def garble_digest(folder: Path) -> None:
    (folder / DIGEST).write_text("[1, 2")


@pytest.mark.parametrize(("damage", "reason"), [
    (flip_a_byte, "model.safetensors changed"),
    (truncate, "model.safetensors changed"),
    (remove_digest, f"it has no {DIGEST}, so an older version wrote it or it was cut short"),
    (remove_tokenizer, "tokenizer.json is missing"),
    (add_a_file, "adapter_config.json is not one of its files"),
    (garble_digest, f"its {DIGEST} is unreadable"),
])
def test_a_damaged_converted_copy_is_converted_again_and_the_load_says_so(gguf_and_cache, damage, reason):
    gguf, converted = gguf_and_cache
    fresh = engines.load(str(gguf), dtype="float32", device="cpu")
    (folder,) = converted.iterdir()
    assert fresh.origin == f"converted to float32 once, into {folder}, for later loads"
    assert copy_damage(folder) is None
    expected = generated(fresh)

    damage(folder)
    assert copy_damage(folder) == reason
    rebuilt = engines.load(str(gguf), dtype="float32", device="cpu")  # no SafetensorError when cut short
    assert rebuilt.origin == (f"its float32 copy in {folder} failed its digest check: {reason}; converted "
                              "again, for later loads")
    assert generated(rebuilt) == expected
    assert [path.name for path in converted.iterdir()] == [folder.name]  # nothing discarded is left behind
    assert copy_damage(folder) is None

    healed = engines.load(str(gguf), dtype="float32", device="cpu")  # once: the new copy is read
    assert healed.origin == f"from its float32 copy in {folder}"
    assert generated(healed) == expected


def test_the_digest_lists_every_file_of_the_copy(gguf_and_cache):
    gguf, converted = gguf_and_cache
    engines.load(str(gguf), dtype="float32", device="cpu")
    (folder,) = converted.iterdir()
    digest = json.loads((folder / DIGEST).read_text())
    assert digest["format"] == "llmdet-converted-copy/1"
    assert set(digest["files"]) == {path.name for path in folder.iterdir()} - {DIGEST}
    assert digest["files"]["model.safetensors"]["size"] == (folder / "model.safetensors").stat().st_size
