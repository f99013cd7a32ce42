"""The completions API as pure data: the greedy request, the typed answer, and what an answer
means: each step's token, its id in the local tokenizer, its top-k and hash, checked first.

No I/O here (``server_client.py`` does the HTTP); everything is a function of its arguments, so
each rule has a plain unit test.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from pytest_llmdeterminism.decoding import DecodingConfig
from pytest_llmdeterminism.engines.capture import RowSteps
from pytest_llmdeterminism.engines.server.secret import KEY_ECHOED, key_echoed
from pytest_llmdeterminism.errors import EngineError
from pytest_llmdeterminism.generation import TEXT_ONLY_IDS, TOP_K

if TYPE_CHECKING:
    from pytest_llmdeterminism.engines.server.secret import Secret

GREEDY_SLACK = 1e-6  # a returned logprob may be rounded: the chosen token may trail the best by this
# A float32 log-softmax of a near-certain token can land a few ulps above 0 (ulp ~1e-5 at logits
# ~100); a logprob further above 0 is a probability above 1, a lie. One up to this is accepted and
# recorded as 0, what it rounds.
POSITIVE_SLACK = 1e-3
# No tokenizer's token is this long (the longest in common vocabularies are runs of ~256 spaces or
# dashes): a longer "token" is a server's lie, refused before it becomes a golden's text.
MAX_TOKEN_CHARS = 1024
SHOWN_CHARS = 300  # of a server's text in a message
UNTRUE = "Nothing was recorded; check the server (its log, its version) and that #tokenizer= is its tokenizer"


# What a server's answers are decoded into: a field of another type fails decoding, naming it.
class ServedModel(msgspec.Struct):
    id: Annotated[str, msgspec.Meta(max_length=SHOWN_CHARS)]


class ModelList(msgspec.Struct):
    data: list[ServedModel]


class ServerVersion(msgspec.Struct):
    version: Annotated[str, msgspec.Meta(max_length=100)]


class ContentCandidate(msgspec.Struct):
    token: str
    logprob: float


class ContentStep(msgspec.Struct):
    token: str
    logprob: float
    top_logprobs: list[ContentCandidate] = []


class Logprobs(msgspec.Struct):
    """The completions API's logprobs (``tokens``, ``top_logprobs``, ``token_logprobs``), or llama.cpp
    ``llama-server``'s, which answers /v1/completions in the chat API's form (``content``: one step per
    token, its top candidates as a list): that form is read into the first."""

    # Required, one form or the other: None only until __post_init__, which refuses neither
    tokens: list[str] = None  # type: ignore[assignment]
    top_logprobs: list[dict[str, float] | None] = None  # type: ignore[assignment]
    token_logprobs: list[float | None] | None = None
    content: list[ContentStep] | None = None

    def __post_init__(self) -> None:
        if self.content is not None and self.tokens is None and self.top_logprobs is None:
            self.tokens = [step.token for step in self.content]
            self.top_logprobs = [{c.token: c.logprob for c in step.top_logprobs} for step in self.content]
            self.token_logprobs = [step.logprob for step in self.content]
        for field in ("tokens", "top_logprobs"):
            if getattr(self, field) is None:
                raise ValueError(f"Object missing required field `{field}` (or llama-server's `content`)")


class Choice(msgspec.Struct):
    logprobs: Logprobs | None = None
    text: str | None = None
    finish_reason: str | None = None


class Usage(msgspec.Struct):
    prompt_tokens: int | None = None


class Completion(msgspec.Struct):
    choices: list[Choice]
    model: Annotated[str, msgspec.Meta(max_length=SHOWN_CHARS)] | None = None
    usage: Usage | None = None
    system_fingerprint: Annotated[str, msgspec.Meta(max_length=SHOWN_CHARS)] | None = None


# What a server that cannot take a prompt as token ids answers one: a refusal of the request (400,
# 422: llama-cpp-python's validation of ``prompt``: "Input should be a valid string"), or a 500 where
# it fails on the list (older llama-cpp-python), whose message names the prompt and its type.
PROMPT_IDS_REFUSED = frozenset({400, 422, 500})
_PROMPT = re.compile(r"prompt", re.IGNORECASE)
_A_TYPE = re.compile(r"\b(str|string|text|list|array|int|integer|type|token[ _]ids?)\b", re.IGNORECASE)


def refuses_token_ids(status: int, detail: str) -> bool:
    """Whether an error answer to a prompt sent as token ids says the server takes no such prompt: one
    of :data:`PROMPT_IDS_REFUSED` whose message names the prompt and a type (``prompt must be a
    string``, pydantic's ``["body", "prompt", "str"] ... string_type``). Any other error (a 500 that
    says nothing of the prompt, a 400 about the key or the length) is what happened, not a reason to
    send text: switching would bake the server's passing trouble into every golden of the session."""
    return status in PROMPT_IDS_REFUSED and bool(_PROMPT.search(detail)) and bool(_A_TYPE.search(detail))


def exact_id(text: str) -> int | None:
    """N of ``token_id:N``; None for any other text."""
    digits = text[9:] if text.startswith("token_id:") else ""
    return int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 12 else None


def text_only_id(text: str) -> int:
    import xxhash

    return TEXT_ONLY_IDS + xxhash.xxh32_intdigest(text.encode())


def request_body(model: str, prompt: str | list[int], config: DecodingConfig, seed: int, *,
                 cache_prompt: bool = False) -> dict[str, Any]:
    """One completion request: greedy, every sampler knob a known server reads set to neutral; or,
    under ``do_sample=True`` (``config.sampling``), drawn by the server with the test's settings and
    ``seed``, the request's own (:func:`sampled_knobs`). ``cache_prompt``: llama.cpp's server may
    reuse a cached prefix (only the serving audit asks)."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": config.max_new_tokens,
        "min_tokens": config.min_new_tokens,  # vLLM and llama-cpp-python; others ignore it
        "temperature": 0.0,
        "top_p": 1.0,
        "n": 1,
        "stream": False,
        "echo": False,
        "logprobs": TOP_K,
        "seed": seed,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "repeat_penalty": config.repetition_penalty,  # llama-cpp-python (its default is 1.1)
        "repetition_penalty": config.repetition_penalty,  # vLLM
        # llama.cpp's server: False evaluates the whole prompt, whatever came before
        "cache_prompt": cache_prompt,
        "return_tokens_as_token_ids": True,  # vLLM: tokens as "token_id:N", exact where text is not
        **sampled_knobs(config),
    }


def sampled_knobs(config: DecodingConfig) -> dict[str, Any]:
    """The sampler settings a server reads for a ``do_sample=True`` request (none when greedy), with
    the plugin's names and meanings: ``top_k=0`` is off on vLLM (0.8 on), llama.cpp's server and
    llama-cpp-python (which refuses -1, vLLM's older spelling)."""
    sampling = config.sampling
    if sampling is None:
        return {}
    return {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
            "min_p": sampling.min_p}


def implausible(completion: Completion, *, max_tokens: int, vocab_size: int) -> str | None:
    """What makes ``completion`` impossible as the answer to a request for ``max_tokens`` greedy
    tokens with ``logprobs=TOP_K``, as ``field: problem``; None where nothing does."""
    if len(completion.choices) != 1:
        return f"choices: {len(completion.choices)} choices for n=1"
    choice = completion.choices[0]
    logprobs = choice.logprobs
    field = "choices[0].logprobs"
    if logprobs is None:
        return (f"{field}: none, where the request asked for logprobs={TOP_K}; the server must support the "
                "completions API's per-token logprobs (llama-cpp-python: logits_all, the default)")
    steps = len(logprobs.tokens)
    # llama-cpp-python finishes a character that max_tokens cut: up to 3 more steps, each a part of it.
    beyond = logprobs.tokens[max_tokens:]
    if len(beyond) > 3 or not all(map(_part_of_character, beyond)):
        return f"{field}.tokens: {steps} tokens for max_tokens={max_tokens}"
    if steps == 0 and choice.finish_reason != "stop":
        return (f"{field}.tokens: no tokens, yet finish_reason {choice.finish_reason!r} for "
                f"max_tokens={max_tokens} (only a stop ends a completion before its first token)")
    if len(logprobs.top_logprobs) != steps:
        return f"{field}.top_logprobs: {len(logprobs.top_logprobs)} steps for {steps} tokens"
    chosen = logprobs.token_logprobs
    if chosen is not None and len(chosen) != steps:
        return f"{field}.token_logprobs: {len(chosen)} steps for {steps} tokens"
    # The text is what the tokens spell, but servers leave out what no step shows (part of a character,
    # a special token) and tokenizers differ in spaces: only its length is bounded exactly.
    if choice.text is not None and len(choice.text) > MAX_TOKEN_CHARS * steps:
        most = MAX_TOKEN_CHARS * steps
        return (f"choices[0].text: {len(choice.text):,} characters ({_short(choice.text, 20)!r}) for {steps} "
                f"tokens, where no token is longer than {MAX_TOKEN_CHARS} (at most {most:,} in all); "
                "#max_response_mb= caps the body read, and a lower one refuses such an answer before it is "
                "read")
    for step, (text, top) in enumerate(zip(logprobs.tokens, logprobs.top_logprobs, strict=True)):
        candidates = top or {}
        if not 1 <= len(candidates) <= TOP_K + 1:
            return (f"{field}.top_logprobs[{step}]: {len(candidates)} candidates, where the request asked "
                    f"for logprobs={TOP_K} (1 to {TOP_K + 1} with the chosen token)")
        values = [(f"top_logprobs[{step}][{_short(t)!r}]", v) for t, v in candidates.items()]
        own = None if chosen is None else chosen[step]
        if own is not None:
            values.append((f"token_logprobs[{step}]", own))
        elif text not in candidates:
            return f"{field}.tokens[{step}]: {_short(text)!r} has no logprob, here or in its top_logprobs"
        for where, value in values:
            if not (math.isfinite(value) and value <= POSITIVE_SLACK):
                return f"{field}.{where}: {value!r} is no log-probability (finite, at most 0)"
        for where, token in [(f"tokens[{step}]", text), *((f"top_logprobs[{step}]", t) for t in candidates)]:
            exact = exact_id(token)
            if token.startswith("token_id:") and (exact is None or exact >= vocab_size):
                return (f"{field}.{where}: {_short(token)!r} is no id of the tokenizer's vocabulary "
                        f"(0 to {vocab_size - 1})")
            if len(token) > MAX_TOKEN_CHARS:
                return (f"{field}.{where}: a token of {len(token)} characters, {_short(token, 20)!r}; no "
                        f"tokenizer's token is longer than {MAX_TOKEN_CHARS}")
    return None


class ParsedRow:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.steps = RowSteps()
        self.pieces: list[str] = []
        self.exact: list[bool] = []  # the server returned the id itself, not only text
        self.text = ""
        self.finish_reason = "length"


def parse_choice(spec: str, response: Completion, *, prompt_tokens: int, max_tokens: int, vocab_size: int,
                 token_id: Callable[[str], int], tokenizer: Any = None, source: str = "the server",
                 model: str | None = None, secret: Secret | None = None, sampled: bool = False) -> ParsedRow:
    """One completion response as recorded steps, checked first (:func:`implausible`), then against the
    requested ``model``, the prompt's token count, greedy choice (not for a ``sampled`` request, whose
    token is a draw) and its text. With ``tokenizer``, steps
    that returned part of a character are given their ids (see :func:`resolve_partial_characters`).

    With ``secret``, a completion that spells the key anywhere a golden would hold it is refused
    (:func:`key_echoed`: its token ids as the tokenizer decodes them, its text, its top-k), nothing
    recorded, and the key is masked in every message."""
    __tracebackhide__ = True
    import xxhash

    def fail(message: str) -> EngineError:
        return EngineError(spec, message if secret is None else secret.mask(message))

    problem = implausible(response, max_tokens=max_tokens, vocab_size=vocab_size)
    if problem is not None:
        raise fail(f"{source} sent a completion that cannot be right: {problem}. {UNTRUE}")
    if model is not None and response.model is not None and response.model != model:
        raise fail(f"{source} answered for model {_short(response.model)!r}, where the request named "
                   f"{_short(model)!r}: it serves another model under that name, or sends the request on to "
                   "another. Nothing was recorded; check the server's models (GET /v1/models), and name the "
                   "one to test with #model=NAME")
    choice = response.choices[0]
    assert choice.logprobs is not None  # implausible() refuses a choice without them
    texts, tops, chosen = choice.logprobs.tokens, choice.logprobs.top_logprobs, choice.logprobs.token_logprobs
    counted = response.usage.prompt_tokens if response.usage is not None else None
    if counted is not None and counted != prompt_tokens:
        raise fail(f"{source} counts {counted} prompt tokens where the local tokenizer counts "
                   f"{prompt_tokens}: #tokenizer= is not the served model's tokenizer (or the server adds a "
                   "BOS of its own)")
    row = ParsedRow()
    for step, (text, top) in enumerate(zip(texts, tops, strict=True)):
        ranked = sorted((top or {}).items(), key=lambda p: (-p[1], p[0]))[:TOP_K]
        # A draw's top-k is the model's, with or without the drawn token (as the plugin's sampler records
        # it); a greedy step's token is its best, checked below.
        if not sampled and text not in dict(ranked):  # implausible() made sure it has a logprob
            own = chosen[step] if chosen is not None else None
            ranked = ([(text, (top or {})[text] if own is None else own)] + ranked)[:TOP_K]
        logprob = dict(ranked).get(text, 0.0)
        if not sampled and logprob < ranked[0][1] - GREEDY_SLACK:
            raise fail(f"{source} did not decode greedily at step {step}: it chose {_short(text)!r} "
                       f"(logprob {logprob:.4f}) over {_short(ranked[0][0])!r} ({ranked[0][1]:.4f}). A "
                       "server-side sampler or penalty is in force; check the server's defaults")
        step_hash = xxhash.xxh3_64_hexdigest(json.dumps([text, ranked], separators=(",", ":"),
                                                         ensure_ascii=False).encode())
        # implausible() accepts up to POSITIVE_SLACK above 0, a rounding of 0: recorded as 0 (the hash
        # keeps what was served).
        row.steps.append(step_hash, [token_id(t) for t, _ in ranked], [min(lp, 0.0) for _, lp in ranked])
        row.tokens.append(token_id(text))
        exact = exact_id(text) is not None  # vLLM's exact ids: the piece is the tokenizer's text
        spelled = exact and tokenizer is not None
        row.pieces.append(str(tokenizer.decode([row.tokens[-1]])) if spelled else text)
        row.exact.append(exact)
    row.text = "".join(row.pieces) if choice.text is None else choice.text
    if not _spelled(row, tokenizer):
        raise fail(f"{source} sent a completion that cannot be right: choices[0].text: "
                   f"{_short(row.text)!r} is not what its tokens spell ({_short(''.join(row.pieces))!r}). "
                   f"{UNTRUE}")
    row.finish_reason = "eos" if choice.finish_reason == "stop" else "length"
    if tokenizer is not None:
        resolve_partial_characters(row, tokenizer)
    if secret is not None:
        where = key_echoed(secret, texts=[row.text, "".join(row.pieces)], chosen=row.tokens,
                           top=row.steps.top, tokenizer=tokenizer, vocab_size=vocab_size)
        if where is not None:
            raise fail(f"{source} sent a completion that spells the API key ({where}). {KEY_ECHOED}")
    return row


def _part_of_character(piece: str) -> bool:
    """Whether a returned token text is what servers return for part of a multi-byte character."""
    return piece == "" or "\ufffd" in piece or piece.startswith("bytes:")


def _short(text: str, chars: int = 80) -> str:
    return text if len(text) <= chars else f"{text[:chars - 3]}..."


def _spelled(row: ParsedRow, tokenizer: Any) -> bool:
    """Whether the row's pieces spell its text, whitespace aside (tokenizers differ in leading spaces and
    clean-up), as a pattern spells a glob: the pieces in order, each step whose text is unknown a ``*``
    (part of a character: ``""``, U+FFFD or vLLM's ``bytes:``; a special token, which the text leaves
    out; an exact id without a tokenizer to spell it)."""
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    segments = [""]
    for step, piece in enumerate(row.pieces):
        unspelled = row.exact[step] and (tokenizer is None or row.tokens[step] in special)
        if _part_of_character(piece) or unspelled:
            segments.append("")
        else:
            segments[-1] += "".join(piece.split())
    text = "".join(row.text.split())
    if len(segments) == 1:
        return text == segments[0]
    first, *middle, last = segments
    if len(first) + len(last) > len(text) or not (text.startswith(first) and text.endswith(last)):
        return False
    cursor, end = len(first), len(text) - len(last)
    for segment in middle:  # the earliest place of each is never worse for those after it
        found = text.find(segment, cursor, end)
        if found < 0:
            return False
        cursor = found + len(segment)
    return True


def _partial(row: ParsedRow, step: int) -> bool:
    return not row.exact[step] and (row.pieces[step] == "" or "\ufffd" in row.pieces[step])


def resolve_partial_characters(row: ParsedRow, tokenizer: Any) -> None:
    """A token that holds part of a multi-byte character (CJK, emoji) comes back from a server as
    empty text or U+FFFD, so its id is unknown. A run of such steps spans the characters of the
    completion text between the known pieces around it; where the tokenizer encodes that span to
    exactly as many tokens, those are the ids (greedy output is the tokenizer's own encoding there).
    Otherwise the steps keep their text-only ids, and compare by what the server returned."""
    cursor, step = 0, 0
    steps = len(row.pieces)
    while step < steps:
        piece = row.pieces[step]
        if not _partial(row, step):
            if not row.text.startswith(piece, cursor):
                return  # the pieces do not tile the text: nothing can be placed safely
            cursor, step = cursor + len(piece), step + 1
            continue
        end = step
        while end < steps and _partial(row, end):
            end += 1
        following = row.pieces[end] if end < steps else ""
        stop = row.text.find(following, cursor) if following else len(row.text)
        if stop < cursor:
            return
        ids = list(tokenizer(row.text[cursor:stop], add_special_tokens=False)["input_ids"])
        if len(ids) == end - step:
            for index, resolved in zip(range(step, end), ids, strict=True):
                unknown = row.tokens[index]
                row.tokens[index] = resolved
                row.steps.top[index] = tuple((resolved if t == unknown else t, lp)
                                             for t, lp in row.steps.top[index])
        cursor, step = stop, end

