"""transformers backend: local folders (safetensors only) and GGUF files, offline, no remote code."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_llmdeterminism.errors import ModelLoadError

_PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


def worker_cuda_index(worker_id: str | None, device_count: int) -> int:
    """The visible CUDA device for a pytest-xdist worker: ``gwK`` takes ``K mod device_count``.

    Indices count visible devices, so ``CUDA_VISIBLE_DEVICES`` is honoured; outside xdist it is 0.
    """
    match = re.fullmatch(r"gw(\d+)", worker_id or "")
    return int(match[1]) % device_count if match and device_count > 0 else 0


def pick_device(spec: str, device: str) -> str:
    import torch

    if device == "auto" and not torch.cuda.is_available():
        return "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ModelLoadError(spec, f"llm_device = {device!r} but CUDA is not available here (torch "
                             f"{torch.__version__}, {built}). Use llm_device = \"auto\" or \"cpu\" "
                             "(or --llm-device=cpu), or install a CUDA build of torch")
    if device in ("auto", "cuda"):  # one GPU per xdist worker; an explicit cuda:N is kept
        return f"cuda:{worker_cuda_index(os.environ.get('PYTEST_XDIST_WORKER'), torch.cuda.device_count())}"
    if device.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(device.partition(":")[2] or 0)
        if index >= count:
            raise ModelLoadError(spec, f"llm_device = {device!r} but this machine has {count} CUDA "
                                 "device(s) visible. Use llm_device = \"auto\" or \"cpu\", or check "
                                 "CUDA_VISIBLE_DEVICES")
    if device == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(spec, "llm_device = 'mps' but MPS is not available here; use \"auto\" or \"cpu\"")
    return device


def load(spec: str, kind: str, path: Path, *, dtype: str, device: str) -> tuple[Any, Any, str]:
    __tracebackhide__ = True
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    device = pick_device(spec, device)
    common: dict[str, Any] = {"local_files_only": True, "trust_remote_code": False}
    if kind == "gguf":
        source, common["gguf_file"] = str(path.parent), path.name
        _require_gguf_support(spec)
    else:
        source = str(path)
        pickles = sorted(p.name for pattern in _PICKLE_WEIGHTS for p in path.glob(pattern))
        if pickles and not any(path.glob("model*.safetensors")):
            raise ModelLoadError(
                spec, f"{str(path)!r} holds pickle weights ({', '.join(pickles[:4])}), which can run code "
                "when loaded and are refused. Convert them to safetensors once, in a trusted environment "
                "(model.save_pretrained(dir, safe_serialization=True)).",
            )
        if not any(path.glob("*.safetensors")):
            found = sorted(p.name for p in path.iterdir())[:8]
            raise ModelLoadError(
                spec, f"no *.safetensors weights in {str(path)!r} (found: {', '.join(found) or 'nothing'}). "
                "Pickle checkpoints (pytorch_model.bin) are refused; convert them to safetensors "
                "(model.save_pretrained(dir, safe_serialization=True)).",
            )
    progress_bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one model load per session; its progress bar is noise in test output
    gguf_bar = _silence_gguf_progress_bar() if kind == "gguf" else None
    try:
        # local_files_only keeps loading offline (the hub library reads HF_HUB_OFFLINE only at import).
        tokenizer = AutoTokenizer.from_pretrained(source, **common)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=getattr(torch, dtype), use_safetensors=kind != "gguf", **common
        )
    except (OSError, ValueError) as error:
        raise ModelLoadError(spec, f"{type(error).__name__}: {error}") from error
    finally:
        if progress_bars:
            hf_logging.enable_progress_bar()
        if gguf_bar is not None:
            gguf_bar()
    model.to(device)
    model.eval()
    if tokenizer.pad_token_id is None:
        # Pad positions are masked out, so any id works: EOS where there is one (what most
        # checkpoints expect), else the vocabulary's first token.
        tokenizer.pad_token = tokenizer.eos_token if tokenizer.eos_token_id is not None \
            else tokenizer.convert_ids_to_tokens(0)
    return model, tokenizer, device


def _require_gguf_support(spec: str) -> None:
    import importlib.util

    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise ModelLoadError(
            spec, f"loading .gguf files needs {' and '.join(missing)}: "
            "pip install 'pytest-llmdeterminism[gguf]'",
        )


def _silence_gguf_progress_bar() -> Callable[[], None] | None:
    """transformers' GGUF conversion shows a tqdm bar that ignores its own progress-bar switch; it
    would land in the captured stderr of the first failing test. Returns what restores it."""
    import functools

    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        return None
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        return None
    gguf_utils.tqdm = functools.partial(original, disable=True)

    def restore() -> None:
        gguf_utils.tqdm = original

    return restore
