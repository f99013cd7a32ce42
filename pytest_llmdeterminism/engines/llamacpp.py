"""llama.cpp in the test process (``llamacpp:PATH.gguf``), through llama-cpp-python.

The plugin runs its own greedy loop over the raw float32 logits (hashed as transformers' are), each
prompt alone on a cleared context, with threads, batch sizes and context pinned and recorded
(:class:`LlamaCppOptions`); what is pinned and why: ``docs/design/engines.md``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.compute.numerics import cpu_name
from pytest_llmdeterminism.decoding import DecodingConfig, refuse_beyond
from pytest_llmdeterminism.engines.capture import (
    Chunk,
    RowSteps,
    ScoreChunk,
    ScoredRow,
    logits_step,
    prompt_positions,
    score_positions,
)
from pytest_llmdeterminism.engines.fingerprints import described
from pytest_llmdeterminism.engines.loaded import LoadedModel, LoadRequest
from pytest_llmdeterminism.engines.spec import EngineSpec, how_to_get
from pytest_llmdeterminism.errors import ConfigurationError, ModelLoadError, pasteable
from pytest_llmdeterminism.generation import HashDefinition
from pytest_llmdeterminism.shape import GenerationSettings

if TYPE_CHECKING:
    from pytest_llmdeterminism.engines.capture import Logits

# The portable build: a source build of llama.cpp compiles for the building CPU by default (GGML_NATIVE),
# and such a build's goldens hold only on CPUs with its features (and on an Intel Xeon with AMX it has
# crashed inside llama.cpp's own decode).
PORTABLE_BUILD = 'CMAKE_ARGS="-DGGML_NATIVE=OFF"'
INSTALL = f"{PORTABLE_BUILD} pip install 'pytest-llmdeterminism[llamacpp]'"
REINSTALL = f"{PORTABLE_BUILD} pip install --force-reinstall --no-cache-dir llama-cpp-python"
# SIMD features that llama.cpp reports as compiled in (llama_print_system_info: "AVX512 = 1") and that a
# portable build never compiles in: it gets x86-64's SSE3 to AVX2, FMA, F16C and BMI2 (ggml's
# CMakeLists.txt, GGML_NATIVE=OFF), and the compiler's default on arm64 (NEON, FMA). One of these
# names a build for this CPU (GGML_NATIVE, a source build's default) or for a chosen CPU variant.
CPU_SPECIFIC_FEATURES = ("AVX_VNNI", "AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AMX_INT8",
                         "FP16_VA", "MATMUL_INT8", "SVE", "DOTPROD", "SME", "SME2", "VXE")


@dataclass(frozen=True)
class LlamaCppBuild:
    """Which llama.cpp build runs: portable, or compiled for a CPU's features (``cpu_specific``).
    Read from what llama.cpp reports as compiled in, not from what the CPU has: a native build on a
    CPU with nothing beyond AVX2 compiles the portable build's features and reads as portable."""

    cpu_specific: tuple[str, ...]

    @classmethod
    def from_system_info(cls, text: str) -> LlamaCppBuild:
        """From ``llama_cpp.llama_print_system_info()``: ``CPU : SSE3 = 1 | AVX512 = 1 | ...`` (older
        llama.cpp lists every feature, the absent ones ``= 0``)."""
        compiled = {name for name, value in re.findall(r"([A-Z][A-Z0-9_]*) = (\S+)", text) if value != "0"}
        return cls(tuple(name for name in CPU_SPECIFIC_FEATURES if name in compiled))

    @property
    def native(self) -> bool:
        return bool(self.cpu_specific)

    def fingerprint(self) -> str:
        """The fingerprint's ``llamacpp_build``: ``portable``, or ``native (AVX512, ...)``."""
        return f"native ({', '.join(self.cpu_specific)})" if self.native else "portable"

    def load_note(self) -> str:
        """What the load line says of a native build (nothing of a portable one)."""
        if not self.native:
            return ""
        return (f"a native llama.cpp build, compiled for {', '.join(self.cpu_specific)}: its goldens hold "
                f"only on CPUs with these; the portable build: {REINSTALL}")


@dataclass(frozen=True)
class LlamaCppOptions:
    """The spec's ``#key=value`` options (``llamacpp:PATH.gguf#threads=2``)."""

    threads: int = 1
    n_batch: int = 512
    n_ubatch: int = 512
    n_ctx: int = 2048


def load(spec: EngineSpec, request: LoadRequest) -> LoadedModel:
    """``llamacpp:PATH.gguf``, loaded. ``dtype`` is the file's own (quantisation): llm_dtype does not
    apply, and ``device`` must allow the CPU."""
    __tracebackhide__ = True
    dtype, device = request.dtype, request.device
    knobs = spec.options(LlamaCppOptions)
    target = spec.target
    path = Path(target)
    if path.is_dir() or (path.is_file() and path.suffix != ".gguf"):
        raise ModelLoadError(spec.text, f"{target!r} is not a .gguf file; llamacpp: takes one GGUF file (for "
                             "a transformers folder, drop the llamacpp: prefix)")
    if not path.is_file():
        how = how_to_get(target, example="llamacpp:models/NAME/FILE.gguf")
        raise ModelLoadError(spec.text, f"no such .gguf file: {target!r}. llamacpp: takes a local GGUF file; "
                             f"the plugin never downloads: {how}")
    if dtype != "float32":
        raise ConfigurationError("llm_dtype", dtype, "llama.cpp runs the GGUF file's own weights (their "
                                 "quantisation is the golden's dtype); remove llm_dtype, or pick another "
                                 ".gguf file")
    if device not in ("auto", "cpu"):
        raise ConfigurationError("llm_device", device, "llama.cpp runs on the CPU in this plugin; use "
                                 f"{pasteable('llm_device', 'auto')} or cpu")
    if importlib.util.find_spec("llama_cpp") is None:
        raise ModelLoadError(spec.text, f"llama.cpp in process needs llama-cpp-python: {INSTALL}")
    import llama_cpp

    try:
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=knobs.n_ctx, n_threads=knobs.threads,
                              n_threads_batch=knobs.threads, n_batch=knobs.n_batch,
                              n_ubatch=knobs.n_ubatch, n_gpu_layers=0, flash_attn=False,
                              logits_all=False, verbose=False)
    except (ValueError, RuntimeError) as error:
        raise ModelLoadError(spec.text, f"llama.cpp could not load it: {error}") from error
    file_type = _file_type(llm.metadata)
    features = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    build = LlamaCppBuild.from_system_info(features)
    describe = {
        "engine": "llamacpp",
        "engine_version": llama_cpp.__version__,
        "llamacpp_build": build.fingerprint(),
        "device_class": "cpu",
        "device_name": cpu_name(),
        "cpu_features": features,
        "dtype": file_type,
        **dataclasses.asdict(knobs),
        "flash_attn": False,
        "rows_alone": True,  # each prompt on a cleared context: the batch shape does not touch it
        "model": path.name,
        "weights_file": str(path),
    }
    tokenizer = LlamaTokenizer(llm)
    return LoadedModel(spec=spec.text, kind="llamacpp", path=path, model=llm, tokenizer=tokenizer,
                       dtype=file_type, device="cpu", engine=LlamaCppEngine(llm, tokenizer, knobs.n_ctx),
                       describe=describe, origin=build.load_note())


class LlamaCppEngine:
    name = "llamacpp"
    hash_definition = HashDefinition.LOGITS  # llama.cpp hands over the raw float32 logits, like transformers
    runs_rows_alone = True
    owns_sampling = True  # do_sample=True: the plugin's sampler draws over the raw logits
    supports_audit = False

    def __init__(self, llm: Any, tokenizer: LlamaTokenizer, n_ctx: int) -> None:
        self._llm, self._tokenizer, self._n_ctx = llm, tokenizer, n_ctx

    def eos_token_ids(self) -> list[int]:
        return self._tokenizer.end_of_generation_ids()

    def vocab_size(self) -> int:
        return len(self._tokenizer)

    def fingerprint(self, loaded: LoadedModel) -> dict[str, Any]:
        """What its load described (version, pinned knobs), plus the model's hashes."""
        return described(loaded)

    def run(self, rows: list[list[int]], config: DecodingConfig, settings: GenerationSettings,
            keep_logits: bool) -> Chunk:
        __tracebackhide__ = True
        refuse_beyond("llama.cpp", config, keep_logits=keep_logits, longest_prompt=max(map(len, rows)),
                      context=(self._n_ctx, "n_ctx", "llamacpp:PATH.gguf#n_ctx=4096"))
        loop = ("argmax over raw logits, no sampler" if config.sampling is None else
                "the plugin's seeded sampler over raw logits (llama.cpp's sampler unused)")
        out = Chunk(tokens=[], steps=[], flags={"engine_loop": loop})
        for row, ids in enumerate(rows):
            draws = None if config.sampling is None else _Draws(config, row, ids)
            tokens, steps, logits = self._greedy(ids, config, keep_logits, draws)
            out.tokens.append(tokens)
            out.steps.append(steps)
            out.logits.append(logits)
            if draws is not None:
                out.draw_margins.append(draws.margins)
        return out

    def _greedy(self, ids: list[int], config: DecodingConfig, keep_logits: bool,
                draws: _Draws | None = None) -> tuple[list[int], RowSteps, list[Logits]]:
        import llama_cpp
        import numpy as np

        llm = self._llm
        llm.reset()  # a cleared context: nothing of an earlier prompt is reused
        llm.eval(ids)
        eos, penalty = set(config.eos_token_id), float(config.repetition_penalty)
        seen, tokens, steps, kept = list(ids), [], RowSteps(), []
        for step in range(config.max_new_tokens):
            raw = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
            step_hash, top_ids, top_logprobs = logits_step(raw, step)
            processed = penalty != 1.0 or step < config.min_new_tokens
            if processed:
                # Processors act on a copy (the hash is of what the model computed), by transformers' rules.
                scores = raw.copy()
                previous = np.unique(np.asarray(seen))
                scores[previous] = np.where(scores[previous] > 0, scores[previous] / penalty,
                                            scores[previous] * penalty)
                if step < config.min_new_tokens:
                    scores[sorted(eos)] = np.finfo(np.float32).min
                _, top_ids, top_logprobs = logits_step(scores, step)
            steps.append(step_hash, top_ids, top_logprobs)
            if keep_logits:
                kept.append(raw.copy())
            token = top_ids[0] if draws is None else draws.draw(scores if processed else raw, step)
            tokens.append(token)
            seen.append(token)
            if token in eos or step == config.max_new_tokens - 1:
                break  # no step reads the logits of the last token: it is not evaluated
            llm.eval([token])
        return tokens, steps, kept


    def score(self, rows: list[tuple[list[int], list[int]]], settings: GenerationSettings, *,
              top_k: int, prompt_logprobs: bool) -> ScoreChunk:
        """Each pair alone on a cleared context: one evaluation of prompt + continuation (its last
        token predicts nothing and is left out, as on transformers) in blocks of ``n_batch``, with
        the logits of every evaluated token; logprobs by :func:`logits_step`'s float32 formula."""
        __tracebackhide__ = True
        for prompt, continuation in rows:
            if len(prompt) + len(continuation) > self._n_ctx:
                raise ConfigurationError("llm_model", f"#n_ctx={self._n_ctx}",
                                         f"a {len(prompt)}-token prompt plus a {len(continuation)}-token "
                                         "continuation does not fit the context; raise n_ctx in the spec "
                                         "(llamacpp:PATH.gguf#n_ctx=4096)")
        scored = [self._score(prompt, continuation, top_k, prompt_logprobs) for prompt, continuation in rows]
        return ScoreChunk(rows=scored, flags={"engine_loop": "one evaluation with every token's logits"})

    def _score(self, prompt: list[int], continuation: list[int], top_k: int,
               prompt_logprobs: bool) -> ScoredRow:
        import numpy as np

        llm, ids = self._llm, prompt + continuation[:-1]
        vocab = llm.n_vocab()
        llm.reset()  # a cleared context: nothing of an earlier prompt is reused
        context = llm._ctx  # noqa: SLF001 - llama-cpp-python's eval keeps only the last token's logits
        context.kv_cache_seq_rm(-1, 0, -1)
        logits = np.empty((len(ids), vocab), dtype=np.float32)
        try:
            for start in range(0, len(ids), llm.n_batch):
                block = ids[start:start + llm.n_batch]
                llm._batch.set_batch(batch=block, n_past=start, logits_all=True)  # noqa: SLF001
                context.decode(llm._batch)  # noqa: SLF001
                logits[start:start + len(block)] = np.ctypeslib.as_array(
                    context.get_logits(), shape=(len(block) * vocab,)).reshape(len(block), vocab)
        finally:
            context.kv_cache_seq_rm(-1, 0, -1)
            llm.reset()
        import torch

        predicting = logits[len(prompt) - 1:]
        found = score_positions(torch.from_numpy(predicting), torch.from_numpy(_logprobs(predicting)),
                                continuation, top_k)
        if prompt_logprobs:
            found.prompt_logprobs = prompt_positions(torch.from_numpy(_logprobs(logits[:len(prompt) - 1])),
                                                     prompt)
        return found


def _logprobs(raw: Logits) -> Logits:
    """Each row's log-softmax by :func:`logits_step`'s float32 formula."""
    import numpy as np

    shift = raw.max(axis=1, keepdims=True)
    log_total = np.log(np.exp(raw - shift, dtype=np.float32).sum(axis=1, keepdims=True, dtype=np.float32))
    found: Logits = (raw - shift - log_total).astype(np.float32)
    return found


class _Draws:
    """One row's draws with the plugin's sampler (``sampling.py``): the same noise, keyed by the seed
    and the row's own prompt ids, that the transformers engine applies, over llama.cpp's logits."""

    def __init__(self, config: DecodingConfig, row: int, ids: list[int]) -> None:
        assert config.sampling is not None
        self._config = dataclasses.replace(config.sampling, seed=config.seed_of(row))
        self._key = self._config.noise_key(ids)
        self.margins: list[float] = []

    def draw(self, scores: Logits, step: int) -> int:
        from pytest_llmdeterminism import sampling
        from pytest_llmdeterminism.generation import LOGPROB_DECIMALS, LOGPROB_FLOOR

        drawn = sampling.draw(scores, self._config, key=self._key, step=step)
        self.margins.append(round(min(drawn.margin, -LOGPROB_FLOOR), LOGPROB_DECIMALS))
        return drawn.token_id


class LlamaTokenizer:
    """llama.cpp's own tokenizer behind the surface of a transformers tokenizer that ``llm_model``
    uses: the prompt is tokenised the way llama.cpp serves it."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm
        self.eos_token_id: int = llm.token_eos()
        self.bos_token_id: int = llm.token_bos()
        self.pad_token_id = self.eos_token_id
        self.eos_token = self.decode([self.eos_token_id])
        self.bos_token = self.decode([self.bos_token_id]) if self.bos_token_id >= 0 else ""
        self.chat_template: str | None = llm.metadata.get("tokenizer.chat_template")
        self.backend_tokenizer = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        ids = self._llm.tokenize(text.encode(), add_bos=add_special_tokens, special=True)
        return {"input_ids": list(ids)}

    def __len__(self) -> int:
        return int(self._llm.n_vocab())

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        text = self._llm.detokenize(list(ids), special=not skip_special_tokens)
        return str(text.decode("utf-8", errors="replace"))

    def batch_decode(self, rows: list[list[int]]) -> list[str]:
        return [self.decode(row) for row in rows]

    def end_of_generation_ids(self) -> list[int]:
        """The GGUF's EOS and end-of-turn tokens (``tokenizer.ggml.eos_token_id``/``eot_token_id``):
        what the checkpoint names, as transformers reads it. (llama.cpp's wider end-of-generation
        set, e.g. SmolLM2's ``<|endoftext|>`` and ``<|endofcode|>`` beside ``<|im_end|>``, would make
        every check against a transformers golden read as a changed generation config.)"""
        eot = self._llm.metadata.get("tokenizer.ggml.eot_token_id")
        return sorted({self.eos_token_id, *([int(eot)] if eot is not None else [])})

    def get_vocab(self) -> dict[str, int]:
        return {f"{i}:{self.decode([i])!r}": i for i in range(len(self))}

    def apply_chat_template(self, conversation: list[Any], tokenize: bool = False,
                            add_generation_prompt: bool = True) -> str:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        assert self.chat_template is not None
        formatter = Jinja2ChatFormatter(self.chat_template, eos_token=self.eos_token,
                                        bos_token=self.bos_token, add_generation_prompt=add_generation_prompt)
        return str(formatter(messages=list(conversation)).prompt)


# llama.cpp's general.file_type numbers (enum llama_ftype) for the common quantisations.
_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
               11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
               17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}


def _file_type(metadata: dict[str, str]) -> str:
    value = metadata.get("general.file_type")
    try:
        return _FILE_TYPES.get(int(value), f"ftype{value}") if value is not None else "unknown"
    except ValueError:
        return str(value)

