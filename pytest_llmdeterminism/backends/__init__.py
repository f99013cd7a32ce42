"""Model backends: turn an ``llm_model`` spec into a loaded model and tokenizer, offline and safely.

Today there is one backend, transformers (``hf.py``), which reads local folders with safetensors
weights and ``.gguf`` files; ``builtin:tiny`` is a transformers folder shipped in this package.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_llmdeterminism.errors import ModelLoadError
from pytest_llmdeterminism.options import BUILTIN_PREFIX

BUILTIN_MODELS = {"tiny": Path(__file__).parent / "tiny"}


@dataclass
class LoadedModel:
    """A model and tokenizer ready for greedy generation, with what is needed to fingerprint them."""

    spec: str
    kind: str  # "folder" or "gguf"
    path: Path
    model: Any
    tokenizer: Any
    dtype: str
    device: str
    cpu_numerics: str = "portable"  # the llm_cpu_numerics mode it runs under (checked at load on CPU)
    cache: dict[str, Any] = field(default_factory=dict)  # lazily computed fingerprint parts


def worker_cuda_index(worker_id: str | None, device_count: int) -> int:
    """The visible CUDA device for a pytest-xdist worker: ``gwK`` takes ``K mod device_count``.

    Indices count visible devices, so ``CUDA_VISIBLE_DEVICES`` is honoured; outside xdist it is 0.
    """
    match = re.fullmatch(r"gw(\d+)", worker_id or "")
    return int(match[1]) % device_count if match and device_count > 0 else 0


def resolve(spec: str) -> tuple[str, Path]:
    """Classify a spec as a folder or a GGUF file, or fail naming the fix."""
    __tracebackhide__ = True
    if spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX):]
        if name not in BUILTIN_MODELS:
            raise ModelLoadError(spec, f"no built-in model {name!r}; built-in models: "
                                 + ", ".join(f"{BUILTIN_PREFIX}{n}" for n in BUILTIN_MODELS))
        return "folder", BUILTIN_MODELS[name]
    path = Path(spec)
    if path.is_file() and path.suffix == ".gguf":
        return "gguf", path
    if path.is_dir():
        return "folder", path
    if path.exists():
        raise ModelLoadError(spec, "expected a folder with safetensors weights or a .gguf file")
    raise ModelLoadError(
        spec,
        "no such folder or .gguf file. The plugin never downloads from a model hub; download the "
        "model first (e.g. `hf download ORG/NAME --local-dir models/NAME`) and set "
        "llm_model = \"models/NAME\" (or --llm-model=models/NAME)",
    )


def load(spec: str, *, dtype: str, device: str, cpu_numerics: str = "portable") -> LoadedModel:
    """Load ``spec`` under CPU numerics ``cpu_numerics``, refusing a run where they are not in force."""
    __tracebackhide__ = True
    from pytest_llmdeterminism import numerics
    from pytest_llmdeterminism.backends import hf

    kind, path = resolve(spec)
    model, tokenizer, device = hf.load(spec, kind, path, dtype=dtype, device=device)
    if device == "cpu":  # on a GPU the CPU's kernels do not touch the logits
        numerics.check(cpu_numerics)
    return LoadedModel(spec=spec, kind=kind, path=path, model=model, tokenizer=tokenizer,
                       dtype=dtype, device=device, cpu_numerics=cpu_numerics)
