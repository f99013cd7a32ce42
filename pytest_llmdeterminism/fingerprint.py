"""Environment and model fingerprint stored with every golden, and its diff."""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_llmdeterminism.backends import LoadedModel

_CHUNK = 1 << 24


def fingerprint(loaded: LoadedModel) -> dict[str, Any]:
    """What produced a generation. Cached per loaded model, except the live torch flags."""
    from pytest_llmdeterminism import determinism

    if "static" not in loaded.cache:
        loaded.cache["static"] = _static(loaded)
    return {**loaded.cache["static"], "flags": determinism.flags()}


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """Fields that differ, flattened with dotted names: ``[(field, old, new), ...]``."""
    changes = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            changes += [(f"{key}.{k}", x, y) for k, x, y in diff(a, b)]
        elif a != b:
            changes.append((key, a, b))
    return changes


def _static(loaded: LoadedModel) -> dict[str, Any]:
    import tokenizers
    import torch
    import transformers

    model, tokenizer = loaded.model, loaded.tokenizer
    device = torch.device(loaded.device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        device_name = torch.cuda.get_device_name(index)
        capability = ".".join(map(str, torch.cuda.get_device_capability(index)))
    else:
        device_name, capability = _cpu_name(), None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,  # type: ignore[no-untyped-call]
        "device_class": device.type,
        "device_name": device_name,
        "compute_capability": capability,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # SIMD kernels: AVX512, AVX2, ...
        "torch_threads": torch.get_num_threads(),
        "dtype": loaded.dtype,
        "attention_implementation": getattr(model.config, "_attn_implementation", None),
        "model": loaded.spec if loaded.spec.startswith("builtin:") else loaded.path.name,
        "weights_hash": _weights_hash(loaded),
        "tokenizer_hash": _tokenizer_hash(tokenizer),
        "chat_template_hash": _text_hash(getattr(tokenizer, "chat_template", None)),
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _weights_hash(loaded: LoadedModel) -> str:
    """xxh3-64 over the safetensors files of a folder, or over the in-memory tensors of a GGUF model.

    A GGUF model is dequantised while loading and cannot be saved back, so its tensors are what
    identifies it; a folder's files hash without touching the (possibly GPU-resident) tensors.
    """
    import xxhash

    digest = xxhash.xxh3_64()
    if loaded.kind == "folder":
        for path in sorted(loaded.path.glob("*.safetensors")):
            digest.update(path.name.encode())
            _update_from_file(digest, path)
        return digest.hexdigest()
    for name, tensor in sorted(loaded.model.state_dict().items()):
        digest.update(name.encode())
        data = tensor.detach().cpu().contiguous()
        digest.update(data.view(-1).view(__import__("torch").uint8).numpy())
    return digest.hexdigest()


def _update_from_file(digest: Any, path: Path) -> None:
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)


def _tokenizer_hash(tokenizer: Any) -> str | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return _text_hash(backend.to_str())
    return _text_hash(json.dumps(tokenizer.get_vocab(), sort_keys=True))


def _text_hash(text: str | None) -> str | None:
    import xxhash

    return None if text is None else xxhash.xxh3_64_hexdigest(text.encode())
