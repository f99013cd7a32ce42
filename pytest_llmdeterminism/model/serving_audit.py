"""The serving audit: a server engine's request as it is served (``engines/server/companions.py``).

A server engine (``openai:``) cannot vary what the in-process audit varies (batch shape, padding,
threads, dtype): :func:`serving_audit` runs its request as it is served instead (``concurrent``,
``repeat`` under load, ``prefix-cache``; docs/serving.md), comparing the top-k logprobs the server
returns, and :func:`verify_serving` records what it verified in the fingerprint
(``llm_server_checks``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pytest_llmdeterminism.decoding import resolve_generation_config
from pytest_llmdeterminism.engines.loaded import ServedEngine
from pytest_llmdeterminism.errors import ConfigurationError
from pytest_llmdeterminism.judge.compare import first_token_divergence
from pytest_llmdeterminism.reporting.audit import ServingAudit, ServingRow
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

if TYPE_CHECKING:
    from pytest_llmdeterminism.decoding import DecodingConfig
    from pytest_llmdeterminism.engines.capture import Chunk
    from pytest_llmdeterminism.engines.loaded import LoadedModel

__all__ = ["CHECKED_PROMPT", "CHECKED_TOKENS", "answer_difference", "serving_audit", "verify_serving"]

SERVING_ROUNDS = 3
DEFAULT_SLOTS = 4  # the most companions where the spec does not say the server's slots (#slots=N)


def serving_audit(loaded: LoadedModel, ids: Sequence[int], config: DecodingConfig, *,
                  rounds: int = SERVING_ROUNDS, seed: int = 0, text: str | None = None) -> ServingAudit:
    """The request ``ids`` on a server engine, alone and as it is served: ``concurrent`` among 2 up to
    the server's slots of concurrent requests (each compared with it alone), ``repeat`` (the answers
    under the most load compared with each other) and ``prefix-cache`` (after a request that shares a
    long prefix, the server's prefix cache on, compared with it cold). Companions come from ``seed``."""
    __tracebackhide__ = True
    from pytest_llmdeterminism.engines.server import companions as needle

    engine, needle_ids = loaded.engine, [int(t) for t in ids]
    if not isinstance(engine, ServedEngine):
        raise ConfigurationError("llm_server_checks", True, f"the serving audit sends requests to a server; "
                                 f"{loaded.spec} runs on {engine.name} in this process")
    slots = engine.slots or DEFAULT_SLOTS
    reference = needle.alone(engine, needle_ids, config, seed)
    rows: list[ServingRow] = []
    loaded_answers: list[Chunk] = []
    for count in sorted({2, max(slots, 2)}):
        done = needle.run_among(engine, needle_ids, config, companions=count, rounds=rounds,
                                seed=seed + count)
        worst = max((answer_difference(reference, r.output) for r in done), key=_severity)
        positions = ", ".join(str(r.position) for r in done)
        rows.append(_serving_row("concurrent", f"among {count}, at {positions}", worst, runs=len(done),
                                 companions=count))
        loaded_answers = [r.output for r in done]
    unique = len({_answer_key(a) for a in loaded_answers})
    worst = max((answer_difference(loaded_answers[0], a) for a in loaded_answers[1:]), key=_severity,
                default=(False, None, 0.0, None))
    rows.append(_serving_row("repeat", f"{unique} unique of {len(loaded_answers)} under load", worst,
                             runs=len(loaded_answers), companions=max(slots, 2)))
    on = engine.with_prefix_cache()
    tail = needle.companion_prompts(random.Random(seed), 1, vocab_size=engine.vocab_size(),
                                    excluded=set(engine.eos_token_ids()), max_new_tokens=1)[0].ids[:8]
    # the whole prompt as the prefix of another: the longest a cache can reuse
    on.run([engine.as_served(needle_ids + tail)], config, _one_row(config, seed), False)  # fills the cache
    after = on.run([needle_ids], config, _one_row(config, seed), False)
    rows.append(_serving_row("prefix-cache", f"after its prompt+{len(tail)}, cache on",
                             answer_difference(reference, after), runs=1))
    server = str((loaded.describe or {}).get("server", loaded.spec))
    return ServingAudit(text if text is not None else str(loaded.tokenizer.decode(needle_ids)), server,
                        tuple(rows), seed, prefix_cache_pinned=engine.resets_prefix)


CHECKED_PROMPT = "Q: What is the capital of Japan? A:"  # the request llm_server_checks audits
CHECKED_TOKENS = 4


def verify_serving(loaded: LoadedModel, *, seed: int, rounds: int = SERVING_ROUNDS) -> ServingAudit:
    """``llm_server_checks``: the serving audit of :data:`CHECKED_PROMPT` on ``loaded``'s server, and
    what it verified recorded in the fingerprint of every golden recorded with it
    (``serving_verified``)."""
    __tracebackhide__ = True
    engine = loaded.engine
    ids = [int(t) for t in loaded.tokenizer(CHECKED_PROMPT)["input_ids"]]
    config = resolve_generation_config({}, max_new_tokens=CHECKED_TOKENS,
                                       eos_token_ids=engine.eos_token_ids(),
                                       pad_token_id=loaded.tokenizer.pad_token_id or 0, seed=seed)
    found = serving_audit(loaded, ids, config, rounds=rounds, seed=seed, text=CHECKED_PROMPT)
    loaded.describe = {**(loaded.describe or {}), "serving_verified": found.capability()}
    loaded.static_fingerprint = None  # computed again, with the field
    return found


Difference = tuple[bool, int | None, float, float | None]  # changed, first step, max |Δlogprob|, margin


def answer_difference(reference: Chunk, other: Chunk) -> Difference:
    """Two one-row answers: tokens changed (from which step), the largest logprob difference of the
    top-k tokens both list over the steps before they part, and the reference's margin there."""
    a, b = reference.tokens[0], other.tokens[0]
    first = first_token_divergence(a, b)
    steps_a, steps_b = reference.steps[0], other.steps[0]
    upto = min(len(steps_a.top), len(steps_b.top))
    upto = upto if first is None else min(first + 1, upto)
    delta = 0.0
    for step in range(upto):
        theirs = dict(steps_b.top[step])
        delta = max([delta, *(abs(value - theirs[token]) for token, value in steps_a.top[step]
                              if token in theirs)])
    margin = steps_a.margins[first] if first is not None and first < len(steps_a.margins) else None
    return first is not None, first, delta, margin


def _severity(found: Difference) -> tuple[bool, float]:
    return found[0], found[2]


def _answer_key(chunk: Chunk) -> tuple[tuple[int, ...], tuple[tuple[tuple[int, float], ...], ...]]:
    return tuple(chunk.tokens[0]), tuple(chunk.steps[0].top)


def _serving_row(source: str, change: str, found: Difference, *, runs: int,
                 companions: int = 0) -> ServingRow:
    changed, first, delta, margin = found
    return ServingRow(source, change, changed, first, delta, margin=margin if changed else None, runs=runs,
                      companions=companions)


def _one_row(config: DecodingConfig, seed: int) -> GenerationSettings:
    return GenerationSettings(batch_shape=BatchShape(1, 1), max_new_tokens=config.max_new_tokens, seed=seed)
