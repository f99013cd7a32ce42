"""What each engine's fingerprint is made of: transformers' (:func:`transformers_fingerprint`, read from
torch and the loaded model), another engine's (:func:`described`: what its load described, plus the
hashes that identify the model), and the hashes every fingerprint carries. Each engine's
``fingerprint`` method chooses its own; what the fields mean for a comparison is
``judge/fingerprint.py``'s, which fields decide the bits ``registry.py``'s."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.engines.cached import file_hash

if TYPE_CHECKING:
    from types import ModuleType

    from pytest_llmdeterminism.engines.loaded import LoadedModel

__all__ = ["described", "tokenizer_hash", "transformers_fingerprint"]


def transformers_fingerprint(loaded: LoadedModel, *, kernels_generation: str | None) -> dict[str, Any]:
    """The default engine's fingerprint; ``kernels_generation``: the batch-invariant kernels' generation
    it chose at load (``Kernels.generation``), None for the previous kernels."""
    import tokenizers
    import torch
    import transformers

    from pytest_llmdeterminism.compute import numerics

    model, tokenizer = loaded.model, loaded.tokenizer
    device = torch.device(loaded.device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        device_name = torch.cuda.get_device_name(index)
        capability = ".".join(map(str, torch.cuda.get_device_capability(index)))
    else:
        device_name, capability = numerics.cpu_name(), None
    found = numerics.effective()
    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),  # TorchVersion is a str subclass that serializers reject
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,  # type: ignore[no-untyped-call]
        "cuda_driver": _cuda_driver(torch) if device.type == "cuda" else None,
        "device_class": device.type,
        "device_name": device_name,
        "compute_capability": capability,
        "machine": platform.machine(),
        "cpu_numerics": loaded.cpu_numerics,
        # ATen's SIMD kernels: AVX512, AVX2, DEFAULT
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl_cbwr": found["mkl_cbwr"],  # MKL's code path: COMPATIBLE when portable
        "blas": found["blas"],  # torch's BLAS: mkl (x86-64 wheels), openblas (arm64 wheels)
        "blas_coretype": found["blas_coretype"],  # OpenBLAS's kernels by CPU: ARMV8 when portable
        "torch_threads": torch.get_num_threads(),
        "dtype": loaded.dtype,
        "attention_implementation": getattr(model.config, "_attn_implementation", None),
        "model": _model_name(loaded),
        # a hub id's commit (its branch or tag can move): only hub models carry the field
        **({"model_commit": loaded.hub_commit} if loaded.hub_commit else {}),
        "weights_hash": _weights_hash(loaded),
        "tokenizer_hash": tokenizer_hash(tokenizer),
        "chat_template_hash": _text_hash(getattr(tokenizer, "chat_template", None)),
        # only goldens computed on batch-invariant kernels carry the field (compute/kernels.py)
        **({"batch_invariant": kernels_generation} if kernels_generation else {}),
    }


def described(loaded: LoadedModel) -> dict[str, Any]:
    """Another engine's fingerprint: what its load described, plus the hashes that identify the model."""
    assert loaded.describe is not None
    weights = loaded.describe.get("weights_file")
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        **{key: value for key, value in loaded.describe.items() if key != "weights_file"},
        "weights_hash": file_hash(Path(weights)) if weights else None,
        "tokenizer_hash": tokenizer_hash(loaded.tokenizer),
        "chat_template_hash": _text_hash(getattr(loaded.tokenizer, "chat_template", None)),
    }


def _model_name(loaded: LoadedModel) -> str:
    """``builtin:tiny``, a hub id's ``ORG/NAME`` (its folder is named by commit), or the folder's name."""
    from pytest_llmdeterminism.engines.spec import HubId

    if loaded.spec.startswith("builtin:"):
        return loaded.spec
    named = HubId.parse(loaded.spec) if loaded.hub_commit else None
    return named.repo if named is not None else loaded.path.name


def _cuda_driver(torch: ModuleType) -> str | None:
    get_version = getattr(torch._C, "_cuda_getDriverVersion", None)  # private, so guarded
    if get_version is None:
        return None
    version = int(get_version())
    return f"{version // 1000}.{version % 1000 // 10}"


def _weights_hash(loaded: LoadedModel) -> str:
    """xxh3-64 over the weight files: a folder's ``*.safetensors``, or the ``.gguf`` file.

    Hashing files, not tensors, never touches GPU memory, and each file's hash is cached by path,
    size and modification time, so a multi-GB checkpoint is read once, not once per session. A GGUF
    model is dequantised while loading; the file plus the library versions recorded beside this
    hash determine those tensors, at a quarter of the bytes or less.
    """
    import xxhash

    paths = [loaded.path] if loaded.kind == "gguf" else sorted(loaded.path.glob("*.safetensors"))
    digest = xxhash.xxh3_64()
    for path in paths:
        digest.update(f"{path.name}:{file_hash(path)};".encode())
    return digest.hexdigest()


def tokenizer_hash(tokenizer: Any) -> str | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return _text_hash(backend.to_str())
    return _text_hash(json.dumps(tokenizer.get_vocab(), sort_keys=True))


def _text_hash(text: str | None) -> str | None:
    import xxhash

    return None if text is None else xxhash.xxh3_64_hexdigest(text.encode())
