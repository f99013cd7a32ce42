"""Model backends: turn an ``llm_model`` spec into a loaded engine and tokenizer, offline and safely.

The spec chooses the engine:

- a local folder (safetensors) or ``.gguf`` file, ``builtin:tiny``, or a hub id ``ORG/NAME[@REVISION]``
  found in the local Hugging Face cache (``hub.py``; a local path of the same spelling wins):
  transformers in the test process (``hf.py``, loaded by ``hf_load.py``), the default;
- ``llamacpp:PATH.gguf``: llama.cpp in the test process (``llamacpp.py``);
- ``openai:URL#model=NAME&tokenizer=PATH``: any OpenAI-compatible server (``server/openai.py``);
- ``vllm:MODEL``: vLLM's offline engine (``vllm.py``, needs a GPU).

Each engine is one entry in ``registry.py`` (the transformers one loaded by ``hf_load.py``) and
implements :class:`Engine`, its fingerprint included; everything above this package (the ``model/``
layer, goldens, reports, audit) sees only :class:`LoadedModel` and the :class:`~capture.Chunk` an
engine returns, and asks an engine's entry what it is, never its name.
:class:`ModelCache` loads each spec once per process and remembers a failure as well.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from collections.abc import Callable
from typing import cast

from pytest_llmdeterminism.compute.environment import PinnedEnvironment
from pytest_llmdeterminism.engines import defect, hf
from pytest_llmdeterminism.engines.hf import worker_cuda_index
from pytest_llmdeterminism.engines.hf_load import BUILTIN_MODELS, resolve
from pytest_llmdeterminism.engines.loaded import Engine, EngineModule, LoadedModel, LoadRequest
from pytest_llmdeterminism.engines.registry import ENGINES, entry_of
from pytest_llmdeterminism.engines.spec import EngineSpec, engine_of
from pytest_llmdeterminism.errors import (
    NO_VALUE,
    ConfigurationError,
    LLMDeterminismError,
    ModelLoadError,
    pasteable,
)

__all__ = ["BUILTIN_MODELS", "ENGINES", "Engine", "EngineSpec", "LoadedModel", "ModelCache", "load",
           "resolve", "worker_cuda_index"]


def load(spec: str, *, dtype: str, device: str, cpu_numerics: str = "portable", pinned_late: bool = False,
         batch_invariant: bool | None = None, recording: bool = False) -> LoadedModel:
    """Load ``spec`` on the engine it names (``registry.entry_of``), as a :class:`LoadRequest` of these
    settings: under CPU numerics ``cpu_numerics``, refusing a run where they are not in force
    (``pinned_late``: the plugin could set them only now, not before conftests loaded);
    ``batch_invariant``: None (the default) runs batch-invariant kernels wherever they exist, else the
    previous ones; True requires them (an error saying why not); False keeps the previous kernels
    (``Kernels.choose``). Other engines run each prompt alone (or own their kernels): the setting does
    not touch them. ``recording``: a run that records goldens computes oneDNN's products on oneDNN
    itself."""
    __tracebackhide__ = True
    entry = entry_of(spec)
    parsed = EngineSpec(spec, entry.name, spec) if entry.default else EngineSpec.parse(spec)
    module = cast("EngineModule", importlib.import_module(entry.module))
    request = LoadRequest(dtype=dtype, device=device, cpu_numerics=cpu_numerics, pinned_late=pinned_late,
                          batch_invariant=batch_invariant, recording=recording)
    return dataclasses.replace(module.load(parsed, request), cpu_numerics=cpu_numerics)


class ModelCache:
    """One load per model, dtype and device in this process. A failed load is kept too, without
    loading again: the first test that needs the model fails with the whole reason, every later one
    with one line that points at that test (one error to read, not one per test). The load pins the
    environment if the run did not (see ``environment.py``), and every variable it sets is put
    back at the end of the run."""

    def __init__(self, spec: str | None, *, dtype: str, device: str, cpu_numerics: str,
                 announce: Callable[[str], None] | None = None,
                 environment: PinnedEnvironment | None = None, plant_defect: bool = False,
                 batch_invariant: bool | None = None, recording: bool = False,
                 after_load: Callable[[LoadedModel], None] | None = None) -> None:
        self._after_load = after_load  # e.g. the serving audit of llm_server_checks; its error fails the load
        self._environment = environment or PinnedEnvironment(cpu_numerics)
        self._spec = spec
        self._plant_defect = plant_defect  # --llm-plant-defect: perturb the weights once loaded
        self._how = {"dtype": dtype, "device": device, "cpu_numerics": cpu_numerics}
        self._batch_invariant = batch_invariant
        self._recording = recording  # --llm-golden-update: goldens from oneDNN's own products (see load)
        self._loaded: LoadedModel | LLMDeterminismError | None = None
        self._failed_first: str | None = None  # the test that was shown why the load failed
        self._announce = announce or (lambda line: None)  # a line for the terminal while loading

    def get(self, for_test: str | None = None) -> LoadedModel:
        """The loaded model; ``for_test``: the node id of the test asking (named in later errors)."""
        __tracebackhide__ = True
        if self._spec is None:
            raise ConfigurationError(
                "llm_model", NO_VALUE,
                "no model configured. Set it to a local folder, a .gguf file, a hub id ORG/NAME in the "
                f"local Hugging Face cache, or builtin:tiny: {pasteable('llm_model', 'builtin:tiny')}",
            )
        loaded = self._loaded = self._loaded or self._load(self._spec)
        if isinstance(loaded, LLMDeterminismError):
            if self._failed_first is None or self._failed_first == for_test:
                self._failed_first = for_test or ""
                # One error object for many tests: no earlier test's frames.
                raise loaded.with_traceback(None)
            first = f"the error of {self._failed_first}" if self._failed_first else "the first error"
            raise ModelLoadError(self._spec, f"see {first} for why (shown once, at the first test that "
                                 "needed the model)") from None
        self._environment.share_threads()
        return loaded

    def load_now(self) -> LoadedModel | LLMDeterminismError | None:
        """The model loaded now (or before), or why it could not be: raised by no one here, so that
        the first test that needs the model still shows the whole error. None: no model configured."""
        if self._spec is None:
            return None
        self._loaded = self._loaded or self._load(self._spec)
        return self._loaded

    def _load(self, spec: str) -> LoadedModel | LLMDeterminismError:
        how = "" if engine_of(spec) else f" ({self._how['dtype']}, device {self._how['device']})"
        self._announce(f"llm: loading {spec}{how} ...")
        started = time.perf_counter()
        loaded: LoadedModel | LLMDeterminismError
        try:
            with self._environment.recording():
                self._environment.pin(early=False)
                loaded = load(spec, **self._how, pinned_late=not self._environment.early,
                              batch_invariant=self._batch_invariant, recording=self._recording)
            if self._after_load is not None:
                self._after_load(loaded)
            if self._plant_defect:
                changed = defect.plant_defect(loaded.model)
                self._announce(f"llm: PLANTED DEFECT: noise of relative size {defect.DEFECT_SCALE} on "
                               f"{changed} weight tensors of {spec} (--llm-plant-defect); every "
                               "golden check must fail")
        except LLMDeterminismError as error:
            loaded = error
        except Exception as error:  # noqa: BLE001 - any failure, reported once, never retried
            loaded = ModelLoadError(spec, f"{type(error).__name__}: {error}")
        took = f"{time.perf_counter() - started:.1f} s"
        if isinstance(loaded, LLMDeterminismError):
            self._announce(f"llm: could not load {spec} ({took}); the first test that uses it shows why, "
                           "the others fail in one line")
        else:
            commit = loaded.hub_commit
            commit = f" (commit {commit[:12]} in the Hugging Face cache)" if commit else ""
            origin = f" ({loaded.origin})" if loaded.origin else ""
            self._announce(f"llm: loaded {spec}{commit} in {took} on {loaded.device}{origin}")
            if loaded.slower:
                self._announce(f"llm: {loaded.slower}")
            engine = getattr(loaded, "engine", None)
            if engine_of(spec) is None and isinstance(engine, hf.HFEngine):  # others own their kernels
                self._announce(f"llm: {engine.kernels.describe()}")
        return loaded
