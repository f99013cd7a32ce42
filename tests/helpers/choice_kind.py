"""A throw-away kind of golden, for tests only: which of a few options a model would choose, with each
option's logprob. It shows that a kind is one module plus one registry line
(``goldens.kinds.register(CHOICE)``): it records, checks, reports and is reviewed through the
plugin's normal paths without any other module knowing it.

A :class:`Choice` is built from plain numbers (:func:`choose`), so a test decides its result: no
model runs. Its one "step" is the choice: ``token_ids`` is the chosen option's index, ``pieces`` its
text, ``top_logprobs`` every option best first, which is what the generic parts of a failure and a
report read of any record.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_llmdeterminism.generation import PromptForm, variant_of
from pytest_llmdeterminism.goldens import kinds
from pytest_llmdeterminism.goldens.fields import FORMAT, KindEntry, Logprob, Text
from pytest_llmdeterminism.judge.compare import (
    Comparison,
    Divergence,
    Verdict,
    default_tie_margin,
    near_tie,
)

FINGERPRINT = {"device_class": "cpu", "dtype": "float32"}  # the variant cpu/float32, as a transformers run's


@dataclass(frozen=True)
class Choice:
    prompt: str
    options: tuple[str, ...]
    logprobs: tuple[float, ...]
    fingerprint: Mapping[str, Any] = field(default_factory=lambda: dict(FINGERPRINT), compare=False)
    batch_shape: str = "1x1"
    prompt_form: PromptForm = PromptForm.TEXT

    @property
    def chosen(self) -> int:
        return max(range(len(self.options)), key=lambda i: (self.logprobs[i], -i))

    @property
    def ranked(self) -> tuple[tuple[int, float], ...]:
        return tuple(sorted(enumerate(self.logprobs), key=lambda pair: (-pair[1], pair[0])))

    # What the generic parts of a check, a failure and a report read of any record:
    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        return tuple(range(len(self.prompt.split())))

    @property
    def token_ids(self) -> tuple[int, ...]:
        return (self.chosen,)

    @property
    def pieces(self) -> tuple[str, ...]:
        return (self.options[self.chosen],)

    @property
    def top_logprobs(self) -> tuple[tuple[tuple[int, float], ...], ...]:
        return (self.ranked,)

    @property
    def variant(self) -> str:
        return variant_of(self.fingerprint)


def choose(prompt: str, logprobs: Mapping[str, float]) -> Choice:
    """The choice among ``logprobs``' options (in their order), each with its logprob."""
    return Choice(prompt, tuple(logprobs), tuple(float(lp) for lp in logprobs.values()))


class ChoiceEntry(KindEntry, forbid_unknown_fields=True, gc=False, kw_only=True):
    """A choice's golden entry: its own fields beside the ones every kind's entry holds."""

    options: tuple[Text, ...]
    logprobs: tuple[Logprob, ...]


class ChoiceKind:
    name = "choice"
    record_type: type = Choice
    entry_type: type = ChoiceEntry
    format = FORMAT
    shorten = "Offer shorter options"
    step_noun = "choice"

    def to_entry(self, record: Choice) -> dict[str, Any]:
        return {"kind": self.name, "batch_shape": record.batch_shape, "fingerprint": dict(record.fingerprint),
                "prompt": record.prompt, "prompt_token_ids": list(record.prompt_token_ids),
                "options": list(record.options), "logprobs": list(record.logprobs)}

    def from_entry(self, entry: ChoiceEntry) -> Choice:
        return Choice(entry.prompt, entry.options, entry.logprobs, fingerprint=entry.fingerprint,
                      batch_shape=entry.batch_shape, prompt_form=PromptForm(entry.prompt_form))

    def entry_problem(self, entry: ChoiceEntry) -> str | None:
        if len(entry.options) < 2 or len(entry.options) != len(entry.logprobs):
            return (f"has {len(entry.options)} options and {len(entry.logprobs)} logprobs: one logprob per "
                    "option, two options or more")
        return None

    def entry_texts(self, entry: ChoiceEntry) -> Iterable[tuple[str, str]]:
        return _texts(entry.prompt, entry.options)

    def entry_keys(self, entry: ChoiceEntry) -> int | None:
        return None  # not counted: the exact duplicate-key check reads its file

    def stored_texts(self, record: Choice) -> Iterable[tuple[str, str]]:
        return _texts(record.prompt, record.options)

    def compare(self, expected: Choice, actual: Choice, *, tie_margin: float | None) -> Comparison:
        """Other options or prompt: INPUT_CHANGED; another choice: TIE_FLIP where the golden's best two
        options were within the tie margin, else REGRESSION; the same choice with other logprobs:
        LOGIT_DRIFT; else IDENTICAL."""
        changes = tuple((name, getattr(expected, name), getattr(actual, name))
                        for name in ("prompt", "options") if getattr(expected, name) != getattr(actual, name))
        if changes:
            return Comparison(Verdict.INPUT_CHANGED, input_changes=changes)
        margin = tie_margin if tie_margin is not None else default_tie_margin("float32")
        drift = max(abs(a - b) for a, b in zip(expected.logprobs, actual.logprobs, strict=True))
        if expected.chosen != actual.chosen:
            best = expected.ranked
            golden_margin = best[0][1] - best[1][1]
            divergence = Divergence(0, expected.chosen, actual.chosen, expected.ranked, actual.ranked,
                                    golden_margin)
            verdict = Verdict.TIE_FLIP if near_tie(golden_margin, margin, 0.0) else Verdict.REGRESSION
            return Comparison(verdict, divergence=divergence, first_hash_step=0, total_steps=1,
                              tie_margin=margin)
        verdict = Verdict.IDENTICAL if drift == 0 else Verdict.LOGIT_DRIFT
        return Comparison(verdict, first_hash_step=None if drift == 0 else 0, steps_compared=1, total_steps=1,
                          max_logprob_delta=drift, tie_margin=margin)

    def sampling(self, record: Choice) -> dict[str, Any]:
        return {}

    def decoded_text(self, record: Choice) -> str | None:
        return None

    def text(self, record: Choice) -> str:
        return record.options[record.chosen]

    def report_steps(self, record: Choice) -> list[tuple[str, int, float, float | None]]:
        best = record.ranked
        return [(record.options[record.chosen], record.chosen, best[0][1] - best[1][1], best[0][1])]

    def show_lines(self, key: str, variant: str, record: Choice) -> list[str]:
        return [f"{key} [{variant}]  choice: {record.options[record.chosen]!r}",
                *(f"  {record.options[i]!r:<16} logprob {lp:10.6f}" for i, lp in record.ranked), ""]


def _texts(prompt: str, options: tuple[str, ...]) -> list[tuple[str, str]]:
    return [("its prompt", prompt), *((f"its option {i}", option) for i, option in enumerate(options))]


CHOICE = ChoiceKind()


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """:data:`CHOICE` registered for the block, as a package defining it would have it registered for
    the ``llm-golden`` tools; the registry as it was afterwards."""
    kinds.register(CHOICE)
    try:
        yield
    finally:
        kinds.unregister(CHOICE.name)

__all__ = ["CHOICE", "Choice", "ChoiceEntry", "choose", "registered"]


def write_choice_test(project: Any, logprobs: Mapping[str, float]) -> None:
    """A pytester project's ``test_c.py``: one test that checks the choice among ``logprobs``."""
    project.makepyfile(test_c=f"""
from tests.helpers.choice_kind import choose

def test_colour(golden_tokens):
    golden_tokens.check(choose("Which colour is the sky?", {dict(logprobs)!r}))
""")


class AnsweringTerminal(io.StringIO):
    """Answers typed on a terminal (``llm-golden review`` asks only on one)."""

    def isatty(self) -> bool:
        return True
