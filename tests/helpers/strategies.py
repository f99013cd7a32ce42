"""Hypothesis strategies for Generation records (test helpers, not public API)."""

import dataclasses
from typing import Any

from hypothesis import strategies as st

from pytest_llmdeterminism.generation import Generation, Score

_logprob = st.floats(min_value=-30, max_value=0, allow_nan=False).map(lambda v: round(v, 6))


@st.composite
def generations(draw, steps=None):
    n = draw(steps if steps is not None else st.integers(min_value=0, max_value=12))
    tops = []
    for _ in range(n):
        values = sorted(draw(st.lists(_logprob, min_size=2, max_size=5)), reverse=True)
        ids = draw(st.lists(st.integers(0, 50_000), min_size=len(values), max_size=len(values), unique=True))
        tops.append(tuple(zip(ids, values, strict=True)))
    text = st.text(max_size=20)
    return Generation(
        prompt=draw(text),
        prompt_token_ids=tuple(draw(st.lists(st.integers(0, 50_000), min_size=1, max_size=10))),
        token_ids=tuple(top[0][0] for top in tops),
        text=draw(text),
        step_hashes=tuple(draw(st.lists(st.text("0123456789abcdef", min_size=16, max_size=16),
                                        min_size=n, max_size=n))),
        top_logprobs=tuple(tops),
        margins=tuple(round(top[0][1] - top[1][1], 6) for top in tops),
        finish_reason=draw(st.sampled_from(["eos", "length"])),
        generation_config={"do_sample": False, "max_new_tokens": draw(st.integers(1, 64)),
                           "eos_token_id": [2]},
        batch_shape=draw(st.sampled_from(["1x64", "4x32"])),
        pieces=tuple(draw(st.lists(text, min_size=n, max_size=n))),
        fingerprint={"device_class": "cpu", "dtype": draw(st.sampled_from(["float32", "bfloat16"])),
                     "torch": "2.13.0"},
    )


def sample_generation(steps: int = 2) -> Generation:
    """A fixed, valid record for tests that edit one field of it."""
    tops = tuple(((10 + i, -0.1), (20 + i, -2.5)) for i in range(steps))
    return Generation(
        prompt="p", prompt_token_ids=(1, 2), token_ids=tuple(10 + i for i in range(steps)), text="ab",
        step_hashes=tuple(f"{i:016x}" for i in range(steps)), top_logprobs=tops,
        margins=(2.4,) * steps, finish_reason="length", generation_config={"max_new_tokens": steps},
        batch_shape="1x8", pieces=("a", "b", "c", "d")[:steps], fingerprint={"dtype": "float32"},
    )


# The last one holds 40+ tokens: too long for 4x32, fine at the default 1x128.
POOL = ["The sky is", "Count: one,", " ".join(["the"] * 20 + ["000000 0000000 00000000"] * 4)]
PROMPT = "The capital of France is"


def sample_score(positions: int = 3, *, prompt_logprobs: bool = False) -> Score:
    """A fixed, valid score record (teacher-forced logprobs of a continuation) for tests that edit
    one field of it. Position 1 is a planted near tie: its given token is ranked 2, 0.01 below the
    top-1, so a small drift can swap the two."""
    tokens = tuple(30 + i for i in range(positions))
    logprobs = tuple(-0.5 - 0.25 * i if i != 1 else -0.70 for i in range(positions))
    tops = tuple(((tokens[i], logprobs[i]), (90 + i, logprobs[i] - 2.5)) if i != 1
                 else ((80, -0.69), (tokens[i], -0.70)) for i in range(positions))
    return Score(
        prompt="p", prompt_token_ids=(1, 2), continuation="xyz"[:positions], token_ids=tokens,
        logprobs=logprobs, ranks=tuple(2 if i == 1 else 1 for i in range(positions)),
        step_hashes=tuple(f"{0xabc0 + i:016x}" for i in range(positions)), top_logprobs=tops,
        rank_margins=tuple(0.01 if i == 1 else 2.5 for i in range(positions)), batch_shape="1x8",
        pieces=tuple("xyz"[i % 3] for i in range(positions)), fingerprint={"dtype": "float32"},
        prompt_logprobs=(None, -1.5) if prompt_logprobs else (),
    )


def moved_score(score: Score, position: int, logprob: float, *, rank: int | None = None,
                hash_: str = "ffffffffffffffff") -> Score:
    """``score`` with one position's logprob (and its hash, and optionally rank) changed."""
    def at(values: tuple[Any, ...], value: Any) -> tuple[Any, ...]:
        return tuple(value if t == position else v for t, v in enumerate(values))
    return dataclasses.replace(score, logprobs=at(score.logprobs, logprob),
                               step_hashes=at(score.step_hashes, hash_),
                               ranks=at(score.ranks, score.ranks[position] if rank is None else rank))
