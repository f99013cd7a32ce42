"""A tiny ``.gguf`` file written here, and a copy changed on purpose (tests/unit/engines/test_cached.py,
tests/pytester/test_converted_copy.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pytest_llmdeterminism.engines import BUILTIN_MODELS


def with_built_kernel(cache: Path) -> Path:
    """``cache`` (a plugin cache folder) holding the fixed-order kernel this user's cache already built,
    as a warm cache does: a test of converted copies does not compile it again (0.7 CPU s a test)."""
    from pytest_llmdeterminism.compute.private_folder import cache_root, private_folder

    built = sorted((cache_root() / "kernels").glob("chain_linear-*.so"))
    if built:
        kernels = private_folder(cache / "kernels")
        for library in built:
            shutil.copy2(library, kernels / library.name)
    return cache


def tiny_gguf(dest: Path, *, scale: float = 1.0) -> Path:
    """The tiny model as a float32 ``.gguf`` file, written as llama.cpp's converter would (q/k rows
    permuted for its rope, a byte-level BPE vocabulary): a GGUF file that converts in a second.
    ``scale``: every weight multiplied by it (another model of the same size, byte for byte)."""
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
        writer.add_tensor(gguf_name, np.ascontiguousarray(weight * scale, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest


def flip_a_byte(folder: Path) -> None:
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF  # inside the last tensor: the file still parses, one weight differs
    weights.write_bytes(bytes(data))



def replace_in_place(path: Path, new: Path) -> None:
    """Write ``new``'s bytes into ``path`` (the same inode, as ``cp`` does) and give it back its size
    and times as ``cp -p``, ``rsync -a`` or ``tar x`` would: only its ctime says it changed."""
    import os

    before = path.stat()
    assert new.stat().st_size == before.st_size, "the same size: only the bytes differ"
    with path.open("r+b") as handle:
        handle.write(new.read_bytes())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
