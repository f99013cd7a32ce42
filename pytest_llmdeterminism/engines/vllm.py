"""vLLM's offline engine in the test process (``vllm:MODEL``, a local folder; needs an NVIDIA GPU).

vLLM hands over each step's top-k logprobs, not raw logits: they are recorded under
:data:`~generation.VLLM_HASH_DEFINITION` and each step is checked greedy. The engine's settings
(seeds, eager execution, no prefix caching, one sequence at a time, batch invariance where the GPU
has it) are pinned and recorded; the list and its sources: ``docs/design/engines.md``.

Knobs after ``#``: ``tensor_parallel_size`` (1), ``max_num_seqs`` (1), ``gpu_memory_utilization``
(0.5) and ``max_model_len`` (2048), e.g. ``vllm:models/NAME#max_model_len=4096``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_llmdeterminism.decoding import DecodingConfig, refuse_beyond
from pytest_llmdeterminism.engines.capture import (
    Chunk,
    RowSteps,
    ScoreChunk,
    ScoredRow,
    rank_and_margin,
    rounded,
)
from pytest_llmdeterminism.engines.checkpoint import checkpoint_eos_ids, load_tokenizer, read_json
from pytest_llmdeterminism.engines.fingerprints import described
from pytest_llmdeterminism.engines.loaded import LoadedModel, LoadRequest
from pytest_llmdeterminism.engines.spec import EngineSpec
from pytest_llmdeterminism.errors import (
    ConfigurationError,
    EngineError,
    ModelLoadError,
    NonFiniteLogitsError,
    pasteable,
)
from pytest_llmdeterminism.generation import TOP_K, HashDefinition
from pytest_llmdeterminism.shape import GenerationSettings

INSTALL = "pip install vllm (needs an NVIDIA GPU)"


@dataclass(frozen=True)
class VLLMOptions:
    """The spec's ``#key=value`` options (``vllm:models/NAME#max_model_len=4096``)."""

    tensor_parallel_size: int = 1
    max_num_seqs: int = 1
    gpu_memory_utilization: float = 0.5
    max_model_len: int = 2048

ENGINE_SEED = 0  # the engine is built once per load; each request carries the test's own seed
LOGPROBS_MODE = "processed_logprobs"  # the scores greedy picks from, as transformers records them
GREEDY_SLACK = 1e-6  # the chosen token may trail the best returned logprob by this much
# vLLM introduced batch invariance for Hopper and newer; later releases name 8.0. Kept at 9.0
# until it is measured on Ampere.
BATCH_INVARIANT_CAPABILITY = (9, 0)
_ENV_KEYS = ("HF_HUB_OFFLINE", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_BATCH_INVARIANT")


def environment(capability: tuple[int, int] | None) -> dict[str, str]:
    """The environment variables to set before vLLM is imported, on a GPU of ``capability``."""
    env = {"HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if capability is not None and tuple(capability) >= BATCH_INVARIANT_CAPABILITY:
        env["VLLM_BATCH_INVARIANT"] = "1"
    return env


def engine_arguments(target: str, knobs: VLLMOptions, dtype: str, seed: int) -> dict[str, Any]:
    """The keyword arguments for ``vllm.LLM``."""
    return {
        "model": target,
        "tokenizer": target,
        "trust_remote_code": False,
        "load_format": "safetensors",  # pickle checkpoints can run code when loaded
        "dtype": dtype,
        "seed": seed,
        "enforce_eager": True,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": False,
        "max_num_seqs": knobs.max_num_seqs,
        "tensor_parallel_size": knobs.tensor_parallel_size,
        "gpu_memory_utilization": knobs.gpu_memory_utilization,
        "max_model_len": knobs.max_model_len,
        "logprobs_mode": LOGPROBS_MODE,
    }


def sampling_arguments(config: DecodingConfig, *, seed: int) -> dict[str, Any]:
    """The keyword arguments for ``vllm.SamplingParams``: greedy, every sampler knob neutral.

    Only ``config.eos_token_id`` stops a row (``ignore_eos`` drops vLLM's own EOS rule), as in
    transformers: an overridden EOS list, or the probe's empty one, means the same on both engines.
    """
    return {
        "n": 1,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,  # "all tokens" in every vLLM release (newer ones also take 0)
        "min_p": 0.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": float(config.repetition_penalty),
        "max_tokens": config.max_new_tokens,
        "min_tokens": config.min_new_tokens,
        "logprobs": TOP_K,
        "seed": seed,
        "stop_token_ids": list(config.eos_token_id),
        "ignore_eos": True,
        "skip_special_tokens": False,
        "detokenize": True,
    }


def chunk_from_outputs(outputs: Sequence[Any], *, spec: str, flags: Mapping[str, Any] | None = None,
                       max_tokens: int | None = None, id_bound: int | None = None) -> Chunk:
    """vLLM's ``RequestOutput`` objects, one per prompt, as recorded steps; each step checked greedy,
    and, where given, at most ``max_tokens`` steps and every id below ``id_bound``."""
    __tracebackhide__ = True
    import xxhash

    out = Chunk(tokens=[], steps=[], flags=dict(flags or {}))
    for row, request in enumerate(outputs):
        completion = request.outputs[0]
        tokens = [int(t) for t in completion.token_ids]
        if max_tokens is not None and len(tokens) > max_tokens:
            raise EngineError(spec, f"vLLM returned {len(tokens)} tokens for prompt {row} where the plugin "
                              f"asked for at most {max_tokens} (max_tokens); nothing was recorded")
        returned = completion.logprobs
        if returned is None or len(returned) < len(tokens):
            counted = 0 if returned is None else len(returned)
            raise EngineError(spec, f"vLLM returned logprobs for {counted} of {len(tokens)} steps of prompt "
                              f"{row}; the plugin asks for logprobs={TOP_K} and records every step")
        steps = RowSteps()
        # Steps past the tokens' (a longer list of logprobs) are not recorded.
        for step, (token, candidates) in enumerate(zip(tokens, returned, strict=False)):
            ranked = sorted(((int(i), float(lp.logprob)) for i, lp in candidates.items()),
                            key=lambda pair: (-pair[1], pair[0]))
            if id_bound is not None:
                outside = [i for i in (token, *dict(ranked)) if not 0 <= i < id_bound]
                if outside:
                    raise EngineError(spec, f"vLLM returned token id {outside[0]} at step {step} of prompt "
                                      f"{row}, outside the model's vocabulary (0 to {id_bound - 1}); nothing "
                                      "was recorded")
            if any(math.isnan(value) for _, value in ranked):
                raise NonFiniteLogitsError(step, row)
            chosen = dict(ranked).get(token)
            if chosen is None or chosen < ranked[0][1] - GREEDY_SLACK:
                shown = "no logprob" if chosen is None else f"logprob {chosen:.4f}"
                raise EngineError(spec, f"vLLM did not decode greedily at step {step} of prompt {row}: "
                                  f"it chose token {token} ({shown}) over token {ranked[0][0]} (logprob "
                                  f"{ranked[0][1]:.4f}). Something overrides the pinned greedy sampling: "
                                  "check for a vLLM logits-processor plugin, a VLLM_* sampler setting, and "
                                  f"that this vLLM supports logprobs_mode={LOGPROBS_MODE!r}")
            top = ranked[:TOP_K]
            step_hash = xxhash.xxh3_64_hexdigest(json.dumps([token, top], separators=(",", ":")).encode())
            steps.append(step_hash, [i for i, _ in top], [value for _, value in top])
        out.tokens.append(tokens)
        out.steps.append(steps)
    return out


def score_arguments(top_k: int) -> dict[str, Any]:
    """The keyword arguments for ``vllm.SamplingParams`` of a score: the prompt's top-k logprobs
    (``prompt_logprobs``, at most vLLM's ``max_logprobs``, 20 by default), one greedy token generated
    and dropped, every sampler knob neutral."""
    return {
        "n": 1,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "max_tokens": 1,
        "prompt_logprobs": top_k,
        "seed": 0,
        "skip_special_tokens": False,
        "detokenize": False,
    }


def scores_from_outputs(outputs: Sequence[Any], rows: list[tuple[list[int], list[int]]], *, spec: str,
                        top_k: int, prompt_logprobs: bool, flags: Mapping[str, Any] | None = None,
                        id_bound: int | None = None) -> ScoreChunk:
    """vLLM's ``RequestOutput`` objects of prompt + continuation, one per pair, as scored positions:
    position ``t``'s entry of ``prompt_logprobs`` (a dict token id -> ``Logprob``) is the distribution
    that predicts token ``t``, with that token's logprob and vocabulary rank. Hashed as
    :data:`~generation.VLLM_HASH_DEFINITION` over the given token and the top-k (with the given
    token's own entry after them where it is not among them)."""
    __tracebackhide__ = True
    import xxhash

    scored = []
    for row, (request, (prompt, continuation)) in enumerate(zip(outputs, rows, strict=True)):
        given = prompt + continuation
        returned = getattr(request, "prompt_logprobs", None)
        if returned is None or len(returned) < len(given):
            counted = 0 if returned is None else len(returned)
            raise EngineError(spec, f"vLLM returned prompt logprobs for {counted} of {len(given)} positions "
                              f"of pair {row}; a score needs prompt_logprobs={top_k} (SamplingParams) for "
                              "each")
        found = ScoredRow()
        for position in range(len(prompt), len(given)):
            token, candidates = given[position], returned[position] or {}
            ranked = sorted(((int(i), float(lp.logprob)) for i, lp in candidates.items()),
                            key=lambda pair: (-pair[1], pair[0]))
            if any(math.isnan(value) for _, value in ranked):
                raise NonFiniteLogitsError(position - len(prompt), row)
            if id_bound is not None:
                outside = [i for i, _ in ranked if not 0 <= i < id_bound]
                if outside:
                    raise EngineError(spec, f"vLLM returned token id {outside[0]} at position {position} of "
                                      f"pair {row}, outside the model's vocabulary (0 to {id_bound - 1}); "
                                      "nothing was recorded")
            if token not in candidates:
                raise EngineError(spec, f"vLLM returned no logprob for the continuation's token {token} at "
                                  f"position {position} of pair {row}; nothing was recorded")
            own = float(candidates[token].logprob)
            top = ranked[:top_k]
            hashed = top if token in dict(top) else [*top, (token, own)]
            found.hashes.append(xxhash.xxh3_64_hexdigest(json.dumps([token, hashed],
                                                                    separators=(",", ":")).encode()))
            found.logprobs.append(rounded(own))
            found.top.append(tuple((i, rounded(lp)) for i, lp in top))
            rank, margin = rank_and_margin(token, own, top, top_k)
            vocabulary_rank = getattr(candidates[token], "rank", None)  # vLLM's own, of the whole vocabulary
            found.ranks.append(int(vocabulary_rank) if isinstance(vocabulary_rank, int) else rank)
            found.rank_margins.append(margin)
        if prompt_logprobs:
            found.prompt_logprobs = [None, *(
                rounded(float(returned[p][given[p]].logprob)) if given[p] in (returned[p] or {}) else None
                for p in range(1, len(prompt)))]
        scored.append(found)
    return ScoreChunk(rows=scored, flags=dict(flags or {}))


def load(spec: EngineSpec, request: LoadRequest) -> LoadedModel:
    """``vllm:FOLDER``, loaded: a local folder with safetensors weights, on CUDA."""
    __tracebackhide__ = True
    dtype, device = request.dtype, request.device
    knobs = spec.options(VLLMOptions)
    target = spec.target
    if not 0 < knobs.gpu_memory_utilization <= 1:
        raise ConfigurationError("llm_model", spec.text, "gpu_memory_utilization must be above 0 and at "
                                 "most 1 (the share of GPU memory vLLM may take), e.g. "
                                 "#gpu_memory_utilization=0.5")
    path = Path(target)
    if not path.is_dir():
        raise ModelLoadError(spec.text, f"no such folder: {target!r}. vllm: takes a local model folder; the "
                             "plugin never downloads (e.g. `hf download ORG/NAME --local-dir models/NAME`, "
                             "then "
                             f"{pasteable('llm_model', 'vllm:models/NAME')})")
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        raise ModelLoadError(spec.text, f"no *.safetensors weights in {target!r}; vllm: loads safetensors "
                             "only (convert with model.save_pretrained(dir, safe_serialization=True))")
    if device not in ("auto", "cuda", "cuda:0"):
        raise ConfigurationError("llm_device", device, "vLLM runs on the first visible CUDA device; use "
                                 f"{pasteable('llm_device', 'auto')} or cuda, and pick the GPU with "
                                 "CUDA_VISIBLE_DEVICES")
    if importlib.util.find_spec("vllm") is None:
        raise ModelLoadError(spec.text, f"vllm: needs vLLM: {INSTALL}")
    import torch

    if not torch.cuda.is_available():
        raise ModelLoadError(spec.text, "vLLM needs an NVIDIA GPU with CUDA, and none is available here. On "
                             f"this machine use {pasteable('llm_model', 'llamacpp:PATH.gguf')} or the "
                             f"transformers backend ({pasteable('llm_model', target)})")
    tokenizer = load_tokenizer(spec.text, path)  # before the engine takes the GPU: a broken folder fails fast
    capability = torch.cuda.get_device_capability(0)
    for key, value in environment(capability).items():
        os.environ.setdefault(key, value)  # a value the user set is kept, and recorded below
    in_force = {key: os.environ.get(key) for key in _ENV_KEYS}
    vllm = importlib.import_module("vllm")  # typed as Any: vLLM is optional and not installed for mypy
    arguments = engine_arguments(target, knobs, dtype, ENGINE_SEED)
    try:
        llm = vllm.LLM(**arguments)
    except (RuntimeError, ValueError, TypeError) as error:
        raise ModelLoadError(spec.text, f"vLLM could not load it: {type(error).__name__}: {error}") from error
    pinned = {key: arguments[key] for key in ("enforce_eager", "enable_prefix_caching",
                                              "enable_chunked_prefill", "load_format", "logprobs_mode")}
    describe = {
        "engine": "vllm",
        "engine_version": str(vllm.__version__),
        "device_class": "cuda",
        "device_name": torch.cuda.get_device_name(0),
        "compute_capability": ".".join(map(str, capability)),
        "cuda": torch.version.cuda,
        "torch": str(torch.__version__),
        "dtype": dtype,
        **dataclasses.asdict(knobs),
        **pinned,
        "batch_invariant": in_force["VLLM_BATCH_INVARIANT"] == "1",
        "rows_alone": knobs.max_num_seqs == 1,
        "seed": ENGINE_SEED,
        "env": in_force,
        "model": path.name,
        "weights_file": str(weights[0]),
    }
    flags = {**pinned, "max_num_seqs": knobs.max_num_seqs, **in_force}
    engine = VLLMEngine(spec.text, path, llm, vllm, tokenizer, knobs, flags)
    return LoadedModel(spec=spec.text, kind="vllm", path=path, model=llm, tokenizer=tokenizer, dtype=dtype,
                       device="cuda:0", engine=engine, describe=describe)


class VLLMEngine:
    """vLLM's ``LLM`` in this process: prompts submitted as token ids, one ``generate`` call per prompt
    (``max_num_seqs=1``) or per chunk, each step's returned top-k recorded and checked greedy."""

    name = "vllm"
    hash_definition = HashDefinition.VLLM_TOPK
    # vLLM samples with its own generator, which depends on the batch, the hardware and the version
    owns_sampling = False
    supports_audit = False

    def __init__(self, spec: str, path: Path, llm: Any, vllm: Any, tokenizer: Any, knobs: VLLMOptions,
                 flags: Mapping[str, Any]) -> None:
        self._spec, self._llm, self._vllm = spec, llm, vllm
        self._max_model_len = knobs.max_model_len
        self._eos = checkpoint_eos_ids(path, tokenizer)
        self._vocab_size = min(len(tokenizer), _config_vocab_size(path) or len(tokenizer))
        self._id_bound = max(len(tokenizer), _config_vocab_size(path) or 0)  # a padded vocabulary's ids too
        # With one sequence at a time each prompt runs alone; more share vLLM's batches.
        self.runs_rows_alone = knobs.max_num_seqs == 1
        self._flags = {**flags, "requests": "one at a time" if self.runs_rows_alone else "one call per chunk"}

    def eos_token_ids(self) -> list[int]:
        return list(self._eos)

    def vocab_size(self) -> int:
        return self._vocab_size

    def fingerprint(self, loaded: LoadedModel) -> dict[str, Any]:
        """What its load described (version, pinned knobs), plus the model's hashes."""
        return described(loaded)

    def run(self, rows: list[list[int]], config: DecodingConfig, settings: GenerationSettings,
            keep_logits: bool) -> Chunk:
        __tracebackhide__ = True
        refuse_beyond("vLLM", config, keep_logits=keep_logits, has_logits=False,
                      longest_prompt=max(map(len, rows)),
                      context=(self._max_model_len, "max_model_len", "vllm:FOLDER#max_model_len=4096"))
        params = self._vllm.SamplingParams(**sampling_arguments(config, seed=settings.seed))
        prompts = [{"prompt_token_ids": list(ids)} for ids in rows]  # vLLM's TokensPrompt: no re-tokenising
        calls = [[prompt] for prompt in prompts] if self.runs_rows_alone else [prompts]
        outputs = [output for call in calls for output in self._llm.generate(call, params, use_tqdm=False)]
        return chunk_from_outputs(outputs, spec=self._spec, flags=self._flags,
                                  max_tokens=config.max_new_tokens, id_bound=self._id_bound)


    def score(self, rows: list[tuple[list[int], list[int]]], settings: GenerationSettings, *,
              top_k: int, prompt_logprobs: bool) -> ScoreChunk:
        """Each prompt + continuation as one prompt of token ids, with ``prompt_logprobs``."""
        __tracebackhide__ = True
        for prompt, continuation in rows:
            if len(prompt) + len(continuation) + 1 > self._max_model_len:
                raise ConfigurationError("llm_model", f"#max_model_len={self._max_model_len}",
                                         f"a {len(prompt)}-token prompt plus a {len(continuation)}-token "
                                         "continuation (and the one token generated) does not fit; raise "
                                         "max_model_len in the spec (vllm:FOLDER#max_model_len=4096)")
        params = self._vllm.SamplingParams(**score_arguments(top_k))
        prompts = [{"prompt_token_ids": prompt + continuation} for prompt, continuation in rows]
        calls = [[prompt] for prompt in prompts] if self.runs_rows_alone else [prompts]
        outputs = [output for call in calls for output in self._llm.generate(call, params, use_tqdm=False)]
        return scores_from_outputs(outputs, rows, spec=self._spec, top_k=top_k,
                                   prompt_logprobs=prompt_logprobs, flags=self._flags,
                                   id_bound=self._id_bound)


def _config_vocab_size(path: Path) -> int | None:
    config = read_json(path / "config.json")
    size = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
    return size if isinstance(size, int) else None
