"""The float32 copy a ``.gguf`` file is converted into once (engines/cached.py) is checked against its
digest at every load: a changed, cut or unlisted file, or a copy with no digest, is converted again
from the file, and the load line says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_llmdeterminism import engines
from pytest_llmdeterminism.engines import BUILTIN_MODELS
from pytest_llmdeterminism.engines.cached import DIGEST, copy_damage
from pytest_llmdeterminism.engines.model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

PROMPTS = ["Q: What is the capital of Japan? A:", "def fibonacci(n):"]
SETTINGS = GenerationSettings(BatchShape(2, 32), 6, 0)


def tiny_gguf(dest: Path) -> Path:
    """The tiny model as a float32 ``.gguf`` file, written as llama.cpp's converter would (q/k rows
    permuted for its rope, a byte-level BPE vocabulary): a GGUF file that converts in a second."""
    import numpy as np
    from gguf import GGUFWriter, TokenType
    from safetensors.numpy import load_file

    tiny = BUILTIN_MODELS["tiny"]
    config = json.loads((tiny / "config.json").read_text())
    tokenizer = json.loads((tiny / "tokenizer.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer = GGUFWriter(dest, "llama")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_vocab_size(config["vocab_size"])
    vocab = sorted(tokenizer["model"]["vocab"].items(), key=lambda item: item[1])
    special = {token["id"] for token in tokenizer["added_tokens"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([TokenType.CONTROL if index in special else TokenType.NORMAL
                            for _, index in vocab])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]])
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])

    def permuted(weight, count):
        return weight.reshape(count, 2, weight.shape[0] // count // 2, *weight.shape[1:]).swapaxes(1, 2) \
            .reshape(weight.shape)

    parts = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
             "post_attention_layernorm": "ffn_norm"}
    for name, weight in load_file(tiny / "model.safetensors").items():
        if name == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            part = rest.rsplit(".", 1)[0]
            if part in ("self_attn.q_proj", "self_attn.k_proj"):
                weight = permuted(weight, heads if part == "self_attn.q_proj" else kv_heads)
            gguf_name = f"blk.{layer}.{parts[part]}.weight"
        writer.add_tensor(gguf_name, np.ascontiguousarray(weight, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest


@pytest.fixture
def gguf_and_cache(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """The tiny ``.gguf`` file and an empty plugin cache (``LLMDET_CACHE_DIR``)."""
    monkeypatch.setenv("LLMDET_CACHE_DIR", str(tmp_path / "cache"))
    return tiny_gguf(tmp_path / "tiny.gguf"), tmp_path / "cache" / "converted"


def generated(loaded):
    return [(g.token_ids, g.logit_hashes) for g in LLMModel(loaded, SETTINGS).generate(PROMPTS)]


def flip_a_byte(folder: Path) -> None:
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF  # inside the last tensor: the file still parses, one weight differs
    weights.write_bytes(bytes(data))


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


def test_the_load_line_names_a_copy_that_was_converted_again(pytester, gguf_and_cache):
    """What the user reads: not a REGRESSION blamed on the model, but why it was converted again."""
    gguf, converted = gguf_and_cache
    pytester.makeini(f"[pytest]\nllm_model = {gguf}\n")
    pytester.makepyfile("def test_x(llm_model): pass")
    pytester.runpytest().assert_outcomes(passed=1)
    (folder,) = converted.iterdir()
    flip_a_byte(folder)
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"llm: loaded {gguf} in * s on cpu (its float32 copy in {folder} failed "
                                 "its digest check: model.safetensors changed; converted again, for later "
                                 "loads)"])


def test_the_digest_lists_every_file_of_the_copy(gguf_and_cache):
    gguf, converted = gguf_and_cache
    engines.load(str(gguf), dtype="float32", device="cpu")
    (folder,) = converted.iterdir()
    digest = json.loads((folder / DIGEST).read_text())
    assert digest["format"] == "llmdet-converted-copy/1"
    assert set(digest["files"]) == {path.name for path in folder.iterdir()} - {DIGEST}
    assert digest["files"]["model.safetensors"]["size"] == (folder / "model.safetensors").stat().st_size
