"""``@deterministic(concurrency=N)``: a generation on a server, checked among N concurrent requests.

Each prompt a test generates is sent again, :data:`ROUNDS` times, among ``N`` concurrent companion
requests of random lengths, itself at a random position (``engines/server/companions.py``, the needle
pattern). Its answer must be what the server answered it alone, bit for bit: the same tokens and the
same logprobs (a served step's hash covers both). A server that batches requests together with kernels
whose results depend on the batch answers otherwise, and the test fails with
:class:`ConcurrencyError`, which says in which round, among how many companions, at which position,
and what changed (the first changed token and the margin the alone answer had there, or the largest
logprob drift). The generation the test goes on with, and that a golden records, is the alone one.

Everything random comes from one seed derived from the test's seed and the prompt's ids
(:func:`companion_seed`), so a failure replays with the same companions in the same order.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_llmdeterminism.engines.loaded import ServedEngine
from pytest_llmdeterminism.engines.server.companions import run_among
from pytest_llmdeterminism.errors import ConfigurationError, LLMDeterminismError
from pytest_llmdeterminism.judge.compare import Comparison, Verdict, compare

if TYPE_CHECKING:
    from pytest_llmdeterminism.decoding import DecodingConfig
    from pytest_llmdeterminism.engines.capture import Chunk
    from pytest_llmdeterminism.engines.loaded import Engine
    from pytest_llmdeterminism.generation import Generation

__all__ = ["MAX_CONCURRENCY", "ROUNDS", "ConcurrencyError", "ConcurrencyFinding", "check_among",
           "companion_seed", "refuse_where_not_served"]

# Rounds per prompt, each another set of companions and another position. Where a request lands
# among a server's slots decides whether its answer moves, so a batch-variant server moves it in some
# rounds only: llama.cpp's server with 4 slots moved it in 1 round of 3 at the least (measured,
# tests/engines/test_serving.py), where 20 rounds all unmoved is a chance of (2/3)**20, about 1 in
# 3,000 (3 rounds: 1 in 3.4). A round costs about one request's time: its requests are concurrent.
ROUNDS = 20
MAX_CONCURRENCY = 64  # companions: threads and connections of one round


def companion_seed(seed: int, ids: Sequence[int]) -> int:
    """The seed of a prompt's companions and positions: from the test's seed and the prompt's ids, so
    two prompts of one test meet other companions, and a rerun meets the same."""
    import xxhash

    return xxhash.xxh3_64_intdigest(struct.pack(f"<Q{len(ids)}q", seed, *ids)) & 0x7FFFFFFF


@dataclass(frozen=True)
class ConcurrencyFinding:
    """The first round whose answer differed from the alone one: the round (from 1), the number of
    concurrent companions, the needle's position among the ``companions + 1`` requests (from 0), and
    the comparison of the alone answer (expected) with this one (actual); ``differed``: every round
    whose answer differed (from 1), the first included."""

    round: int
    rounds: int
    companions: int
    position: int
    comparison: Comparison
    differed: tuple[int, ...] = ()


class ConcurrencyError(LLMDeterminismError, AssertionError):
    """``@deterministic(concurrency=N)``: a request's answer changed among concurrent companions.
    ``finding`` holds where and how; ``alone`` and ``among`` the two generations."""

    def __init__(self, spec: str, prompt: str, seed: int, finding: ConcurrencyFinding, *,
                 alone: Generation, among: Generation, piece: Callable[[int], str]) -> None:
        self.spec, self.prompt, self.seed, self.finding = spec, prompt, seed, finding
        self.alone, self.among = alone, among
        shown = prompt if len(prompt) <= 60 else prompt[:57] + "..."
        found = finding
        others = [n for n in found.differed if n != found.round]
        also = f"; {len(others) + 1} of {found.rounds} rounds differed (also {_listed(others)})" if others \
            else f"; the other {found.rounds - 1} rounds answered as alone" if found.differed else ""
        where = (f"in round {found.round} of {found.rounds}, sent at position {found.position} of "
                 f"{found.companions + 1} (among {found.companions} concurrent companion requests, "
                 f"companion seed {seed}){also}")
        changed = _what_changed(found.comparison, piece)
        super().__init__(
            f"NONDETERMINISTIC under concurrency: {shown!r} was answered differently by {spec} among "
            f"{found.companions} concurrent requests than alone, {where}: {changed}. "
            "The server's batching changes what it computes for a request, so its goldens depend on "
            "the load. Fix the stack: batch-invariant kernels (vLLM: VLLM_BATCH_INVARIANT=1), or one "
            "request at a time (llama.cpp's server: --parallel 1); or drop concurrency= to test the "
            "server one request at a time (docs/serving-sampling.md)")


def _listed(rounds: list[int]) -> str:
    shown = ", ".join(map(str, rounds[:10]))
    return shown if len(rounds) <= 10 else f"{shown} and {len(rounds) - 10} more"


def _what_changed(comparison: Comparison, piece: Callable[[int], str]) -> str:
    divergence = comparison.divergence
    if divergence is None:
        return (f"the same tokens, but logprobs drifted by up to {comparison.max_logprob_delta:.3g} "
                f"(first at step {comparison.first_hash_step})")

    def token(token_id: int) -> str:
        return "<stopped>" if token_id < 0 else f"{piece(token_id)!r} (id {token_id})"

    margin = divergence.golden_margin
    shown = "" if margin == float("inf") else f"; alone, its margin over the runner-up was {margin:.3g}"
    return (f"tokens changed at step {divergence.step}: alone {token(divergence.expected_token)}, among "
            f"companions {token(divergence.actual_token)}{shown}")


def refuse_where_not_served(engine: Engine, spec: str, concurrency: int) -> ServedEngine:
    """``concurrency=N`` means requests in flight on a server at once; an engine in this process
    runs no one else's requests, so it is refused, naming what checks companions there."""
    __tracebackhide__ = True
    if not isinstance(engine, ServedEngine):
        raise ConfigurationError(
            "@deterministic(concurrency=...)", concurrency,
            f"sends each request among N concurrent requests to a server; {spec} runs in this process on "
            f"the {engine.name} engine, where no other request shares its batch (the batch-invariance "
            "probe already checks a prompt against other rows of its own batch). Use it with a server "
            "engine (openai:URL#...), or remove concurrency=")
    return engine


def check_among(engine: Engine, spec: str, *, prompt: str, ids: list[int], config: DecodingConfig,
                alone: Generation, companions: int, seed: int,
                record: Callable[[Chunk], Generation], piece: Callable[[int], str]) -> None:
    """Send ``ids`` :data:`ROUNDS` times among ``companions`` concurrent requests; raise
    :class:`ConcurrencyError` naming the first answer that is not ``alone`` exactly and counting every
    round that differed. ``record`` turns a one-row chunk into a generation as the alone one was made.
    A request of a round that fails fails this check with what happened (``engines/server/companions.py``)."""
    __tracebackhide__ = True
    served = refuse_where_not_served(engine, spec, companions)
    rounds = run_among(served, ids, config, companions=companions, rounds=ROUNDS, seed=seed)
    answers = [record(done.output) for done in rounds]
    comparisons = [compare(alone, among) for among in answers]
    differed = tuple(n for n, c in enumerate(comparisons, 1) if c.verdict is not Verdict.IDENTICAL)
    if differed:
        first = differed[0] - 1
        done = rounds[first]
        finding = ConcurrencyFinding(first + 1, len(rounds), done.companions, done.position,
                                     comparisons[first], differed)
        raise ConcurrencyError(spec, prompt, seed, finding, alone=alone, among=answers[first], piece=piece)
