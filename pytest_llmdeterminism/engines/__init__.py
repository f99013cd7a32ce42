"""Model backends: turn an ``llm_model`` spec into a loaded engine and tokenizer, offline and safely.

The spec chooses the engine:

- a local folder (safetensors) or ``.gguf`` file, or ``builtin:tiny``: transformers in the test
  process (``hf.py``), the default;
- ``llamacpp:PATH.gguf``: llama.cpp in the test process (``llamacpp.py``);
- ``openai:URL#model=NAME&tokenizer=PATH``: any OpenAI-compatible server (``openai.py``);
- ``vllm:MODEL``: vLLM's offline engine (``vllm.py``, needs a GPU).

Each engine implements :class:`Engine`; everything above this package (comparison, goldens,
reports, audit) sees only :class:`LoadedModel` and the :class:`~capture.Chunk` an engine returns.
:class:`ModelCache` loads each spec once per process and remembers a failure as well.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pytest_llmdeterminism.engines import hf, llamacpp, numerics, openai, vllm
from pytest_llmdeterminism.engines.capture import Chunk
from pytest_llmdeterminism.engines.environment import PinnedEnvironment
from pytest_llmdeterminism.engines.hf import worker_cuda_index
from pytest_llmdeterminism.errors import (
    NO_VALUE,
    ConfigurationError,
    LLMDeterminismError,
    ModelLoadError,
    pasteable,
)
from pytest_llmdeterminism.shape import (
    BUILTIN_PREFIX,
    ENGINE_PREFIXES,
    GenerationSettings,
    engine_of,
    how_to_get,
)

__all__ = ["BUILTIN_MODELS", "ENGINES", "Engine", "LoadedModel", "ModelCache", "load", "resolve",
           "worker_cuda_index"]

BUILTIN_MODELS = {"tiny": Path(__file__).parent / "tiny"}
ENGINES = {"llamacpp": llamacpp, "openai": openai, "vllm": vllm}  # spec prefix -> module
assert tuple(ENGINES) == ENGINE_PREFIXES


class Engine(Protocol):
    """What the model layer needs of an engine: greedy generation with per-step capture."""

    name: str  # "transformers", "llamacpp", "openai", "vllm": the variant's prefix (none for transformers)
    hash_definition: str  # a key of generation.HASH_DEFINITIONS: what its step hashes hash
    runs_rows_alone: bool  # each prompt runs alone, so companions cannot change it: nothing to probe

    def run(self, rows: list[list[int]], config: dict[str, Any], settings: GenerationSettings,
            keep_logits: bool) -> Chunk: ...

    def eos_token_ids(self) -> list[int]: ...

    def vocab_size(self) -> int: ...


@dataclass
class LoadedModel:
    """A model and tokenizer ready for greedy generation, with what is needed to fingerprint them."""

    spec: str
    kind: str  # "folder" or "gguf" (transformers), or the engine's name
    path: Path  # the weights: a folder or a .gguf file (for a server, its tokenizer)
    model: Any  # the engine's own object: a transformers model, a llama_cpp.Llama, a client
    tokenizer: Any  # a transformers tokenizer, or an engine's adapter with the same surface
    dtype: str
    device: str
    engine: Engine
    cpu_numerics: str = "portable"  # the llm_cpu_numerics mode it runs under (checked at load on CPU)
    cache: dict[str, Any] = field(default_factory=dict)  # lazily computed fingerprint parts
    # Fingerprint fields the engine knows best (its version, knobs, the server's model id); None
    # for transformers, whose fingerprint the fingerprint module builds itself.
    describe: dict[str, Any] | None = None


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
    raise ModelLoadError(spec, f"no such folder or .gguf file. The plugin never downloads from a model hub; "
                         f"{how_to_get(spec)}")


def load(spec: str, *, dtype: str, device: str, cpu_numerics: str = "portable",
         pinned_late: bool = False) -> LoadedModel:
    """Load ``spec`` under CPU numerics ``cpu_numerics``, refusing a run where they are not in force
    (``pinned_late``: the plugin could set them only now, not before conftests loaded)."""
    __tracebackhide__ = True
    engine = engine_of(spec)
    if engine is not None:
        target, params = split_params(spec, spec.partition(":")[2])
        loaded = ENGINES[engine].load(spec, target, params, dtype=dtype, device=device)
        return LoadedModel(spec=spec, cpu_numerics=cpu_numerics, **loaded)
    kind, path = resolve(spec)
    model, tokenizer, device = hf.load(spec, kind, path, dtype=dtype, device=device)
    if device == "cpu":  # on a GPU the CPU's kernels do not touch the logits
        numerics.check(cpu_numerics, pinned_late=pinned_late)
    return LoadedModel(spec=spec, kind=kind, path=path, model=model, tokenizer=tokenizer, dtype=dtype,
                       device=device, engine=hf.HFEngine(model, tokenizer, device), cpu_numerics=cpu_numerics)


def split_params(spec: str, rest: str) -> tuple[str, dict[str, str]]:
    """``TARGET#key=value&key=value`` -> ``(TARGET, {key: value})``; a malformed pair names the fix."""
    __tracebackhide__ = True
    target, _, fragment = rest.partition("#")
    params: dict[str, str] = {}
    for pair in filter(None, fragment.split("&")):
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            raise ConfigurationError("llm_model", spec, f"{pair!r} after '#' is not key=value "
                                     "(e.g. llamacpp:model.gguf#threads=2&n_batch=512)")
        params[key] = value
    if not target:
        raise ConfigurationError("llm_model", spec, "names no model after the engine prefix")
    return target, params


class ModelCache:
    """One load per model, dtype and device in this process. A failed load is kept too, so every
    test that needs the model fails with the same error, without loading again. The load pins the
    environment if the run did not (see ``environment.py``), and every variable it sets is put
    back at the end of the run."""

    def __init__(self, spec: str | None, *, dtype: str, device: str, cpu_numerics: str,
                 announce: Callable[[str], None] | None = None,
                 environment: PinnedEnvironment | None = None) -> None:
        self._environment = environment or PinnedEnvironment(cpu_numerics)
        self._spec = spec
        self._how = {"dtype": dtype, "device": device, "cpu_numerics": cpu_numerics}
        self._loaded: LoadedModel | LLMDeterminismError | None = None
        self._announce = announce or (lambda line: None)  # a line for the terminal while loading

    def get(self) -> LoadedModel:
        __tracebackhide__ = True
        if self._spec is None:
            raise ConfigurationError(
                "llm_model", NO_VALUE,
                "no model configured. Set it to a local folder, a .gguf file or builtin:tiny: "
                f"{pasteable('llm_model', 'builtin:tiny')}",
            )
        if self._loaded is None:
            how = "" if engine_of(self._spec) else f" ({self._how['dtype']}, device {self._how['device']})"
            self._announce(f"llm: loading {self._spec}{how} ...")
            started = time.perf_counter()
            try:
                with self._environment.recording():
                    self._environment.pin(early=False)
                    self._loaded = load(self._spec, **self._how, pinned_late=not self._environment.early)
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
