"""Model backends: turn an ``llm_model`` spec into a loaded model and tokenizer, offline and safely.

Today there is one backend, transformers (``hf.py``), which reads local folders with safetensors
weights and ``.gguf`` files; ``builtin:tiny`` is a transformers folder shipped in this package.
:class:`ModelCache` loads each spec once per process and remembers a failure as well.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_llmdeterminism import numerics
from pytest_llmdeterminism.backends import hf
from pytest_llmdeterminism.backends.hf import worker_cuda_index
from pytest_llmdeterminism.errors import ConfigurationError, LLMDeterminismError, ModelLoadError
from pytest_llmdeterminism.values import BUILTIN_PREFIX

__all__ = ["BUILTIN_MODELS", "LoadedModel", "ModelCache", "load", "resolve", "worker_cuda_index"]

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
    kind, path = resolve(spec)
    model, tokenizer, device = hf.load(spec, kind, path, dtype=dtype, device=device)
    if device == "cpu":  # on a GPU the CPU's kernels do not touch the logits
        numerics.check(cpu_numerics)
    return LoadedModel(spec=spec, kind=kind, path=path, model=model, tokenizer=tokenizer,
                       dtype=dtype, device=device, cpu_numerics=cpu_numerics)


class ModelCache:
    """One load per model, dtype and device in this process. A failed load is kept too, so every
    test that needs the model fails with the same error, without loading again."""

    def __init__(self, spec: str | None, *, dtype: str, device: str, cpu_numerics: str,
                 announce: Callable[[str], None] | None = None) -> None:
        self._spec = spec
        self._how = {"dtype": dtype, "device": device, "cpu_numerics": cpu_numerics}
        self._loaded: LoadedModel | LLMDeterminismError | None = None
        self._announce = announce or (lambda line: None)  # a line for the terminal while loading

    def get(self) -> LoadedModel:
        __tracebackhide__ = True
        if self._spec is None:
            raise ConfigurationError(
                "llm_model", None,
                "no model configured. Set llm_model in your pytest ini (e.g. llm_model = \"builtin:tiny\" "
                "or a local folder / .gguf file) or pass --llm-model=PATH",
            )
        if self._loaded is None:
            self._announce(f"llm: loading {self._spec} ({self._how['dtype']}, device {self._how['device']}) ...")
            started = time.perf_counter()
            try:
                self._loaded = load(self._spec, **self._how)
            except LLMDeterminismError as error:
                self._loaded = error
            except Exception as error:  # noqa: BLE001 - any failure, reported once per test, never retried
                self._loaded = ModelLoadError(self._spec, f"{type(error).__name__}: {error}")
            took = f"{time.perf_counter() - started:.1f} s"
            self._announce(f"llm: could not load {self._spec} ({took}); every test that uses it fails with the reason"
                           if isinstance(self._loaded, LLMDeterminismError) else
                           f"llm: loaded {self._spec} in {took} on {self._loaded.device}")
        if isinstance(self._loaded, LLMDeterminismError):
            raise self._loaded.with_traceback(None)  # one error object for many tests: no earlier test's frames
        return self._loaded
