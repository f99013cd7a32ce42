"""The :class:`Generation` record, and the decoding config (greedy, or the plugin's seeded sampler
under ``do_sample=True``): what is accepted, what is refused."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pytest_llmdeterminism.errors import ConfigurationError, SamplingRefusedError, as_float, as_int
from pytest_llmdeterminism.sampling import RECORDED_SETTINGS, SamplingConfig

TopK = tuple[tuple[int, float], ...]


class HashDefinition(str, Enum):  # not StrEnum: Python 3.10 has none
    """What a Generation's step hashes hash (golden files name it: ``step_hash``); the value is the
    name a golden stores."""

    def __str__(self) -> str:
        return self.value

    LOGITS = "logits"  # the raw logits: transformers, llama.cpp
    SERVED_TOPK = "served-topk"  # the texts and top-k logprobs an OpenAI-compatible server returned
    VLLM_TOPK = "vllm-topk"  # the ids and top-k logprobs vLLM returned


class PromptForm(str, Enum):
    """How a test gave its prompt (a golden stores the value)."""

    def __str__(self) -> str:
        return self.value

    TEXT = "text"
    CHAT = "chat"  # the prompt is the rendered conversation
    TOKEN_IDS = "token_ids"  # the prompt is the ids, decoded

# What a Generation's per-step fields mean (golden files name the hash definition in their header).
LOGIT_HASH_DEFINITION = (
    "xxh3_64 hex digest of the model forward's output logits at the last position of each row, "
    "before any logits processor, cast to float32, as little-endian bytes"
)
# Each engine hashes what it really exposes; a golden names its definition, and goldens of two
# definitions never have their hashes compared (the comparator says so instead).
SERVED_HASH_DEFINITION = (
    "xxh3_64 hex digest of the compact JSON [token, [[token, logprob], ...]] of one step as an "
    "OpenAI-compatible server returned it: the chosen token's text and the top-k alternatives' texts "
    "with their logprobs (float64, as sent), best first"
)
VLLM_HASH_DEFINITION = (
    "xxh3_64 hex digest of the compact JSON [token id, [[token id, logprob], ...]] of one step as "
    "vLLM returned it: the chosen token and the top-k alternatives with their logprobs, best first"
)
HASH_DEFINITIONS = {HashDefinition.LOGITS: LOGIT_HASH_DEFINITION,
                    HashDefinition.SERVED_TOPK: SERVED_HASH_DEFINITION,
                    HashDefinition.VLLM_TOPK: VLLM_HASH_DEFINITION}
# A served token whose text is no single token of the local tokenizer gets an id from here up
# (TEXT_ONLY_IDS + a hash of its text): stable, and never a real vocabulary id.
TEXT_ONLY_IDS = 1 << 40
DEFAULT_ENGINE = "transformers"  # the engine whose goldens carry no engine prefix in their variant
TOP_K = 5
LOGPROB_DECIMALS = 6
# A token a processor suppressed has logprob -inf, which JSON cannot hold; stored as this floor.
LOGPROB_FLOOR = -1e9

# Arguments that change every step's scores or the length: accepted, recorded in the golden.
ACCEPTED_OVERRIDES = (
    "max_new_tokens",
    "min_new_tokens",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "eos_token_id",
    "use_cache",
)

# Arguments that would make decoding random or non-greedy, and why each is refused.
_SAMPLING_REASONS = {
    "do_sample": "sampling draws tokens at random",
    "temperature": "a temperature only matters when sampling; even 1e-8 is sampling, not greedy. To "
                   "sample with the plugin's seeded sampler, pass do_sample=True with it",
    "top_p": "nucleus sampling draws tokens at random; with do_sample=True the plugin's seeded sampler "
             "takes it",
    "top_k": "top-k is a sampling filter; even top_k=1 runs the sampling path, which is not greedy. With "
             "do_sample=True the plugin's seeded sampler takes it",
    "min_p": "min-p is a sampling filter; with do_sample=True the plugin's seeded sampler takes it",
    "typical_p": "typical sampling draws tokens at random",
    "epsilon_cutoff": "epsilon sampling draws tokens at random",
    "eta_cutoff": "eta sampling draws tokens at random",
    "num_beams": "beam search is not greedy decoding",
    "num_beam_groups": "group beam search is not greedy decoding",
    "diversity_penalty": "diverse beam search is not greedy decoding",
    "penalty_alpha": "contrastive search is not greedy decoding",
    "num_return_sequences": "several sequences per prompt need sampling or beams",
    "assistant_model": "assisted decoding takes a different numeric path",
    "prompt_lookup_num_tokens": "prompt-lookup decoding takes a different numeric path",
    "generation_config": "a whole GenerationConfig can carry sampling settings; pass single arguments",
    "logits_processor": "custom logits processors are not recorded in the golden",
    "streamer": "streamers are not supported by the fixed-shape batching",
}


# Values of refused arguments that still mean plain greedy decoding (None always does).
_NEUTRAL_VALUES: dict[str, tuple[float, ...]] = {
    "temperature": (0,),
    "top_p": (1,),
    "min_p": (0,),
    "typical_p": (1,),
    "epsilon_cutoff": (0,),
    "eta_cutoff": (0,),
    "num_beams": (1,),
    "num_beam_groups": (1,),
    "diversity_penalty": (0,),
    "num_return_sequences": (1,),
}


def _is_neutral(name: str, value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, bool):
        return name == "do_sample" and value is False
    number = as_float(value)  # a numpy scalar too
    return number is not None and number in _NEUTRAL_VALUES.get(name, ())


@dataclass(frozen=True, kw_only=True)
class DecodingConfig:
    """The effective decoding config: what every engine runs, and what a golden records (:meth:`as_dict`,
    in this field order). Greedy, or with ``do_sample=True`` the plugin's seeded sampler's settings in
    ``sampling`` (decoding stays greedy, over perturbed scores); ``num_beams`` is always 1."""

    do_sample: bool = False
    num_beams: int = 1
    max_new_tokens: int
    min_new_tokens: int = 0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    eos_token_id: tuple[int, ...]  # sorted
    pad_token_id: int
    use_cache: bool = True
    # do_sample=True: the plugin's own sampler (sampling.py) draws each token; ``seeds`` holds one
    # seed per prompt of the call (set per chunk by the model), the config's own seed the default.
    sampling: SamplingConfig | None = None
    seeds: tuple[int, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The config as a golden records it and transformers' ``GenerationConfig`` takes it (the
        sampling settings, under ``do_sample=True`` only, are recorded; the engine never passes them
        on: greedy decoding over the perturbed scores picks the drawn token)."""
        # Every field is immutable: no deep copy (dataclasses.asdict) needed, once or twice a call.
        base = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("sampling", "seeds")}
        sampled = {} if self.sampling is None else {"do_sample": True, **self.sampling.as_dict()}
        return {**base, "eos_token_id": list(self.eos_token_id), **sampled}

    def seed_of(self, row: int) -> int:
        """The sampling seed of row ``row`` of the chunk this config runs."""
        assert self.sampling is not None
        return self.seeds[row] if self.seeds else self.sampling.seed


# With do_sample=True these choose the plugin's sampler's settings (sampling.SamplingConfig).
SAMPLING_ARGUMENTS = ("temperature", "top_k", "top_p", "min_p", "seed")


def resolve_generation_config(overrides: Mapping[str, Any], *, max_new_tokens: int,
                              eos_token_ids: list[int], pad_token_id: int,
                              seed: int = 0, vocab_size: int | None = None) -> DecodingConfig:
    """The effective config: defaults, then accepted overrides. Sampling arguments are refused unless
    ``do_sample=True`` asks for the plugin's own sampler; then a sampling argument not given (or
    ``None``) takes transformers' library default (``SamplingConfig``: ``top_k=50``), ``seed`` (the
    test's) is the default seed, and ``seed=`` may give one per prompt (checked against the prompts by
    the model).
    Numbers may be numpy scalars (any ``numbers.Real``; integers any ``numbers.Integral``, never a
    bool): the config holds them as plain ``int`` and ``float``. ``vocab_size``: the model's, which
    an ``eos_token_id`` override must be below."""
    __tracebackhide__ = True
    if overrides.get("do_sample") is True:
        return _sampled(overrides, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids,
                        pad_token_id=pad_token_id, seed=seed, vocab_size=vocab_size)
    if "seed" in overrides:
        raise SamplingRefusedError("seed", overrides["seed"], "a seed only matters when sampling: pass "
                                   "do_sample=True to sample with it")
    accepted: dict[str, Any] = {}
    for name, value in overrides.items():
        if name in _SAMPLING_REASONS:
            if not _is_neutral(name, value):
                raise SamplingRefusedError(name, value, _SAMPLING_REASONS[name])
            continue
        if name not in ACCEPTED_OVERRIDES:
            raise SamplingRefusedError(
                name, value,
                f"it is not a recorded greedy setting (accepted: {', '.join(ACCEPTED_OVERRIDES)})",
            )
        accepted[name] = _checked_override(name, value, vocab_size)
    defaults = DecodingConfig(max_new_tokens=max_new_tokens, eos_token_id=tuple(sorted(eos_token_ids)),
                              pad_token_id=pad_token_id)
    return dataclasses.replace(defaults, **accepted)


def _sampled(overrides: Mapping[str, Any], *, max_new_tokens: int, eos_token_ids: list[int],
             pad_token_id: int, seed: int, vocab_size: int | None) -> DecodingConfig:
    __tracebackhide__ = True
    # None is "not given", as in transformers' generate(): the default applies.
    settings = {name: overrides[name] for name in SAMPLING_ARGUMENTS if overrides.get(name) is not None}
    seeds: tuple[int, ...] = ()
    given = settings.pop("seed", seed)
    if isinstance(given, (list, tuple)):
        if not given:
            raise ConfigurationError("llm_model.generate(seed=...)", given, "expected an integer, or one "
                                     "integer per prompt")
        # Validated one by one (the error names the bad seed), each as the plain int it records.
        seeds = tuple(SamplingConfig(seed=each).seed for each in given)
        given = seeds[0]
    sampling = SamplingConfig(**settings, seed=given)
    rest = {name: value for name, value in overrides.items()
            if name not in (*SAMPLING_ARGUMENTS, "do_sample")}
    config = resolve_generation_config(rest, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids,
                                       pad_token_id=pad_token_id, vocab_size=vocab_size)
    return dataclasses.replace(config, do_sample=True, sampling=sampling, seeds=seeds)


def refuse_beyond(engine: str, config: DecodingConfig, *, keep_logits: bool = False, has_logits: bool = True,
                  logprobs_after_penalties: bool = True, context: tuple[int, str, str] | None = None,
                  longest_prompt: int = 0) -> None:
    """What ``engine`` cannot do, refused by name before anything runs: an n-gram block (a
    transformers processor); raw logits (the audit's) where it returns none; penalties where its
    logprobs come from before them (a server: greedy decoding could not be checked); a prompt plus
    ``max_new_tokens`` beyond its ``context``: ``(size, knob, example spec that raises it)``."""
    __tracebackhide__ = True
    if keep_logits and not has_logits:
        raise ConfigurationError("--llm-audit", True, f"{engine} returns no raw logits; audit on the "
                                 "transformers backend (llm_model = the model's folder or .gguf file, "
                                 "without an engine prefix)")
    if config.no_repeat_ngram_size:
        raise ConfigurationError("llm_model.generate(no_repeat_ngram_size=...)", config.no_repeat_ngram_size,
                                 f"is supported by the transformers backend only, not by {engine}")
    for name, value, neutral in (("repetition_penalty", config.repetition_penalty, 1.0),
                                 ("min_new_tokens", config.min_new_tokens, 0)):
        if not logprobs_after_penalties and value != neutral:
            raise ConfigurationError(f"llm_model.generate({name}=...)", value, "a server returns its "
                                     "logprobs from before its penalties, so greedy decoding could not be "
                                     "checked; test it on the transformers or llamacpp backend")
    if context is not None and longest_prompt + config.max_new_tokens > context[0]:
        size, knob, example = context
        raise ConfigurationError("llm_model", f"#{knob}={size}",
                                 f"a {longest_prompt}-token prompt plus "
                                 f"max_new_tokens={config.max_new_tokens} does not fit the context; raise "
                                 f"{knob} in the spec ({example})")


def _checked_override(name: str, value: Any, vocab_size: int | None) -> Any:
    """An accepted override, validated so that a bad value fails here, not deep in transformers, and
    made plain (a numpy scalar becomes the ``int`` or ``float`` a golden records)."""
    __tracebackhide__ = True
    if name == "use_cache":
        if not isinstance(value, bool):
            raise ConfigurationError(f"llm_model.generate({name}=...)", value, "expected True or False")
        return value
    if name == "eos_token_id":
        return _checked_eos(value, vocab_size)
    if name == "repetition_penalty":
        number = as_float(value)
        if number is None or not (math.isfinite(number) and number > 0):
            raise ConfigurationError(f"llm_model.generate({name}=...)", value,
                                     "expected a finite number > 0 (1.0 means no penalty)")
        return number
    minimum = 1 if name == "max_new_tokens" else 0  # min_new_tokens, no_repeat_ngram_size
    integer = as_int(value)
    if integer is None or integer < minimum:
        raise ConfigurationError(f"llm_model.generate({name}=...)", value,
                                 f"expected an integer >= {minimum}")
    return integer


def _checked_eos(value: Any, vocab_size: int | None) -> tuple[int, ...]:
    """An ``eos_token_id`` override: one id or a non-empty list, each an id of the vocabulary (an id
    outside it is never generated, so it would silently never stop a generation)."""
    __tracebackhide__ = True
    setting = "llm_model.generate(eos_token_id=...)"
    given = list(value) if isinstance(value, (list, tuple)) else [value]
    plain = [as_int(token) for token in given]
    ids = [token for token in plain if token is not None]
    if not ids or len(ids) != len(plain):
        raise ConfigurationError(setting, value, "expected a token id or a non-empty list of token ids")
    outside = [token for token in ids if token < 0 or (vocab_size is not None and token >= vocab_size)]
    if outside:
        within = "0 or more" if vocab_size is None else f"from 0 to {vocab_size - 1}, the model's vocabulary"
        raise ConfigurationError(setting, value, f"{outside[0]} is no token id: ids are {within}; an id "
                                 "outside the vocabulary never ends a generation. Pass the id of the token "
                                 "that should stop it, e.g. tokenizer.convert_tokens_to_ids('</s>')")
    return tuple(sorted(set(ids)))


def variant_of(fingerprint: Mapping[str, Any]) -> str:
    """The golden variant of a record with this fingerprint: device class and dtype (``cpu/float32``),
    after the engine unless it is transformers (``llamacpp:cpu/Q4_1``)."""
    engine = fingerprint.get("engine", DEFAULT_ENGINE)
    where = f"{fingerprint.get('device_class', 'cpu')}/{fingerprint.get('dtype', 'float32')}"
    return where if engine == DEFAULT_ENGINE else f"{engine}:{where}"


@dataclass(frozen=True)
class Generation:
    """One prompt's continuation (greedy, or drawn by the seeded sampler) and what the model
    computed at each step.

    Step ``t`` holds: the chosen token ``token_ids[t]``, ``step_hashes[t]`` (xxh3-64 of the raw
    logits row, see :data:`LOGIT_HASH_DEFINITION`),
    ``top_logprobs[t]`` (the k best ``(token id, logprob)`` pairs) and ``margins[t]`` (top-1 minus
    top-2 logprob: how sure the model was).
    """

    prompt: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str
    step_hashes: tuple[str, ...]
    top_logprobs: tuple[TopK, ...]
    margins: tuple[float, ...]
    finish_reason: str
    generation_config: Mapping[str, Any]
    batch_shape: str
    pieces: tuple[str, ...] = ()
    fingerprint: Mapping[str, Any] = field(default_factory=dict, compare=False)
    prompt_form: PromptForm = PromptForm.TEXT
    hash_definition: HashDefinition = HashDefinition.LOGITS  # what ``step_hashes`` hash
    # Sampled generations (``do_sample=True``): per step, how close the draw was to another token
    # (sampling.Draw.margin: the runner-up's distance, or the cut boundary's where nearer); empty for
    # greedy ones.
    draw_margins: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        steps = len(self.token_ids)
        lengths = {len(self.step_hashes), len(self.top_logprobs), len(self.margins)}
        if self.draw_margins:
            lengths.add(len(self.draw_margins))
        if lengths != {steps} or (self.pieces and len(self.pieces) != steps):
            raise ValueError(f"Generation has inconsistent per-step lengths: {steps} tokens, {lengths}")

    @property
    def logit_hashes(self) -> tuple[str, ...]:
        """Deprecated: ``logit_hashes`` is :attr:`step_hashes`'s earlier name (a step's hash is not
        always of logits: see :attr:`hash_definition`)."""
        return self.step_hashes

    @property
    def sampling(self) -> dict[str, Any]:
        """How a sampled generation (``do_sample=True``) was drawn: its sampler, temperature, top_k,
        top_p, min_p and seed as its ``generation_config`` records them; ``{}`` for a greedy one."""
        config = self.generation_config
        if config.get("do_sample") is not True:
            return {}
        return {name: config[name] for name in RECORDED_SETTINGS if name in config}

    @property
    def variant(self) -> str:
        """The golden variant this generation belongs to: device class and dtype (``cpu/float32``),
        after the engine unless it is transformers (``llamacpp:cpu/Q4_1``)."""
        return variant_of(self.fingerprint)


@dataclass(frozen=True)
class Score:
    """The logprobs a model gives a fixed ``continuation`` after ``prompt``, teacher-forced: every
    position is conditioned on the given tokens before it, so every position stays comparable
    whatever changed (a :class:`Generation` is comparable only up to its first changed token).

    Position ``t`` holds: the given token ``token_ids[t]``, ``logprobs[t]`` (its logprob given the
    prompt and ``token_ids[:t]``), ``ranks[t]`` (its rank among the vocabulary, 1 = the model's own
    choice; ``None`` where the engine does not say and it is outside the top-k), ``step_hashes[t]``
    (as a generation step's, of the logits row that predicts it), ``top_logprobs[t]`` (the k best
    ``(token id, logprob)`` pairs) and ``rank_margins[t]`` (the logprob distance from the given token
    to its nearest neighbour in rank, above or below: how far it was from changing rank; ``None``
    where unknown). ``prompt_logprobs``: the prompt's own tokens' logprobs (the first has none)
    when ``prompt_logprobs=True`` asked for them, else ``()``.
    """

    prompt: str
    prompt_token_ids: tuple[int, ...]
    continuation: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    ranks: tuple[int | None, ...]
    step_hashes: tuple[str, ...]
    top_logprobs: tuple[TopK, ...]
    rank_margins: tuple[float | None, ...]
    batch_shape: str
    pieces: tuple[str, ...] = ()
    fingerprint: Mapping[str, Any] = field(default_factory=dict, compare=False)
    prompt_form: PromptForm = PromptForm.TEXT
    hash_definition: HashDefinition = HashDefinition.LOGITS
    prompt_logprobs: tuple[float | None, ...] = ()

    kind = "score"  # a golden entry's ``kind`` (a generation's is "generation")

    def __post_init__(self) -> None:
        positions = len(self.token_ids)
        lengths = {len(self.logprobs), len(self.ranks), len(self.step_hashes), len(self.top_logprobs),
                   len(self.rank_margins)}
        if not positions:
            raise ValueError("a Score needs at least one continuation token")
        if lengths != {positions} or (self.pieces and len(self.pieces) != positions):
            raise ValueError(f"Score has inconsistent per-position lengths: {positions} tokens, {lengths}")
        if self.prompt_logprobs and len(self.prompt_logprobs) != len(self.prompt_token_ids):
            raise ValueError(f"Score has {len(self.prompt_logprobs)} prompt logprobs for "
                             f"{len(self.prompt_token_ids)} prompt tokens")

    @property
    def total(self) -> float:
        """The continuation's log-likelihood given the prompt: the sum of its logprobs."""
        return math.fsum(self.logprobs)

    @property
    def variant(self) -> str:
        """The golden variant this score belongs to (as :attr:`Generation.variant`)."""
        return variant_of(self.fingerprint)
