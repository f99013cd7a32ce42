"""What a model computed: the :class:`Generation` and :class:`Score` records, how a prompt was given
and what a step's hash hashes. The settings a call decodes with are
:mod:`~pytest_llmdeterminism.decoding`'s."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import xxhash

from pytest_llmdeterminism.sampling import RECORDED_SETTINGS

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

def variant_of(fingerprint: Mapping[str, Any]) -> str:
    """The golden variant of a record with this fingerprint: device class and dtype (``cpu/float32``),
    after the engine unless it is transformers (``llamacpp:cpu/Q4_1``)."""
    engine = fingerprint.get("engine", DEFAULT_ENGINE)
    where = f"{fingerprint.get('device_class', 'cpu')}/{fingerprint.get('dtype', 'float32')}"
    return where if engine == DEFAULT_ENGINE else f"{engine}:{where}"


@dataclass(frozen=True)
class Speculated:
    """How a speculative generation's verify passes went (``llm_model.generate(...,
    prompt_lookup_num_tokens=N)`` or ``assistant_model=llm_model``): its ``method``
    (``"prompt_lookup"`` or ``"assistant"``), the ``passes`` verify forwards of the model, the draft
    tokens they were given (``drafted``) and how many of those they accepted (``accepted``). Not in a
    golden: a speculated generation is checked against the plain one's."""

    method: str
    passes: int
    drafted: int
    accepted: int

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted draft tokens over drafted ones; ``None`` where nothing was drafted (a prompt lookup
        that never found its n-gram)."""
        return self.accepted / self.drafted if self.drafted else None


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
    # Speculative decoding's verify passes and acceptance; None where the call did not speculate.
    speculation: Speculated | None = field(default=None, compare=False)

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


# ---- an eval's result, item by item: what ``llm_model.evaluate(items)`` returns -------------------
#
# An item is multiple choice (each choice scored teacher-forced, the decision the best choice, its
# margin the best minus the runner-up) or generative (a greedy answer, correct by a match rule, its
# margin the smallest top-1/top-2 margin on the path that spelt the answer). Each item keeps a hash of
# its input (its prompt's ids) and one of the numbers behind its decision (the step hashes of its
# scores or its generation): two runs are told apart as a changed input, a changed decision, or the
# same decision on other numbers.

CHOICE = "choice"  # a multiple-choice item
ANSWER = "answer"  # a generative item


def digest(*parts: object) -> str:
    """The xxh3-64 hex of ``parts`` in order (each as its ``repr``, separated): an item's input or its
    numbers, as one short string."""
    hasher = xxhash.xxh3_64()
    for part in parts:
        hasher.update(repr(part).encode("utf-8", "surrogatepass"))
        hasher.update(b"\x00")
    return hasher.hexdigest()


@dataclass(frozen=True)
class EvalItem:
    """One item of an evaluation. ``choice``: the chosen choice's index (multiple choice) or the
    generated answer (generative); ``margin``: how far the decision was from changing (in
    logprob); ``scores``: each choice's score, as the decision compared them (multiple choice; empty
    for an answer); ``input``: the hash of what the model was given; ``numbers``: the hash of the
    step hashes behind the decision; ``label``: what it was judged against (the right choice's index,
    or the answer), so a changed answer key is told from a changed model."""

    id: str
    form: str  # CHOICE or ANSWER
    choice: int | str
    correct: bool
    margin: float
    input: str
    numbers: str
    scores: tuple[float, ...] = ()
    label: int | str | None = None


@dataclass(frozen=True)
class Evaluation:
    """What ``llm_model.evaluate(items)`` found: each item's decision, correctness and margin, in the
    items' order. ``settings``: what changes the decisions beyond the items (``acc_norm``)."""

    items: tuple[EvalItem, ...]
    batch_shape: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    fingerprint: Mapping[str, Any] = field(default_factory=dict, compare=False)

    kind = "eval"  # a golden entry's ``kind``

    def __post_init__(self) -> None:
        if not self.items:
            raise ValueError("an Evaluation needs at least one item")

    @property
    def accuracy(self) -> float:
        return sum(item.correct for item in self.items) / len(self.items)

    def near_ties(self, tie_margin: float) -> tuple[EvalItem, ...]:
        """The items whose decision sat within ``tie_margin``: those a numeric change can flip (the
        eval's noise floor, forecast from this one run)."""
        return tuple(item for item in self.items if item.margin < tie_margin)

    @property
    def variant(self) -> str:
        return variant_of(self.fingerprint)

    # What the generic parts of a check, a failure and a report read of any record: an item is a step.
    @property
    def prompt(self) -> str:
        return f"an eval of {len(self.items)} item(s): {', '.join(item.id for item in self.items[:5])}" + \
            (", ..." if len(self.items) > 5 else "")

    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        return ()

    @property
    def prompt_form(self) -> PromptForm:
        return PromptForm.TEXT

    @property
    def token_ids(self) -> tuple[int, ...]:
        """Each item's decision as a number: a choice's index, or an answer's hash (31 bits)."""
        return tuple(item.choice if isinstance(item.choice, int) else
                     xxhash.xxh32_intdigest(item.choice.encode("utf-8", "surrogatepass")) >> 1
                     for item in self.items)

    @property
    def pieces(self) -> tuple[str, ...]:
        return tuple(f"{item.id}: {item.choice!r}" for item in self.items)

    @property
    def top_logprobs(self) -> tuple[tuple[tuple[int, float], ...], ...]:
        return tuple(tuple(sorted(enumerate(item.scores), key=lambda pair: (-pair[1], pair[0])))
                     for item in self.items)

    @property
    def margins(self) -> tuple[float, ...]:
        return tuple(item.margin for item in self.items)


def best_two(scores: tuple[float, ...]) -> tuple[int, float]:
    """The best score's index (the first of equals) and its margin over the runner-up."""
    order = sorted(range(len(scores)), key=lambda index: (-scores[index], index))
    return order[0], scores[order[0]] - scores[order[1]] if len(order) > 1 else math.inf
