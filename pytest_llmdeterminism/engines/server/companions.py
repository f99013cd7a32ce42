"""A server engine's request as it is served: among other requests in flight at the same time.

The needle pattern (vLLM's CI tests its batch invariance this way): the request under test (the
*needle*: one row of token ids) is sent again among ``companions`` concurrent requests of random
prompt and answer lengths, the needle at a random position in the order they are sent, for a few
rounds. A server that batches requests together (continuous batching, several slots) computes the
needle in batches of other shapes each time; a batch-invariant one answers it the same every time.

Every request runs in its own thread and goes through ``engine.among_companions().run`` for one
row: the server engines' :class:`~server_client.Client` opens a fresh connection per request and
keeps no other per-request state, so threads share it safely. A request of a round that fails (a
connection reset under the load the round makes, an error status) fails the round, once every
thread has ended, with one :class:`EngineError` that counts the failed requests and quotes the
first (the needle's where it failed): the caller's check fails with what happened, and the server
is not marked down for the session's other requests. Everything random comes from one
``seed``: a failure names it, and the same seed sends the same companions in the same order again.
The needle is sent with ``seed`` as its request seed too, so :func:`alone` with that seed is its
reference.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_llmdeterminism.errors import EngineError
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

if TYPE_CHECKING:
    from pytest_llmdeterminism.decoding import DecodingConfig
    from pytest_llmdeterminism.engines.capture import Chunk
    from pytest_llmdeterminism.engines.loaded import Engine, ServedEngine

__all__ = ["CompanionRound", "alone", "companion_prompts", "run_among"]

# A companion's prompt: this many tokens at least, at most (random in between); its answer: 1 token
# up to as many as the needle's.
PROMPT_TOKENS = (4, 32)
# Of a vocabulary's ids, a companion draws from those at or above this (below sit most tokenizers'
# special tokens, which a server may refuse or treat as control tokens in a prompt).
LOWEST_ID = 256


@dataclass(frozen=True)
class CompanionRound:
    """One round: the needle sent ``position``-th (from 0) among ``companions`` concurrent requests,
    and its answer, a :class:`~capture.Chunk` of one row as ``engine.run`` returns it."""

    companions: int
    position: int
    output: Chunk


@dataclass(frozen=True)
class _Companion:
    ids: list[int]
    max_new_tokens: int
    seed: int


def alone(engine: Engine, ids: list[int], config: DecodingConfig, seed: int) -> Chunk:
    """The needle alone, with request seed ``seed``: the reference :func:`run_among` compares with."""
    __tracebackhide__ = True
    return engine.run([list(ids)], config, _settings(config.max_new_tokens, seed), False)


def companion_prompts(rng: random.Random, count: int, *, vocab_size: int, excluded: set[int],
                      max_new_tokens: int) -> list[_Companion]:
    """``count`` companions drawn from ``rng``: random token ids (none of ``excluded``, e.g. the stop
    tokens) of random length, each asking for a random number of tokens."""
    lowest = LOWEST_ID if vocab_size > 2 * LOWEST_ID else 0
    drawn = []
    for _ in range(count):
        length = rng.randint(*PROMPT_TOKENS)
        ids: list[int] = []
        while len(ids) < length:
            token = rng.randrange(lowest, vocab_size)
            if token not in excluded:
                ids.append(token)
        drawn.append(_Companion(ids, rng.randint(1, max(max_new_tokens, 1)), rng.randrange(2**31)))
    return drawn


def run_among(engine: ServedEngine, ids: list[int], config: DecodingConfig, *, companions: int, rounds: int,
              seed: int, shared_prefix: int = 0) -> list[CompanionRound]:
    """The needle ``ids`` run ``rounds`` times, each time among ``companions`` concurrent requests of
    random lengths, sent at a random position among them; all drawn from ``seed``. ``shared_prefix``:
    each companion starts with the needle's first tokens, this many (a shared system prompt), then
    its random ones. A request that fails fails the round once every thread has ended: one
    :class:`EngineError` counting the failed requests and quoting the first (the needle's where it
    failed), which leaves the server in use for later requests."""
    __tracebackhide__ = True
    if companions < 0 or rounds < 1:
        raise ValueError(f"companions={companions!r}, rounds={rounds!r}: expected companions >= 0 and "
                         "rounds >= 1")
    rng = random.Random(seed)
    excluded = set(engine.eos_token_ids())
    vocab_size = engine.vocab_size()
    among = engine.among_companions()
    done = []
    for number in range(1, rounds + 1):
        # A server that takes prompts as text counts the ids of their text (engines/server/openai.py)
        others = [dataclasses.replace(c, ids=engine.as_served(ids[:shared_prefix] + c.ids)) for c in
                  companion_prompts(rng, companions, vocab_size=vocab_size, excluded=excluded,
                                    max_new_tokens=config.max_new_tokens)]
        position = rng.randrange(companions + 1)
        output = _one_round(among, list(ids), config, seed, others, position,
                            where=f"round {number} of {rounds}")
        done.append(CompanionRound(companions, position, output))
    return done


def _one_round(engine: Engine, ids: list[int], config: DecodingConfig, seed: int,
               others: list[_Companion], position: int, *, where: str) -> Chunk:
    __tracebackhide__ = True
    results: dict[int, Chunk] = {}
    errors: dict[int, BaseException] = {}
    needle = _Companion(ids, config.max_new_tokens, seed)
    order = [*others[:position], needle, *others[position:]]

    def send(index: int, request: _Companion) -> None:
        own = config if request is needle else dataclasses.replace(
            config, max_new_tokens=request.max_new_tokens, min_new_tokens=0)
        try:
            results[index] = engine.run([request.ids], own, _settings(own.max_new_tokens, request.seed),
                                        False)
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread below
            errors[index] = error

    threads = [threading.Thread(target=send, args=(index, request), daemon=True,
                                name=f"llm-companion-{index}") for index, request in enumerate(order)]
    for thread in threads:  # started in order, a fraction of a millisecond apart: sent in this order
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise _round_failed(errors, position, len(order), where)
    return results[position]


def _round_failed(errors: dict[int, BaseException], position: int, requests: int,
                  where: str) -> BaseException:
    """One error for a round whose requests failed: how many and whose, and the first's message (the
    needle's where it failed). An error that is not the server's (a bug, an interrupt) goes up as it is."""
    first_at = position if position in errors else min(errors)
    first = errors[first_at]
    if not all(isinstance(error, EngineError) for error in errors.values()):
        return next(e for e in errors.values() if not isinstance(e, EngineError))
    assert isinstance(first, EngineError)
    detail = str(first).removeprefix(f"llm_model {first.spec!r}: ")
    whose = "the needle's" if first_at == position else f"companion {first_at}'s (in the order sent)"
    needle = "the request under test among them" if position in errors else "the request under test answered"
    error = EngineError(first.spec, f"{len(errors)} of {requests} concurrent requests of {where} failed "
                        f"({needle}); {whose} failed first: {detail}. This check fails; the server stays in "
                        "use for the other tests. A server that refuses or drops requests under this load "
                        "needs more capacity (llama.cpp's server: --parallel; vLLM: --max-num-seqs), or "
                        "fewer concurrent requests (@deterministic(concurrency=N) with a lower N)")
    error.__cause__ = first
    return error


def _settings(max_new_tokens: int, seed: int) -> GenerationSettings:
    return GenerationSettings(batch_shape=BatchShape(1, 1), max_new_tokens=max_new_tokens, seed=seed)
