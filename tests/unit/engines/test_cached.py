"""The float32 copy a ``.gguf`` file is converted into once (engines/cached.py) is checked against its
digest at every load: a changed, cut or unlisted file, or a copy with no digest, is converted again
from the file, and the load line says so."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pytest_llmdeterminism import engines
from pytest_llmdeterminism.compute.private_folder import CacheFolderError
from pytest_llmdeterminism.engines.cached import DIGEST, copy_damage, file_hash
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings
from tests.helpers.converted_copy import flip_a_byte, replace_in_place, tiny_gguf

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


def test_a_gguf_replaced_in_place_with_its_size_and_mtime_kept_is_converted_again(gguf_and_cache, tmp_path):
    """cp -p, rsync -a, tar x and re-quantisation keep a file's size and mtime: the copy is keyed by
    the bytes, so another model is never judged with the old one's weights."""
    gguf, converted = gguf_and_cache
    old = engines.load(str(gguf), dtype="float32", device="cpu")
    (old_folder,) = converted.iterdir()
    expected, old_hash = generated(old), file_hash(gguf)

    replace_in_place(gguf, tiny_gguf(tmp_path / "other.gguf", scale=1.5))
    new = engines.load(str(gguf), dtype="float32", device="cpu")
    (new_folder,) = set(converted.iterdir()) - {old_folder}
    assert new.origin == f"converted to float32 once, into {new_folder}, for later loads"
    assert generated(new) != expected, "the new weights decide the tokens"
    assert file_hash(gguf) != old_hash, "the fingerprint's hash sees the change too"


def test_the_hash_cache_hashes_a_file_rewritten_in_place_again(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMDET_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "weights.bin"
    path.write_bytes(b"a" * 64)
    first = file_hash(path)
    other = tmp_path / "other.bin"
    other.write_bytes(b"b" * 64)
    replace_in_place(path, other)
    assert file_hash(path) == file_hash(other) != first


@pytest.mark.parametrize("shared", ["cache", "converted"])
@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770])
def test_a_converted_copy_in_a_folder_others_may_write_is_refused(gguf_and_cache, shared, mode):
    """Whoever may write the cache folder can plant a copy (with a digest that matches it): it would
    decide the verdict. Refused as the kernel is, by the same check, with one message and its fix."""
    gguf, converted = gguf_and_cache
    engines.load(str(gguf), dtype="float32", device="cpu")
    folder = converted.parent if shared == "cache" else converted
    folder.chmod(mode)
    try:
        with pytest.raises(CacheFolderError) as refused:
            engines.load(str(gguf), dtype="float32", device="cpu")
    finally:
        folder.chmod(0o700)
    assert refused.value.path == folder
    assert str(refused.value).startswith(f"{folder}")
    assert f"others may write it (mode {mode:o})" in str(refused.value)
    assert str(refused.value).endswith(f"the plugin reads no converted copy from it (a .gguf model's float32 "
                                       "weights would be whatever was put there): set LLMDET_CACHE_DIR to a "
                                       f"private folder, or make it private: chmod go-w {folder}")


@pytest.mark.skipif(not hasattr(os, "chown") or os.getuid() != 0, reason="giving a folder away needs root")
def test_a_converted_copy_in_a_folder_of_another_user_is_refused(gguf_and_cache):
    gguf, converted = gguf_and_cache
    engines.load(str(gguf), dtype="float32", device="cpu")
    os.chown(converted, 4242, 4242)
    with pytest.raises(CacheFolderError, match=f"{converted} is not the user's own or others may write it"):
        engines.load(str(gguf), dtype="float32", device="cpu")


def test_a_hash_planted_in_a_cache_folder_others_may_write_is_never_read(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("LLMDET_CACHE_DIR", str(cache))
    path = tmp_path / "weights.bin"
    path.write_bytes(b"a" * 64)
    true_hash = file_hash(path)
    (hashes,) = (cache / "hashes").iterdir()
    hashes.write_text(json.dumps(dict.fromkeys(json.loads(hashes.read_text()), "0123456789abcdef")))
    cache.chmod(0o777)
    try:
        assert file_hash(path) == true_hash
    finally:
        cache.chmod(0o700)
    assert file_hash(path) == "0123456789abcdef", "the planted entry is what a private cache would have read"
