"""Scores through an OpenAI-compatible server: ``/v1/completions`` with ``echo=true``, ``logprobs=k``
and ``max_tokens=1``, whose echoed prompt carries each token's logprob given the tokens before it.

``max_tokens=1``, never 0: llama-cpp-python reads 0 as "no limit" (it generated until the context
ended, measured), so one token is generated and its entry dropped. The prompt and continuation go
as token ids where the server takes them (vLLM), else as their decoded text (llama-cpp-python): the
ids the server echoes must be the pair's own, or nothing is recorded. A server has top-k logprobs
only: a rank is known where the given token is among them, a rank margin where both its
neighbours are; a prompt logprob is ``None`` where the server does not say it. A position's hash
is :data:`~generation.SERVED_HASH_DEFINITION`'s over the given token's text and the top-k (with
the given token's own entry after them where it is not among them). Pure functions of the answer
here, plus :class:`ServedScores`, which asks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from pytest_llmdeterminism.engines.capture import ScoreChunk, ScoredRow, rank_and_margin, rounded
from pytest_llmdeterminism.engines.server.completions import (
    POSITIVE_SLACK,
    UNTRUE,
    Completion,
    Logprobs,
)
from pytest_llmdeterminism.engines.server.prompts import IdsOrText
from pytest_llmdeterminism.engines.server.secret import KEY_ECHOED, Secret, key_echoed
from pytest_llmdeterminism.engines.server.server_client import Client, HTTPStatusError
from pytest_llmdeterminism.errors import EngineError

# A token's logprob and its entry in the top-k are one number, either printed with at least 4 decimals
AGREEMENT = 1e-4
WHAT_IT_NEEDS = ("scoring needs /v1/completions with echo=true and logprobs (the prompt's per-token "
                 "logprobs): vLLM and llama.cpp's servers have them. Score on the transformers backend or "
                 "llamacpp:PATH.gguf instead")


def score_request(model: str, prompt: str | list[int], top_k: int) -> dict[str, Any]:
    """One scoring request: the prompt echoed with its logprobs, one token generated (dropped), every
    sampler knob a known server reads set to neutral."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": 1,
        "temperature": 0.0,
        "top_p": 1.0,
        "n": 1,
        "stream": False,
        "echo": True,
        "logprobs": top_k,
        "seed": 0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "repeat_penalty": 1.0,  # llama-cpp-python (its default is 1.1)
        "repetition_penalty": 1.0,  # vLLM
        "cache_prompt": False,  # llama.cpp's server: evaluate the whole prompt, whatever came before
        "return_tokens_as_token_ids": True,  # vLLM: tokens as "token_id:N", exact where text is not
    }


def scored_row(spec: str, response: Completion, *, prompt: list[int], continuation: list[int], top_k: int,
               token_id: Callable[[str], int], prompt_logprobs: bool,
               source: str = "the server", secret: Secret | None = None, tokenizer: Any = None) -> ScoredRow:
    """The continuation's positions (and the prompt's, with ``prompt_logprobs``) of one echoed
    completion, each checked: an answer that is not the pair's tokens with their logprobs is an
    :class:`EngineError` naming what the server lacks or got wrong. With ``secret``, the key is masked
    in every message, and a top-k whose ids spell it (as ``tokenizer`` decodes them) is refused."""
    __tracebackhide__ = True

    def fail(message: str) -> EngineError:
        text = f"{source} {message}"
        return EngineError(spec, text if secret is None else secret.mask(text))

    problem = _echo_problem(response, prompt, prompt + continuation, token_id)
    if problem is not None:
        raise fail(problem)
    logprobs = response.choices[0].logprobs
    assert logprobs is not None  # _echo_problem refuses an answer without them
    given = prompt + continuation
    # llama-cpp-python's server (0.3) echoes one entry per prompt token and none for the generated one,
    # each entry the distribution *after* its token (its token_logprobs[t] is token t's logprob under
    # the distribution that predicts t + 1; measured against llama.cpp in process): there a token's
    # logprob is read from the entry before it, which holds the top-k only.
    shifted = len(logprobs.tokens) == len(given)
    row = ScoredRow()
    for position in range(len(prompt), len(given)):
        text, own, top = _served_at(logprobs, position, shifted=shifted)
        problem, collapsed = _position_problem(text, own, top, position, shifted=shifted, top_k=top_k)
        if problem is not None:
            raise fail(problem)
        assert own is not None  # _position_problem refuses a position without it
        _record(row, text, own, top, collapsed, top_k=top_k, token_id=token_id)
    spelled = None if secret is None or tokenizer is None else key_echoed(
        secret, texts=[], chosen=[], top=row.top, tokenizer=tokenizer, vocab_size=len(tokenizer))
    if spelled is not None:
        raise fail(f"sent a top-k that spells the API key ({spelled}). {KEY_ECHOED}")
    if prompt_logprobs:
        row.prompt_logprobs = [None, *(_prompt_logprob(logprobs, position, shifted=shifted, top_k=top_k)
                                       for position in range(1, len(prompt)))]
    return row


def _served_at(logprobs: Logprobs, position: int, *,
               shifted: bool) -> tuple[str, float | None, dict[str, float]]:
    """The token at ``position`` as the echo gives it: its text, its own logprob (None: not said) and
    the top-k of the distribution it was drawn from (the entry before it where the echo is shifted)."""
    texts, tops, chosen = logprobs.tokens, logprobs.top_logprobs, logprobs.token_logprobs
    text = texts[position]
    if shifted:
        top = dict(tops[position - 1] or {})
        return text, top.get(text), top
    top = dict(tops[position] or {})
    own = chosen[position] if chosen is not None else None
    return text, top.get(text) if own is None else own, top


def _position_problem(text: str, own: float | None, top: dict[str, float], position: int, *, shifted: bool,
                      top_k: int) -> tuple[str | None, set[str]]:
    """What keeps the continuation's token at ``position`` from being scored (a message, None where
    nothing), and the texts of its top-k that two tokens share (see :func:`collapsed_texts`)."""
    if own is None:
        where = (" (its echo gives each token's logprob under the next token's distribution, so it is "
                 "read from the top-k of the position before: raise llm_model.score(top_k=...))"
                 if shifted else "")
        return (f"sent no logprob for the continuation's token {text!r} at position {position}"
                f"{where}; it cannot score this continuation. {WHAT_IT_NEEDS}"), set()
    for value in (own, *top.values()):
        if not (math.isfinite(value) and value <= POSITIVE_SLACK):
            return (f"sent {value!r} at position {position}, which is no log-probability (finite, at "
                    f"most 0). {UNTRUE}"), set()
    contradiction = None if shifted else contradicted(text, own, top, top_k)
    if contradiction is not None:
        return (f"sent logprobs that contradict each other at position {position}: the token "
                f"{text!r}'s logprob {contradiction}. {UNTRUE}"), set()
    collapsed = collapsed_texts(top, top_k) if shifted else set()
    if collapsed is None or text in collapsed:
        named = f"the text {text!r}" if collapsed else "one text (its top-k has fewer than k entries)"
        return (f"named two tokens with {named} in the top-k of position {position - 1}: it keys its "
                "top_logprobs by token text, so the later, lower one's logprob overwrote the first's "
                f"(llama-cpp-python), and the continuation's token {text!r} at position {position} "
                "has no logprob of its own there. Score this continuation on llamacpp:PATH.gguf in "
                "process or on the transformers backend, or on a server that names tokens by id"), set()
    return None, collapsed


def _record(row: ScoredRow, text: str, own: float, top: dict[str, float], collapsed: set[str], *, top_k: int,
            token_id: Callable[[str], int]) -> None:
    """One checked position into ``row``: its hash over what was served, its logprob, top-k, rank and
    rank margin (unknown where a collapsed text hides them)."""
    import xxhash

    unknown = _unknown(text, list(top), collapsed)
    as_served = sorted(top.items(), key=lambda pair: (-pair[1], pair[0]))[:top_k]
    hashed = as_served if text in dict(as_served) else [*as_served, (text, own)]  # as served
    ranked = [(t, lp) for t, lp in as_served if t not in collapsed]  # theirs are another token's
    row.hashes.append(xxhash.xxh3_64_hexdigest(json.dumps([text, hashed], separators=(",", ":"),
                                                          ensure_ascii=False).encode()))
    own = min(own, 0.0)  # a rounding of 0 above it: recorded as 0 (the hash keeps what was served)
    row.logprobs.append(rounded(own))
    row.top.append(tuple((token_id(t), rounded(min(lp, 0.0))) for t, lp in ranked))
    rank, margin = rank_and_margin(text, own, ranked, len(ranked) if collapsed else top_k)
    if unknown:
        rank, margin = (None, None) if unknown == "rank" else (rank, None)
    row.ranks.append(rank)
    row.rank_margins.append(margin)


def _unknown(text: str, order: list[str], collapsed: set[str]) -> str:
    """What a top-k keyed by text (``order``, best first) that lost the logprobs of ``collapsed`` leaves
    unknown of ``text``'s place: ``"rank"``, ``"margin"`` or nothing."""
    if collapsed and min(order.index(t) for t in collapsed) < order.index(text):
        return "rank"  # a token above it lost its logprob: how many are above is not known
    after = order.index(text) + 1
    if collapsed and after < len(order) and order[after] in collapsed:
        return "margin"  # the token after it lost its logprob
    return ""


def _echo_problem(response: Completion, prompt: list[int], given: list[int],
                  token_id: Callable[[str], int]) -> str | None:
    """What keeps an echoed completion from scoring ``given`` (the prompt and continuation ids): one
    choice with logprobs, an entry per given token, and the given ids echoed; None where nothing."""
    if len(response.choices) != 1:
        return f"sent {len(response.choices)} choices for n=1. {UNTRUE}"
    logprobs = response.choices[0].logprobs
    if logprobs is None:
        return f"sent no logprobs for the echoed prompt: it cannot score; {WHAT_IT_NEEDS}"
    texts, tops, chosen = logprobs.tokens, logprobs.top_logprobs, logprobs.token_logprobs
    echoed = min(len(texts), len(tops), len(given) if chosen is None else len(chosen))
    if echoed < len(given) and echoed <= 1 + (response.choices[0].text is not None and len(texts) == 1):
        return (f"echoed {echoed} tokens for a {len(given)}-token prompt and continuation: it does not "
                f"echo the prompt (echo=true), so it cannot score; {WHAT_IT_NEEDS}")
    if echoed < len(given):
        counted = response.usage.prompt_tokens if response.usage is not None else None
        counts = "" if counted is None else f" (it counts {counted})"
        return (f"echoed {echoed} tokens with logprobs for a {len(given)}-token prompt and continuation"
                f"{counts}: it leaves tokens out of its echo (llama-cpp-python leaves out special tokens, "
                "such as a chat template's <|im_start|>), so their positions cannot be matched. Score "
                "prompts without special tokens on it, or score on the transformers backend or "
                "llamacpp:PATH.gguf")
    served = [token_id(text) for text in texts[:len(given)]]
    if served != given:
        at = next(i for i, (a, b) in enumerate(zip(served, given, strict=True)) if a != b)
        return (f"echoed token {texts[at]!r} (id {served[at]}) at position {at} where the "
                f"{'prompt' if at < len(prompt) else 'continuation'} has id {given[at]}: it tokenised the "
                "text otherwise (#tokenizer= is not the served model's tokenizer, or the pair's text "
                "tokenises otherwise as one text: give the continuation as token ids that the joint "
                "text tokenises to)")
    return None


def _prompt_logprob(logprobs: Logprobs, position: int, *, shifted: bool, top_k: int) -> float | None:
    """The prompt token's logprob at ``position`` as the echo says it; None where it does not."""
    texts, tops, chosen = logprobs.tokens, logprobs.top_logprobs, logprobs.token_logprobs
    said: float | None
    if shifted:  # None where the entry before does not hold it, or holds another's under its text
        before = dict(tops[position - 1] or {})
        lost = collapsed_texts(before, top_k)
        said = None if lost is None or texts[position] in lost else before.get(texts[position])
    elif chosen is not None:
        said = chosen[position]
    else:
        said = (tops[position] or {}).get(texts[position])
    return None if said is None else rounded(min(float(said), 0.0))


def contradicted(text: str, own: float, top: dict[str, float], top_k: int) -> str | None:
    """How a token's own logprob (``token_logprobs``) contradicts its position's top-k, where both come
    from one distribution: its entry in the top-k is another number, or a full top-k leaves it out
    although it is above the lowest entry. None where they agree (within :data:`AGREEMENT`)."""
    listed = top.get(text)
    if listed is not None and abs(listed - own) > AGREEMENT:
        return f"{own!r} is not its own entry in the top-k, {listed!r}"
    lowest = min(top.values(), default=-math.inf)
    if listed is None and len(top) >= top_k and own > lowest + AGREEMENT:
        return (f"{own!r} is above the lowest of the top-{top_k} ({lowest!r}), which yet leaves the token "
                "out of the k most likely")
    return None


def collapsed_texts(top: dict[str, float], top_k: int) -> set[str] | None:
    """The texts of a top-k keyed by token text (llama-cpp-python's, best first, ``top_k`` entries)
    that two tokens share: the later, lower token's logprob overwrote the first's, in the first's place.
    Such a text's logprob is below one served after it; ``None`` where the top-k lost entries that no
    such text accounts for (two tokens with one text next to each other: which text is unknown)."""
    values = list(top.values())
    collapsed = {text for at, text in enumerate(top) if any(later > values[at] for later in values[at + 1:])}
    return None if len(top) + len(collapsed) < top_k else collapsed


class ServedScores(IdsOrText):
    """Scores through one server, one request at a time, each after the engine's prefix reset."""

    def __init__(self, spec: str, client: Client, model: str, tokenizer: Any, *,
                 token_id: Callable[[str], int], reset: Callable[[list[int]], object] | None) -> None:
        self._spec, self._client, self._model, self._tokenizer = spec, client, model, tokenizer
        self._token_id, self._reset = token_id, reset

    def score(self, rows: list[tuple[list[int], list[int]]], *, top_k: int,
              prompt_logprobs: bool) -> ScoreChunk:
        __tracebackhide__ = True
        request = self._client.request_line("POST", "completions")
        source = f"the server at {self._client.base}, answering {request} with echo=true,"
        scored = []
        for prompt, continuation in rows:
            if self._reset is not None:
                self._reset(prompt)
            response = self._complete(prompt + continuation, top_k)
            scored.append(scored_row(self._spec, response, prompt=prompt, continuation=continuation,
                                     top_k=top_k, token_id=self._token_id, prompt_logprobs=prompt_logprobs,
                                     source=source, secret=self._client.api_key, tokenizer=self._tokenizer))
        return ScoreChunk(rows=scored, flags={
            "temperature": 0, "requests": "one at a time", "echo": True, "max_tokens": 1,
            "prompt_sent_as": self._sent_as})

    def _complete(self, ids: list[int], top_k: int) -> Completion:
        """As the generation's request: the ids where the server takes them, else the decoded text."""
        __tracebackhide__ = True
        try:
            return self._post_prompt(ids, lambda prompt: score_request(self._model, prompt, top_k))
        except HTTPStatusError as error:
            if error.status not in (400, 404, 422):
                raise
            raise EngineError(self._spec, "the server refused a scoring request (echo=true, "
                              f"logprobs={top_k}, max_tokens=1): {error}. It cannot score: "
                              f"{WHAT_IT_NEEDS}") from error
