"""What ``llm_model.generate`` accepts as input, as pure functions of the tokenizer and the shape.

An input is a prompt string (tokenised with the tokenizer's special tokens), a chat conversation
(a list of ``{"role": ..., "content": ...}`` dicts, rendered with the tokenizer's chat template and
``add_generation_prompt=True``, tokenised once without adding special tokens again), or its token
ids. Each becomes a :class:`ModelInput` whose ids fit the batch shape, or an error naming the fix.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_llmdeterminism.errors import ConfigurationError, PromptTooLongError, after_shape_change, pasteable
from pytest_llmdeterminism.generation import PromptForm
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

Conversation = Sequence[Mapping[str, Any]]  # chat messages: {"role": ..., "content": ...}
CHAT_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ModelInput:
    """One input as the model runs it: the prompt as text (a conversation rendered, ids decoded),
    its token ids, and the form the test gave it in."""

    text: str
    ids: list[int]
    form: PromptForm


def model_inputs(prompt: Any, token_ids: Any, *, tokenizer: Any, settings: GenerationSettings,
                 spec: str) -> tuple[list[ModelInput], bool]:
    """Each input of a ``generate(prompt)`` or ``generate(token_ids=...)`` call, and whether one
    input (not a list) was given."""
    __tracebackhide__ = True
    if (prompt is None) == (token_ids is None):
        raise TypeError("llm_model.generate() takes a prompt (a string, a chat conversation, or a list of "
                        "them) or token_ids=[...], exactly one of the two")
    if token_ids is not None:
        single = isinstance(token_ids, (list, tuple)) and bool(token_ids) and \
            all(isinstance(t, int) for t in token_ids)  # a bool too: from_ids() names it
        rows = [token_ids] if single else token_ids
        if not isinstance(rows, (list, tuple)) or not rows:
            raise TypeError(f"llm_model.generate(token_ids=...) takes a list of token ids or a list of such "
                            f"lists, got {token_ids!r}")
        return [from_ids(row, tokenizer=tokenizer, settings=settings) for row in rows], single
    if isinstance(prompt, str) or is_conversation(prompt):
        return [encoded(prompt, tokenizer=tokenizer, settings=settings, spec=spec)], True
    if isinstance(prompt, (list, tuple)) and prompt:
        return [encoded(item, tokenizer=tokenizer, settings=settings, spec=spec, where=f"prompt[{index}]")
                for index, item in enumerate(prompt)], False
    raise TypeError(f"llm_model.generate() takes a prompt string, a chat conversation (a list of "
                    f"{{'role': ..., 'content': ...}} dicts) or a list of them, got {prompt!r}")


def encoded(prompt: Any, *, tokenizer: Any, settings: GenerationSettings, spec: str,
            where: str = "prompt") -> ModelInput:
    """A prompt string or a chat conversation, tokenised as the model runs it; ``where`` names it in
    errors (``prompt[2]``: the third of a list)."""
    __tracebackhide__ = True
    if isinstance(prompt, str):
        refuse_invalid_unicode(prompt, where)
        refuse_unfitting_length(prompt, prompt, tokenizer=tokenizer, settings=settings)
        ids = checked(prompt, list(tokenizer(prompt)["input_ids"]), settings)
        return ModelInput(prompt, ids, PromptForm.TEXT)
    if not is_conversation(prompt):
        raise TypeError(f"llm_model.generate() takes prompt strings or chat conversations (lists of "
                        f"{{'role': ..., 'content': ...}} dicts), got {prompt!r}")
    check_messages(prompt, where)
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigurationError("llm_model.generate(conversation)", prompt[0],
                                 f"the tokenizer of {spec} has no chat template; pass the "
                                 "prompt as a string, or its token ids with token_ids=[...]")
    text = str(tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True))
    refuse_invalid_unicode(text, f"{where} (the chat as its template rendered it)")
    # An error shows the end of the rendered chat, where the user's own words are.
    shown = text if len(text) <= 60 else f"(chat, rendered) …{text[-44:]}"
    refuse_unfitting_length(text, shown, tokenizer=tokenizer, settings=settings)
    # The template already wrote the special tokens it wants (a BOS, say): add none a second time.
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    checked(shown, ids, settings)
    return ModelInput(text, ids, PromptForm.CHAT)


def check_messages(conversation: Conversation, where: str = "prompt") -> None:
    """Each message has a role every chat template knows and text content: anything else would be
    rendered however the template happens to treat it, and recorded as if it were meant. ``where``:
    the conversation's place in the call (``prompt``, ``prompt[2]``)."""
    __tracebackhide__ = True
    shape = "a chat message is {'role': 'system' | 'user' | 'assistant' | 'tool', 'content': '...'}"
    name = "conversation" if where == "prompt" else where
    for index, message in enumerate(conversation):
        role, content = message["role"], message["content"]
        if role not in CHAT_ROLES:
            raise ConfigurationError(f"llm_model.generate({name}[{index}]['role'])", role,
                                     f"unknown role; expected one of {', '.join(map(repr, CHAT_ROLES))} "
                                     f"({shape})")
        if not isinstance(content, str):
            raise ConfigurationError(f"llm_model.generate({name}[{index}]['content'])", content,
                                     f"expected the message's text as a string, got {type(content).__name__} "
                                     f"({shape})")
        refuse_invalid_unicode(content, f"{name}[{index}]['content']")


def refuse_invalid_unicode(text: str, where: str) -> None:
    """A text that UTF-8 cannot encode (it holds a lone surrogate, half of a UTF-16 pair) can be
    neither tokenised nor stored in a golden: refused, naming where it is in the call and where the
    character is in the text."""
    __tracebackhide__ = True
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        at = error.start
        raise ConfigurationError(
            f"llm_model.generate({where})", text[max(0, at - 20):at + 20],
            f"holds a lone surrogate {text[at]!r} at character {at}: half of a UTF-16 pair, not valid "
            "Unicode, so it can be neither tokenised nor stored in a golden (UTF-8). It usually comes from "
            "bytes decoded with errors='surrogateescape' or a JSON '\\ud800' escape: decode the bytes with "
            "errors='replace', or remove the character") from None


# A text this long is refused by its length alone: tokenising it to count its tokens exactly would
# take about a second, only to refuse it. Shorter ones are counted, so the shape an error suggests fits.
COUNTED_CHARACTERS = 1_000_000


def refuse_unfitting_length(text: str, shown: str, *, tokenizer: Any, settings: GenerationSettings) -> None:
    """:class:`PromptTooLongError` for a text too long to fit the shape whatever its tokens, before it
    is tokenised (a 10 MB prompt takes seconds and gigabytes to tokenise, only to be refused): where
    no shape the plugin accepts holds it, or where it is too long to count
    (:data:`COUNTED_CHARACTERS`). Any other text is tokenised and :func:`checked` refuses it with its
    real count and a shape that holds it: a shape suggested from the bound would be too small."""
    __tracebackhide__ = True
    shape = settings.batch_shape
    if shape.rows == 1:
        return  # one row runs at the prompt's own length: only the model's context bounds it (the engine)
    per_token = characters_per_token(tokenizer)
    if per_token is None:
        return
    at_least = -(-len(text) // per_token)
    if fits(at_least, shape):
        return
    fitting = shape.holding(at_least)
    if fitting is None or len(text) > COUNTED_CHARACTERS:
        raise PromptTooLongError(shown, at_least, str(shape), setting=settings.batch_shape_setting,
                                 fitting=None if fitting is None else str(fitting), at_least=True,
                                 characters=len(text), shape_in_goldens=settings.shape_in_goldens)


_CHARACTERS_PER_TOKEN: weakref.WeakKeyDictionary[Any, int | None] = weakref.WeakKeyDictionary()


def characters_per_token(tokenizer: Any) -> int | None:
    """The most characters of a text that one token of ``tokenizer`` stands for, or None where no
    bound is safe (then the text is tokenised before its length is judged)."""
    try:
        return _CHARACTERS_PER_TOKEN[tokenizer]
    except KeyError:
        bound = _characters_per_token(tokenizer)
        _CHARACTERS_PER_TOKEN[tokenizer] = bound
        return bound
    except TypeError:  # not weakly referenceable
        return _characters_per_token(tokenizer)


# Normalizers that never drop characters, with how many input characters one output character may
# stand for: NFC and NFKC compose (a Hangul syllable of three jamo, a letter with two marks).
_KEEPING_NORMALIZERS = {"Prepend": 1, "Lowercase": 1, "ByteLevel": 1, "NFD": 1, "NFKD": 1,
                        "NFC": 4, "NFKC": 4}
_KEEPING_PRE_TOKENIZERS = ("ByteLevel", "Metaspace", "Split", "Digits", "Punctuation", "UnicodeScripts")


def _characters_per_token(tokenizer: Any) -> int | None:
    """From a transformers fast tokenizer whose every step keeps every character (byte-level BPE,
    SentencePiece BPE with byte fallback): a token covers at most its longest vocabulary entry's
    characters (a byte-level entry has one character per byte). Tokenizers that may drop characters
    (whitespace splitting, fused unknowns, stripping special tokens, regex replacements, WordPiece's
    one [UNK] for a long word, Unigram) get no bound: a long text can be few tokens there."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        factor = _normalizer_factor(backend.normalizer)
        stripping = any(getattr(t, "lstrip", False) or getattr(t, "rstrip", False)
                        for t in getattr(tokenizer, "added_tokens_decoder", {}).values())
        if factor is None or stripping or not _keeps_characters(backend.pre_tokenizer) \
                or not _keeps_unknowns(backend.model):
            return None
        return factor * max(map(len, tokenizer.get_vocab()))
    except (AttributeError, TypeError, ValueError):
        return None


def _state(component: Any) -> dict[str, Any] | None:
    return None if component is None else json.loads(component.__getstate__())


def _normalizer_factor(normalizer: Any) -> int | None:
    state = _state(normalizer)
    if state is None:
        return 1
    parts = state["normalizers"] if state["type"] == "Sequence" else [state]
    factor = 1
    for part in parts:
        kind = part["type"]
        if kind == "Replace":  # one character for another text, e.g. " " -> "▁" (SentencePiece)
            pattern = part["pattern"].get("String")
            if pattern is None or len(pattern) != 1 or not part["content"]:
                return None
        elif kind in _KEEPING_NORMALIZERS:
            factor = max(factor, _KEEPING_NORMALIZERS[kind])
        else:
            return None
    return factor


def _keeps_characters(pre_tokenizer: Any) -> bool:
    state = _state(pre_tokenizer)
    if state is None:
        return True
    parts = state["pretokenizers"] if state["type"] == "Sequence" else [state]
    return all(part["type"] in _KEEPING_PRE_TOKENIZERS and part.get("behavior") != "Removed"
               for part in parts)


def _keeps_unknowns(model: Any) -> bool:
    """Unknown characters are not fused into one token: byte fallback, or one unknown each."""
    if type(model).__name__ != "BPE":
        return False
    return bool(model.byte_fallback or not model.fuse_unk or model.unk_token is None)


def from_ids(row: Any, *, tokenizer: Any, settings: GenerationSettings) -> ModelInput:
    """Token ids as given, each checked to be in the vocabulary."""
    __tracebackhide__ = True
    vocab = len(tokenizer)
    if not isinstance(row, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                     and 0 <= t < vocab for t in row):
        raise ConfigurationError("llm_model.generate(token_ids=...)", row,
                                 f"expected a list of token ids between 0 and {vocab - 1}")
    text = str(tokenizer.decode(list(row)))
    return ModelInput(text, checked(text, list(row), settings), PromptForm.TOKEN_IDS)


def checked(prompt: str, ids: list[int], settings: GenerationSettings) -> list[int]:
    """``ids``, if they are some tokens and fit the shape; ``prompt`` is what an error shows."""
    __tracebackhide__ = True
    if not ids:
        raise ConfigurationError("llm_model.generate(prompt)", prompt,
                                 "encodes to no tokens; give the model something to continue")
    shape = settings.batch_shape
    if not fits(len(ids), shape):
        fitting = shape.holding(len(ids))
        raise PromptTooLongError(prompt, len(ids), str(shape), setting=settings.batch_shape_setting,
                                 fitting=None if fitting is None else str(fitting),
                                 shape_in_goldens=settings.shape_in_goldens)
    return ids


def fits(n_tokens: int, shape: BatchShape) -> bool:
    """Whether a prompt of ``n_tokens`` runs in ``shape``. One position always stays padding: a batch
    without any padding drops the attention mask and takes another kernel path, so a prompt of
    exactly L tokens would change with its companions (measured: logit hashes differ alone vs
    batched at 4x32). At one row a prompt has no companions and runs at its own length: only the
    model's context bounds it (the engine checks prompt plus max_new_tokens against it), as in a
    plain generate()."""
    return shape.rows == 1 or n_tokens < shape.length


def is_token_ids(value: Any) -> bool:
    """Whether ``value`` is one prompt's token ids (a non-empty list of ints), not a list of them."""
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


def is_conversation(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(m, Mapping) and isinstance(m.get("role"), str) and "content" in m for m in value)


@dataclass(frozen=True)
class ScoreInput:
    """One ``(prompt, continuation)`` pair of ``llm_model.score`` as the model runs it: the prompt as
    ``generate`` would run it, and the continuation's text and ids (a string tokenised on its own,
    without special tokens)."""

    prompt: ModelInput
    continuation: str
    continuation_ids: list[int]


def score_inputs(prompt: Any, continuation: Any, *, tokenizer: Any, settings: GenerationSettings,
                 spec: str) -> tuple[list[ScoreInput], bool]:
    """Each pair of a ``score(prompt, continuation)`` or ``score([(prompt, continuation), ...])``
    call, and whether one pair (not a list) was given."""
    __tracebackhide__ = True
    if continuation is not None:
        return [score_input(prompt, continuation, tokenizer=tokenizer, settings=settings, spec=spec)], True
    if isinstance(prompt, (list, tuple)) and prompt and all(is_pair(pair) for pair in prompt):
        return [score_input(first, second, tokenizer=tokenizer, settings=settings, spec=spec,
                            where=f"[{index}]")
                for index, (first, second) in enumerate(prompt)], False
    raise TypeError("llm_model.score() takes a prompt and its continuation, score(prompt, continuation), "
                    "or a list of (prompt, continuation) pairs, score([(prompt, continuation), ...]); got "
                    f"{prompt!r} without a continuation")


def refuse_special_text(continuation: str, ids: list[int], *, tokenizer: Any, setting: str) -> None:
    """A string continuation is scored without special tokens; a tokenizer reads a special token's
    text (``<|bos|>``) as that token even so: refused, naming it and how to score it on purpose."""
    __tracebackhide__ = True
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    for token in dict.fromkeys(t for t in ids if t in special):
        text = str(tokenizer.decode([token]))
        if text and text in continuation:  # an unknown character read as <unk> is no special text
            shown = continuation if len(continuation) <= 60 else continuation[:57] + "..."
            raise ConfigurationError(setting, shown, f"holds {text!r}, the text of the tokenizer's special "
                                     f"token {token}, which it would read as that token; a string "
                                     "continuation is scored as text, without special tokens. To score the "
                                     "special token, give the continuation as token ids (with "
                                     f"{token} where it goes); else remove {text!r} from the text")


def is_pair(value: Any) -> bool:
    """Whether ``value`` is one ``(prompt, continuation)`` pair (not token ids, not a conversation)."""
    return isinstance(value, (list, tuple)) and len(value) == 2 and not is_token_ids(value) \
        and not is_conversation(value)


def score_input(prompt: Any, continuation: Any, *, tokenizer: Any, settings: GenerationSettings, spec: str,
                where: str = "") -> ScoreInput:
    """One pair, each part checked: the prompt as ``generate`` takes it (a string, a conversation or
    token ids), the continuation a non-empty string or token ids, and both together within the shape."""
    __tracebackhide__ = True
    if is_token_ids(prompt):
        given = from_ids(prompt, tokenizer=tokenizer, settings=settings)
    else:
        given = encoded(prompt, tokenizer=tokenizer, settings=settings, spec=spec,
                        where=f"prompt{where}" if where else "prompt")
    setting = f"llm_model.score(continuation{where})"
    if isinstance(continuation, str):
        refuse_invalid_unicode(continuation, f"continuation{where}")
        # On its own: no BOS or other special token in the middle of the sequence.
        ids = list(tokenizer(continuation, add_special_tokens=False)["input_ids"]) if continuation else []
        refuse_special_text(continuation, ids, tokenizer=tokenizer, setting=setting)
        text = continuation
    elif isinstance(continuation, (list, tuple)):
        vocab = len(tokenizer)
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in continuation):
            raise ConfigurationError(setting, continuation,
                                     f"expected a string or a list of token ids between 0 and {vocab - 1}")
        ids, text = list(continuation), str(tokenizer.decode(list(continuation)))
    else:
        raise ConfigurationError(setting, continuation, "expected the continuation as a string or a list of "
                                 "token ids")
    if not ids:
        raise ConfigurationError(setting, continuation, "encodes to no tokens; a score needs at least one "
                                 "continuation token to give a logprob to")
    total = len(given.ids) + len(ids)
    shape = settings.batch_shape
    if not fits(total, shape):
        fitting = shape.holding(total)
        if fitting is None:
            fix = "no batch shape the plugin accepts holds them: shorten the prompt or the continuation"
        else:
            example = (f"@deterministic(batch_shape=\"{fitting}\")"
                       if settings.batch_shape_setting.startswith("@") else
                       pasteable("llm_batch_shape", str(fitting)))
            fix = f"raise L, e.g. {example}, or shorten them. {after_shape_change(settings.shape_in_goldens)}"
        raise ConfigurationError(setting, text if len(text) <= 60 else text[:57] + "...",
                                 f"the prompt's {len(given.ids)} tokens plus the continuation's {len(ids)} "
                                 f"need {total} positions but "
                                 f"{settings.batch_shape_setting.replace('=...', '')} {str(shape)!r} allows "
                                 f"{shape.length - 1} (one position always stays padding); {fix}")
    return ScoreInput(given, text, ids)
