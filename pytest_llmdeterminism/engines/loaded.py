"""What every engine hands the layers above: an :class:`Engine` to generate with (and what it can
do, and its fingerprint), in a :class:`LoadedModel`; what a load is asked (:class:`LoadRequest`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pytest_llmdeterminism.decoding import DecodingConfig, Speculation
    from pytest_llmdeterminism.engines.capture import Chunk, ScoreChunk
    from pytest_llmdeterminism.engines.spec import EngineSpec
    from pytest_llmdeterminism.errors import BatchInvarianceProbeError
    from pytest_llmdeterminism.generation import HashDefinition
    from pytest_llmdeterminism.shape import GenerationSettings


class Engine(Protocol):
    """What the model layer needs of an engine: greedy generation with per-step capture, and what
    the engine can do (callers ask these, never the engine's name)."""

    name: str  # its entry in registry.py: "transformers", "llamacpp", "openai", "vllm"
    hash_definition: HashDefinition  # what its step hashes hash
    runs_rows_alone: bool  # each prompt runs alone, so companions cannot change it: nothing to probe
    owns_sampling: bool  # do_sample=True: the plugin's own sampler draws over the engine's full logits
    supports_audit: bool  # --llm-audit: batch shape, padding, threads and dtype can be varied in process

    def run(self, rows: list[list[int]], config: DecodingConfig, settings: GenerationSettings,
            keep_logits: bool) -> Chunk: ...

    def eos_token_ids(self) -> list[int]: ...

    def vocab_size(self) -> int: ...

    def fingerprint(self, loaded: LoadedModel) -> dict[str, Any]:
        """What produced ``loaded``'s generations (versions, device, knobs, the hashes of the weights
        and the tokenizer), but for the determinism flags of a call; ``model/fingerprint.py`` keeps it."""
        ...


@runtime_checkable
class AuditedEngine(Engine, Protocol):
    """An engine the audit can run (``supports_audit``): it also makes a copy of itself in another dtype."""

    model: Any  # the engine's own model object (for a copy, the copy's)

    def in_dtype(self, dtype: str) -> AuditedEngine:
        """This engine on a copy of its weights cast to ``dtype``."""
        ...


@runtime_checkable
class ServedEngine(Engine, Protocol):
    """An engine that sends each prompt to a server (``openai:``), which may batch it with others' and
    draws samples with its own generator: the serving audit runs its request among concurrent
    companions and with the server's prefix cache on (``model/serving_audit.py``);
    ``@deterministic(concurrency=N)`` and seeded server sampling run on it (``model/concurrency.py``,
    ``model/served_sampling.py``)."""

    slots: int  # requests the server computes at once, as the spec says (#slots=N); 0: not said
    sampler: str  # what a golden the server drew records as its sampler: "engine:<server>"

    @property
    def resets_prefix(self) -> bool:
        """Each request goes after a reset that keeps a cached prefix out of it (``reset_prefix=1``)."""
        ...

    def as_served(self, ids: list[int]) -> list[int]:
        """``ids`` as the server counts them (a server given text tokenises it itself)."""
        ...

    def with_prefix_cache(self) -> ServedEngine:
        """This engine with the server's prefix cache left on (never for a golden)."""
        ...

    def among_companions(self) -> ServedEngine:
        """This engine for requests sent among concurrent companions: a transport failure fails the
        request that met it, not every later request of the session."""
        ...


@runtime_checkable
class ScoringEngine(Engine, Protocol):
    """An engine that scores a fixed continuation (``llm_model.score``): teacher-forced, every
    continuation token's logprob given the prompt and the tokens before it."""

    def score(self, rows: list[tuple[list[int], list[int]]], settings: GenerationSettings, *,
              top_k: int, prompt_logprobs: bool) -> ScoreChunk:
        """Each ``(prompt ids, continuation ids)`` pair of one chunk (at most the shape's rows),
        scored in the fixed shape."""
        ...


@runtime_checkable
class PhasedEngine(Engine, Protocol):
    """An engine that computes one unpadded row's logits in pieces over its own KV cache (the audit's
    ``chunked-prefill`` and ``prefix-reuse`` rows)."""

    def phase_logits(self, ids: list[int], pieces: list[int], seed: int, *,
                     reuse_from: list[int] | None = None) -> Any:
        """``ids``' float32 logits (a tensor, one row per position), forwarded in consecutive pieces of
        ``pieces``' lengths over one KV cache; ``reuse_from``: the cache of the first piece is cut
        from the prefill of that other sequence sharing it (a prefix cache's reuse)."""
        ...


@runtime_checkable
class SpeculatingEngine(Engine, Protocol):
    """An engine that runs a greedy call's speculation (``DecodingConfig.speculation``) losslessly."""

    def speculation(self, asked: Speculation) -> Speculation:
        """``asked`` as this engine runs it (an ``assistant_model`` resolved to its draft model), or a
        ``ConfigurationError`` saying why it cannot run it losslessly."""
        ...


@dataclass(frozen=True)
class LoadRequest:
    """How the run asks for a model; each engine reads what applies to it (``registry.py`` says
    whether ``dtype`` and ``device`` do). ``cpu_numerics``: the ``llm_cpu_numerics`` mode, refused
    where not in force (``pinned_late``: the plugin could set it only now, not before conftests
    loaded); ``batch_invariant``: None runs batch-invariant kernels wherever they exist, True requires
    them, False keeps the previous ones (``Kernels.choose``); ``recording``: a run that records goldens."""

    dtype: str
    device: str
    cpu_numerics: str = "portable"
    pinned_late: bool = False
    batch_invariant: bool | None = None
    recording: bool = False


class EngineModule(Protocol):
    """An engine's module (its entry in ``registry.py`` names it): it loads the spec that names it."""

    def load(self, spec: EngineSpec, request: LoadRequest) -> LoadedModel: ...


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
    hub_commit: str | None = None  # a hub id's commit, as resolved in the local Hugging Face cache
    origin: str = ""  # a .gguf file's: loaded from its converted float32 copy, or converted now (cached.py)
    slower: str = ""  # why the fixed-order kernel does not run where it could (compute/kernels.py), if so
    # Fingerprint fields the engine knew at load (its version, knobs, the server's model id), for its
    # fingerprint (engines/fingerprints.described); None for transformers, which reads them lazily.
    describe: dict[str, Any] | None = None
    # Computed once per loaded model by the layer above, each by its one owner:
    # model/fingerprint.py: the fingerprint but for the flags of a call (Engine.fingerprint's)
    static_fingerprint: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    # model/probe.py: what the batch-invariance probe found, by shape and thread count
    probed: dict[str, str | BatchInvarianceProbeError] = field(default_factory=dict, repr=False,
                                                               compare=False)
    # model/audit.py: copies of the weights in another dtype, by dtype
    in_dtypes: dict[str, LoadedModel] = field(default_factory=dict, repr=False, compare=False)
    # model/served_sampling.py: whether the server draws seeded samples per request (verified once)
    served_sampling: Any = field(default=None, repr=False, compare=False)

    def fresh(self, **changes: Any) -> LoadedModel:
        """A copy, with ``changes``, that has computed nothing yet: its fingerprint, probe and copies
        are made again when asked for."""
        return dataclasses.replace(self, **{"static_fingerprint": None, "probed": {}, "in_dtypes": {},
                                            "served_sampling": None, **changes})
