"""The engines, one entry each: what names it in ``llm_model``, the module that loads it, and what the
layers above ask of an engine without loading it: the fingerprint fields that decide its bits, whether
it computes on this machine's CPU cores, whether a server serves it, whether ``llm_dtype`` and
``llm_device`` apply to it.

Adding an engine is its module (a ``load(spec, request)`` returning a
:class:`~pytest_llmdeterminism.engines.loaded.LoadedModel` whose engine implements
:class:`~pytest_llmdeterminism.engines.loaded.Engine`) and one entry here; nothing outside ``engines/``
names an engine. Pure data: nothing here imports an engine, torch or a file, so the judgement of a
stored golden (``judge/fingerprint.py``) and the run's options read it for free. The default
engine (:data:`~pytest_llmdeterminism.generation.DEFAULT_ENGINE`) is named by no prefix, and its
fingerprints carry no ``engine`` field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pytest_llmdeterminism.generation import DEFAULT_ENGINE

__all__ = ["ANY_NUMERICS", "DEFAULT_ENGINE", "ENGINES", "EngineEntry", "entry_of", "recorded_by"]

ANY_NUMERICS = "*"  # the numerics class of an engine whose compared fields do not depend on it


@dataclass(frozen=True)
class EngineEntry:
    """One engine, as the layers above see it before loading it."""

    name: str  # as a fingerprint's "engine" field records it, and the llm_model prefix (ENGINE:TARGET)
    module: str  # the module whose load(spec, request) loads it
    # The fingerprint fields that decide a golden's bits, by numerics class (judge/fingerprint.py
    # picks the class: cpu-portable, cpu-native, gpu), or under ANY_NUMERICS for every class. Equal
    # fields: the same numerics, so exact comparison is the default; any difference: near-tie tolerance.
    compared_fields: Mapping[str, tuple[str, ...]]
    default: bool = False  # named by no prefix: a folder, a .gguf file, builtin:NAME or a hub id
    shares_cpu_cores: bool = False  # computes in the test process on the CPU (where llm_device says so)
    served: bool = False  # a server computes it: llm_server_checks audit it, its goldens say if verified
    takes_dtype_and_device: bool = False  # llm_dtype and llm_device choose how it computes
    local_target: bool = True  # what follows its prefix is a local path (a server's: a URL)

    def fields_for(self, numerics_class: str) -> tuple[str, ...]:
        """The fields that decide its bits under ``numerics_class``."""
        return self.compared_fields.get(numerics_class, self.compared_fields.get(ANY_NUMERICS, ("engine",)))


# transformers: the fields that decide its bits, by device class and CPU numerics mode.
_TORCH_COMMON = ("device_class", "machine", "dtype", "torch", "transformers", "attention_implementation")
_TRANSFORMERS_FIELDS = {
    # MKL's COMPATIBLE branch is bit-identical across thread counts 1, 2, 4, 8 and 16 but not 3 or 6
    # (measured), and Intel documents it for a fixed thread count only: threads stay a field.
    # cpu_numerics and cpu_capability name the pinned profile: portable's AVX2 kernels or the
    # compatible (and older portable) generic ones.
    "cpu-portable": (*_TORCH_COMMON, "cpu_numerics", "cpu_capability", "blas", "torch_threads",
                     "batch_invariant"),
    # native kernels depend on the SIMD level, MKL's branch (picked by CPU and vendor), OpenBLAS's
    # core type (picked by CPU: arm64 Neoverse vs generic ARMv8 kernels differ) and threads
    "cpu-native": (*_TORCH_COMMON, "cpu_numerics", "device_name", "cpu_capability", "mkl_cbwr", "blas",
                   "blas_coretype", "torch_threads"),
    "gpu": (*_TORCH_COMMON, "device_name", "compute_capability", "cuda", "cudnn", "cuda_driver"),
}

# The other engines: their own version and pinned knobs decide the bits (and, in process, the CPU).
ENGINES: dict[str, EngineEntry] = {entry.name: entry for entry in (
    EngineEntry(DEFAULT_ENGINE, "pytest_llmdeterminism.engines.hf_load", _TRANSFORMERS_FIELDS, default=True,
                shares_cpu_cores=True, takes_dtype_and_device=True),
    EngineEntry("llamacpp", "pytest_llmdeterminism.engines.llamacpp", {ANY_NUMERICS: (
        "engine", "engine_version", "machine", "device_name", "cpu_features", "dtype", "threads", "n_batch",
        "n_ubatch", "n_ctx", "weights_hash")}, shares_cpu_cores=True),
    EngineEntry("openai", "pytest_llmdeterminism.engines.server.openai", {ANY_NUMERICS: (
        "engine", "server_model", "server_version", "flags", "dtype")},  # flags: system_fingerprint
        served=True, local_target=False),
    EngineEntry("vllm", "pytest_llmdeterminism.engines.vllm", {ANY_NUMERICS: (
        "engine", "engine_version", "device_name", "compute_capability", "cuda", "dtype", "torch",
        "batch_invariant")}, takes_dtype_and_device=True),
)}


def entry_of(spec: str) -> EngineEntry:
    """The engine a ``llm_model`` spec names: ``ENGINE:...`` for a registered prefix, else the default."""
    prefix, colon, _ = spec.partition(":")
    named = ENGINES.get(prefix) if colon else None
    if named is not None and not named.default:
        return named
    return next(entry for entry in ENGINES.values() if entry.default)


def recorded_by(fingerprint: Mapping[str, object]) -> EngineEntry | None:
    """The engine a stored fingerprint names (no ``engine`` field: the default); None for one this
    version does not know."""
    return ENGINES.get(str(fingerprint.get("engine", DEFAULT_ENGINE)))
