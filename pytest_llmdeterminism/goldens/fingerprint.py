"""Environment and model fingerprint stored with every golden, and its diff."""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.compute import batch_invariant
from pytest_llmdeterminism.engines.cached import cache_dir, file_hash

if TYPE_CHECKING:
    from pytest_llmdeterminism.engines import LoadedModel

__all__ = ["cache_dir", "diff", "file_hash", "fingerprint"]  # cache_dir, file_hash: from engines.cached

def fingerprint(loaded: LoadedModel, flags: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What produced a generation. Cached per loaded model, except the determinism ``flags`` the
    engine had in force (by default the live torch flags)."""
    from pytest_llmdeterminism.compute import determinism

    if "static" not in loaded.cache:
        loaded.cache["static"] = _static(loaded) if loaded.describe is None else _static_engine(loaded)
    return {**loaded.cache["static"], "flags": dict(determinism.flags() if flags is None else flags)}


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


# The fields that decide a golden's bits, by device class and CPU numerics mode. Equal fields:
# the same numerics, so exact comparison is the default; any difference: near-tie tolerance.
_NUMERICS_COMMON = ("device_class", "machine", "dtype", "torch", "transformers", "attention_implementation")
_NUMERICS_BY_KIND = {
    # MKL's COMPATIBLE branch is bit-identical across thread counts 1, 2, 4, 8 and 16 but not 3 or 6
    # (measured), and Intel documents it for a fixed thread count only: threads stay a field.
    # cpu_numerics and cpu_capability name the pinned profile: portable's AVX2 kernels or the
    # compatible (and older portable) generic ones.
    "cpu-portable": ("cpu_numerics", "cpu_capability", "blas", "torch_threads", "batch_invariant"),
    # native kernels depend on the SIMD level, MKL's branch (picked by CPU and vendor), OpenBLAS's
    # core type (picked by CPU: arm64 Neoverse vs generic ARMv8 kernels differ) and threads
    "cpu-native": ("cpu_numerics", "device_name", "cpu_capability", "mkl_cbwr", "blas", "blas_coretype",
                   "torch_threads"),
    "gpu": ("device_name", "compute_capability", "cuda", "cudnn", "cuda_driver"),
}
# Other engines: their own version and pinned knobs decide the bits (and, in process, the CPU).
_NUMERICS_BY_ENGINE = {
    "llamacpp": ("engine", "engine_version", "machine", "device_name", "cpu_features", "dtype", "threads",
                 "n_batch", "n_ubatch", "n_ctx", "weights_hash"),
    "openai": ("engine", "server_model", "server_version", "flags", "dtype"),  # flags: system_fingerprint
    "vllm": ("engine", "engine_version", "device_name", "compute_capability", "cuda", "dtype", "torch",
             "batch_invariant"),
}


def numerics_changes(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """Fields that decide the bits and differ between a golden's fingerprint and this run's.

    Pure. A field the golden did not record (it predates the field) counts as changed, except the
    BLAS of a golden that recorded MKL's branch: that torch used MKL, which has no core type.
    """
    recorded, current = _profile(_with_legacy_blas(recorded)), _profile(_with_legacy_blas(current))
    engines = {side.get("engine", "transformers") for side in (recorded, current)}
    if engines != {"transformers"}:
        fields = _NUMERICS_BY_ENGINE.get(str(current.get("engine")), ("engine",))
        return [(name, recorded.get(name), current.get(name)) for name in fields
                if recorded.get(name) != current.get(name)]
    if current.get("device_class") != "cpu":
        kind = "gpu"
    else:  # portable only where both sides ran the pinned kernels (not, e.g., a torch without MKL)
        kind = "cpu-portable" if all(_ran_portable(side) for side in (recorded, current)) else "cpu-native"
    fields = _NUMERICS_COMMON + _NUMERICS_BY_KIND[kind]
    return [(name, recorded.get(name), current.get(name)) for name in fields
            if recorded.get(name) != current.get(name)]


def _ran_portable(fingerprint: Mapping[str, Any]) -> bool:
    """A pinned mode asked for and in force: ATen's AVX2 kernels under portable or its generic ones
    under compatible, with MKL's COMPATIBLE branch (x86-64), or OpenBLAS's generic ARMV8 kernels (arm64)."""
    mode, capability = fingerprint.get("cpu_numerics"), fingerprint.get("cpu_capability")
    if fingerprint.get("blas_coretype") == "ARMV8":
        return mode == "portable" and capability == "DEFAULT"
    return fingerprint.get("mkl_cbwr") == "COMPATIBLE" and (mode, capability) in (
        ("portable", "AVX2"), ("compatible", "DEFAULT"))


def _profile(fingerprint: Mapping[str, Any]) -> Mapping[str, Any]:
    """Names the pinned kernels, not the word the ini file used: goldens recorded as ``portable``
    before it moved to AVX2 kernels ran the generic ones, which ``compatible`` pins now; on arm64
    both modes pin the same kernels."""
    mode, capability = fingerprint.get("cpu_numerics"), fingerprint.get("cpu_capability")
    if fingerprint.get("blas_coretype") == "ARMV8" and mode == "compatible":
        return {**fingerprint, "cpu_numerics": "portable"}
    if fingerprint.get("mkl_cbwr") == "COMPATIBLE" and (mode, capability) == ("portable", "DEFAULT"):
        return {**fingerprint, "cpu_numerics": "compatible"}
    return fingerprint


def _with_legacy_blas(fingerprint: Mapping[str, Any]) -> Mapping[str, Any]:
    if "blas" in fingerprint or fingerprint.get("mkl_cbwr") is None:
        return fingerprint
    return {**fingerprint, "blas": "mkl", "blas_coretype": None}


def describe_changes(changes: list[tuple[str, Any, Any]]) -> str:
    """``cpu_capability 'AVX512' → 'AVX2', torch '2.12.0' → '2.13.0'``"""
    return ", ".join(f"{name} {old!r} → {new!r}" for name, old, new in changes)


def _static(loaded: LoadedModel) -> dict[str, Any]:
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
        "tokenizer_hash": _tokenizer_hash(tokenizer),
        "chat_template_hash": _text_hash(getattr(tokenizer, "chat_template", None)),
        # only goldens computed on batch-invariant kernels carry the field (batch_invariant.py)
        **({"batch_invariant": kernels_generation}
           if (kernels_generation := batch_invariant.generation(getattr(loaded.engine, "linears", None),
                                                                 found["blas"])) else {}),
    }


def _model_name(loaded: LoadedModel) -> str:
    """``builtin:tiny``, a hub id's ``ORG/NAME`` (its folder is named by commit), or the folder's name."""
    from pytest_llmdeterminism.engines.spec import HubId

    if loaded.spec.startswith("builtin:"):
        return loaded.spec
    named = HubId.parse(loaded.spec) if loaded.hub_commit else None
    return named.repo if named is not None else loaded.path.name


def _static_engine(loaded: LoadedModel) -> dict[str, Any]:
    """Another engine's fingerprint: what it describes, plus the hashes that identify the model."""
    assert loaded.describe is not None
    weights = loaded.describe.get("weights_file")
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        **{key: value for key, value in loaded.describe.items() if key != "weights_file"},
        "weights_hash": file_hash(Path(weights)) if weights else None,
        "tokenizer_hash": _tokenizer_hash(loaded.tokenizer),
        "chat_template_hash": _text_hash(getattr(loaded.tokenizer, "chat_template", None)),
    }


def _cuda_driver(torch: Any) -> str | None:
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


def _tokenizer_hash(tokenizer: Any) -> str | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return _text_hash(backend.to_str())
    return _text_hash(json.dumps(tokenizer.get_vocab(), sort_keys=True))


def _text_hash(text: str | None) -> str | None:
    import xxhash

    return None if text is None else xxhash.xxh3_64_hexdigest(text.encode())
