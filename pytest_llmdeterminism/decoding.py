"""The decoding settings of a call: greedy, or the plugin's seeded sampler under ``do_sample=True``;
which arguments are accepted and recorded in a golden, which are refused and why, and what an
engine cannot do (:func:`refuse_beyond`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_llmdeterminism.errors import ConfigurationError, SamplingRefusedError, as_float, as_int
from pytest_llmdeterminism.sampling import SamplingConfig

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
    "generation_config": "a whole GenerationConfig can carry sampling settings; pass single arguments",
    "logits_processor": "custom logits processors are not recorded in the golden",
    "streamer": "streamers are not supported by the fixed-shape batching",
}


# transformers' arguments for speculative decoding: drafts verified by one forward of k + 1 positions.
# Not recorded in a golden: on phase-invariant kernels the verified tokens and every step's logits are
# plain greedy decoding's, bit for bit (engines/hf_speculative.py).
SPECULATION_ARGUMENTS = ("prompt_lookup_num_tokens", "assistant_model")


@dataclass(frozen=True)
class Speculation:
    """How a greedy call speculates: ``prompt_lookup`` (drafts are n-grams of the prompt, transformers'
    ``prompt_lookup_num_tokens``) or ``assistant`` (a draft model decodes them; today the model
    itself, passed as ``assistant_model=llm_model``). ``tokens``: the drafts per verify pass asked
    (prompt lookup's; transformers sizes an assistant's itself)."""

    method: str
    tokens: int = 0
    assistant: Any = field(default=None, compare=False, repr=False)

    def describe(self) -> str:
        if self.method == "prompt_lookup":
            return f"prompt lookup, {self.tokens} draft token(s) a pass"
        return "the model itself as its draft (assistant_model)"


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
    # Speculative decoding (greedy only): how the engine runs the call, not what it computes, so it is
    # not in as_dict(): a speculated generation is checked against the plain one's golden.
    speculation: Speculation | None = None

    def as_dict(self) -> dict[str, Any]:
        """The config as a golden records it and transformers' ``GenerationConfig`` takes it (the
        sampling settings, under ``do_sample=True`` only, are recorded; the engine never passes them
        on: greedy decoding over the perturbed scores picks the drawn token)."""
        # Every field is immutable: no deep copy (dataclasses.asdict) needed, once or twice a call.
        base = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("sampling", "seeds", "speculation")}
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
    speculation = speculation_of(overrides)
    if speculation is not None:
        if overrides.get("do_sample") is True:
            raise SamplingRefusedError(
                "do_sample", True, "speculative decoding is greedy only here: sampled speculation accepts "
                "drafts by rejection sampling with transformers' random generator, not the plugin's seeded "
                "sampler, so its draws could not be reproduced. Sample without speculation, or speculate "
                "greedily")
        if overrides.get("use_cache") is False:
            raise ConfigurationError("llm_model.generate(use_cache=False)", False, "speculative decoding "
                                     "verifies its drafts against the KV cache; leave use_cache on")
        rest = {name: value for name, value in overrides.items() if name not in SPECULATION_ARGUMENTS}
        config = resolve_generation_config(rest, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids,
                                           pad_token_id=pad_token_id, seed=seed, vocab_size=vocab_size)
        return dataclasses.replace(config, speculation=speculation)
    if overrides.get("do_sample") is True:
        return _sampled(overrides, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids,
                        pad_token_id=pad_token_id, seed=seed, vocab_size=vocab_size)
    if "seed" in overrides:
        raise SamplingRefusedError("seed", overrides["seed"], "a seed only matters when sampling: pass "
                                   "do_sample=True to sample with it")
    accepted: dict[str, Any] = {}
    for name, value in overrides.items():
        if name in SPECULATION_ARGUMENTS:  # None or 0 here: no speculation
            continue
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


def speculation_of(overrides: Mapping[str, Any]) -> Speculation | None:
    """The call's speculation from transformers' arguments (``None`` or 0 is none): prompt lookup of
    ``prompt_lookup_num_tokens`` >= 1 tokens, or ``assistant_model`` (which model may draft is the
    caller's to check: ``llm_model.generate`` takes the model itself); not both."""
    __tracebackhide__ = True
    lookup, assistant = overrides.get("prompt_lookup_num_tokens"), overrides.get("assistant_model")
    if as_int(lookup) == 0 and not isinstance(lookup, bool):
        lookup = None  # 0: no prompt lookup
    if lookup is not None and assistant is not None:
        raise ConfigurationError("llm_model.generate(prompt_lookup_num_tokens=..., assistant_model=...)",
                                 lookup, "pass one way of drafting: prompt lookup or an assistant model")
    if assistant is not None:
        return Speculation("assistant", assistant=assistant)
    if lookup is None:
        return None
    tokens = as_int(lookup)
    if tokens is None or tokens < 1:
        raise ConfigurationError("llm_model.generate(prompt_lookup_num_tokens=...)", lookup,
                                 "expected an integer >= 1: how many tokens each verify pass drafts from "
                                 "the prompt (0 or None: no speculation)")
    return Speculation("prompt_lookup", tokens)


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
