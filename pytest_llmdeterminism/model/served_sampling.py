"""Seeded sampling through a server, verified before it is trusted.

``do_sample=True`` on a server engine sends the server the request's own ``seed`` with the test's
sampling settings, and the golden records ``"sampler": "engine:<server>"``: the draw is the server's.
That is only a regression test where the server draws each request from its own seed alone, so it
is verified first, once per server and session (the result is kept on the loaded model), by two rows:

``concurrent``: a sampled request (:data:`NEEDLE_TOKENS` tokens) alone, then :data:`ROUNDS` times among
:data:`COMPANIONS` concurrent requests (``engines/server/companions.py``): the sample must not change (a
server whose generator is shared by the batch, or keyed by a row's place in it, fails).

``seed``: do different prompts sent with one seed share noise (vLLM #50440: one seed broadcast over
a batch; llama.cpp's one uniform per step, whatever the prompt)? Two prompts A and B, and
:data:`SEEDS` seeds ``s``: A with ``s``, B with ``s`` (the *same-seed* pair) and B with another seed
``s'`` (the *other-seed* pair). The seeds are distant (:func:`seed_pairs`): spread over all 31 bits,
half odd, and each ``s'`` differs from its ``s`` in the lowest bit (so modulo every power of two) and
in random higher ones: a server that reads only part of the seed (``seed % 2``, ``seed % 16``)
cannot give the other-seed pair the same noise. If the server keys its noise by the prompt (or the
request) as well as the seed, the seed's being shared tells nothing, and an event of a pair (the two
drew the same token) is as likely in a same-seed pair as in an other-seed pair, whatever the two
prompts' distributions are. So the row counts the seeds where only the same-seed pair agrees (``b``) and
where only the other-seed pair does (``c``); under that hypothesis each of those ``b + c`` is either
with probability 1/2, and ``P(X >= b)`` for ``X ~ Binomial(b + c, 1/2)`` below :data:`ALPHA` refuses
the server (a sign test; exact, no model of the server's sampler needed). Two events, each under its
own settings, so that both known ways of sharing noise show:

- noise per token id (a vector of Gumbel or exponential variates per seed): at a temperature so high
  that every prompt's distribution is nearly uniform (:data:`FLAT`, no top-k), the draw is nearly the
  argmax of the noise alone: one seed, the same token;
- one uniform per step, put through each prompt's sorted distribution (inverse CDF): with the cut
  to the top :data:`RANKED` tokens at that temperature, one seed draws the same *rank* (the drawn
  token's place among the step's returned top logprobs).

Each event is tested on its own at :data:`ALPHA`. The same row refuses a server that ignores the seed
(SGLang falls back to 42): A drew one token for every seed at the flat settings.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_llmdeterminism.decoding import DecodingConfig
from pytest_llmdeterminism.engines.loaded import ServedEngine
from pytest_llmdeterminism.engines.server.companions import alone, run_among
from pytest_llmdeterminism.errors import ConfigurationError
from pytest_llmdeterminism.generation import TOP_K
from pytest_llmdeterminism.sampling import SamplingConfig

if TYPE_CHECKING:
    from pytest_llmdeterminism.engines.capture import Chunk
    from pytest_llmdeterminism.engines.loaded import LoadedModel

__all__ = ["ALPHA", "SEEDS", "Paired", "ServedSampling", "seed_pairs", "sign_test", "verified_sampler"]

PROMPTS = ("Once upon a time", "The weather today is")  # A and B
SEEDS = 16
SEED_BITS = 0x7FFFFFFF  # 31 bits: every server's seed field takes them
ALPHA = 1e-3  # per event: a faithful server is refused by chance at most this often (each event)
FLAT = 1000.0  # the temperature that flattens every distribution
RANKED = 4  # the top-k cut of the rank event (below TOP_K: the drawn token's rank is always shown)
NEEDLE_TOKENS = 4
COMPANIONS = 3
ROUNDS = 2
SETTING = "llm_model.generate(do_sample=True)"


def seed_pairs(count: int = SEEDS) -> tuple[list[int], list[int]]:
    """The seed row's ``count`` same seeds and, for each, its other seed: drawn by a hash over all 31
    bits, alternately even and odd, and each other seed the same seed with its lowest bit and a random
    set of higher ones flipped, so that the two differ modulo every power of two and in their high bits."""
    import xxhash

    def drawn(what: str, index: int) -> int:
        return xxhash.xxh3_64_intdigest(f"llm-served-sampling {what} {index}".encode()) & SEED_BITS

    same = [(drawn("seed", i) & ~1) | (i & 1) for i in range(count)]
    return same, [s ^ (drawn("other", i) | 1) for i, s in enumerate(same)]


def sign_test(b: int, c: int) -> float:
    """``P(X >= b)`` for ``X ~ Binomial(b + c, 1/2)``: how likely ``b`` or more of the ``b + c``
    discordant pairs favour the same-seed pair if the seed's being shared meant nothing."""
    n = b + c
    return sum(math.comb(n, k) for k in range(b, n + 1)) / 2**n if n else 1.0


@dataclass(frozen=True)
class Paired:
    """One event of the seed row: how many of :data:`SEEDS` same-seed pairs and other-seed pairs agreed,
    ``b`` and ``c`` (the discordant counts) and the sign test's p-value."""

    event: str  # "the same token" or "the same rank"
    same: int
    other: int
    b: int
    c: int
    pairs: int

    @property
    def p(self) -> float:
        return sign_test(self.b, self.c)

    @property
    def shared(self) -> bool:
        return self.p < ALPHA

    @classmethod
    def of(cls, event: str, same: list[bool], other: list[bool]) -> Paired:
        b = sum(s and not o for s, o in zip(same, other, strict=True))
        c = sum(o and not s for s, o in zip(same, other, strict=True))
        return cls(event, sum(same), sum(other), b, c, len(same))

    def evidence(self) -> str:
        return (f"with one seed, the two prompts drew {self.event} for {self.same} of {self.pairs} seeds; "
                f"with different seeds, for {self.other} of {self.pairs} (sign test on the {self.b + self.c} "
                f"seeds where only one of the two agreed: p = {self.p:.2g}, below {ALPHA:g})")


@dataclass(frozen=True)
class ServedSampling:
    """What the two rows found on a server: ``problem`` is None where both verified."""

    sampler: str
    problem: str | None
    rows: tuple[str, ...]  # one line per row, as the refusal and the docs show them


def verified_sampler(loaded: LoadedModel) -> str:
    """The sampler a sampled golden of this server records, once its rows verify; else one
    :class:`ConfigurationError` with their evidence. Verified once per loaded model (per session)."""
    __tracebackhide__ = True
    engine = loaded.engine
    if engine.owns_sampling:
        raise AssertionError("the plugin's own sampler draws on this engine")  # callers ask first
    if not isinstance(engine, ServedEngine):
        raise ConfigurationError(SETTING, True, f"sampling is not available on the {engine.name} engine: "
                                 "the plugin cannot own its draw, which the engine's own generator "
                                 "seeds (vLLM's offline engine: by the batch, the hardware and the "
                                 "version), and no server draws it from a per-request seed that could be "
                                 "verified. Test sampled generation on the transformers backend (llm_model "
                                 "= the model's folder or .gguf file, without an engine prefix), in process "
                                 "with llamacpp:PATH.gguf, or on a server (openai:URL#...)")
    if loaded.served_sampling is None:
        loaded.served_sampling = verify(engine, loaded.tokenizer)
    found: ServedSampling = loaded.served_sampling
    if found.problem is not None:
        raise ConfigurationError(SETTING, True, found.problem)
    return found.sampler


def verify(engine: ServedEngine, tokenizer: object) -> ServedSampling:
    """Run the ``concurrent`` and ``seed`` rows on ``engine``'s server."""
    encode: Callable[[str], list[int]] = lambda text: list(tokenizer(text)["input_ids"])  # type: ignore[operator]  # noqa: E731
    first, second = (encode(text) for text in PROMPTS)
    pad = getattr(tokenizer, "pad_token_id", None)
    base = DecodingConfig(max_new_tokens=1, eos_token_id=tuple(sorted(engine.eos_token_ids())),
                          pad_token_id=pad if isinstance(pad, int) else 0)

    def sampled(seed: int, *, top_k: int = 0, tokens: int = 1) -> DecodingConfig:
        sampling = SamplingConfig(temperature=FLAT, top_k=top_k, seed=seed)
        return dataclasses.replace(base, do_sample=True, sampling=sampling, max_new_tokens=tokens)

    concurrent = _concurrent_row(engine, first, sampled(1, tokens=NEEDLE_TOKENS))
    rows = [concurrent[0]]
    where = (f"{engine.sampler} cannot draw seeded samples that a golden can hold, so do_sample=True is "
             "refused on it")
    fix = ("Test sampled generation with the plugin's own sampler instead (llm_model = the model's folder "
           "or .gguf file, or llamacpp:PATH.gguf), or serve one request at a time with a per-request seed "
           "(docs/serving-sampling.md)")
    if concurrent[1] is not None:
        return ServedSampling(engine.sampler, f"{where}: the concurrent row failed: {concurrent[1]}. {fix}",
                              tuple(rows))

    def draws(ids: list[int], seeds: list[int], *, top_k: int) -> list[tuple[int | None, int | None]]:
        return [_first_draw(alone(engine, ids, sampled(seed, top_k=top_k), seed)) for seed in seeds]

    same_seeds, other_seeds = seed_pairs()
    found = []
    for event, top_k in (("the same token", 0), ("the same rank", RANKED)):
        a, b_same, b_other = (draws(first, same_seeds, top_k=top_k), draws(second, same_seeds, top_k=top_k),
                              draws(second, other_seeds, top_k=top_k))
        index = 0 if top_k == 0 else 1
        same = [x[index] is not None and x[index] == y[index] for x, y in zip(a, b_same, strict=True)]
        other = [x[index] is not None and x[index] == y[index] for x, y in zip(a, b_other, strict=True)]
        found.append(Paired.of(event, same, other))
        if top_k == 0 and len({token for token, _ in a}) == 1:
            rows.append(f"seed: {PROMPTS[0]!r} drew the same token for each of {SEEDS} seeds at temperature "
                        f"{FLAT:g}")
            ignored = (f"{where}: the seed row failed: {rows[-1]}: the server ignores the request's seed (or "
                       f"does not apply its temperature). {fix}")
            return ServedSampling(engine.sampler, ignored, tuple(rows))
    shared = [paired for paired in found if paired.shared]
    rows.append("seed: " + "; ".join(paired.evidence().replace(f", below {ALPHA:g}", "") for paired in found))
    if shared:
        problem = (f"{where}: the seed row failed: different prompts sent with one seed share noise "
                   f"({PROMPTS[0]!r} and {PROMPTS[1]!r}: {shared[0].evidence()}). {fix}")
        return ServedSampling(engine.sampler, problem, tuple(rows))
    return ServedSampling(engine.sampler, None, tuple(rows))


def _concurrent_row(engine: ServedEngine, ids: list[int], config: DecodingConfig) -> tuple[str, str | None]:
    """The row's line, and what failed (None: the sample did not change among companions)."""
    seed = config.seed_of(0)
    reference = alone(engine, ids, config, seed).tokens[0]
    for index, done in enumerate(run_among(engine, ids, config, companions=COMPANIONS, rounds=ROUNDS,
                                           seed=seed), 1):
        tokens = done.output.tokens[0]
        if tokens != reference:
            step = next((t for t, (x, y) in enumerate(zip(reference, tokens, strict=False)) if x != y),
                        min(len(reference), len(tokens)))
            problem = (f"a sample of {PROMPTS[0]!r} (seed {seed}, temperature {FLAT:g}) drew other tokens "
                       f"among {done.companions} concurrent requests (round {index} of {ROUNDS}, sent at "
                       f"position {done.position}) than alone, first at step {step}: alone {reference}, "
                       f"among companions {tokens}: the server's sample depends on its companions")
            return f"concurrent: {problem}", problem
    return (f"concurrent: a sample of {NEEDLE_TOKENS} tokens, alone and in {ROUNDS} rounds among "
            f"{COMPANIONS} concurrent requests: identical", None)


def _first_draw(chunk: Chunk) -> tuple[int | None, int | None]:
    """The first drawn token (None where the server stopped before one), and its rank among the
    step's returned top logprobs (None when not there): a None agrees with nothing."""
    if not chunk.tokens[0]:
        return None, None
    token = chunk.tokens[0][0]
    ranked = chunk.steps[0].top[0] if chunk.steps[0].top else ()
    rank = next((place for place, (candidate, _) in enumerate(ranked[:TOP_K]) if candidate == token), None)
    return token, rank
