"""The eval kind: an :class:`~pytest_llmdeterminism.generation.Evaluation` from ``llm_model.evaluate``,
stored as one line per item (its decision, correctness, margin and the hashes of its input and of the
numbers behind its decision) plus the accuracy.

Judged item by item with the verdicts every kind uses: an item whose input changed is INPUT_CHANGED;
one whose decision or correctness changed is a TIE_FLIP where the golden's margin was a near tie,
else a REGRESSION (a planted label swap is one: the model did not change, the answer key did); the
same decision on other numbers is LOGIT_DRIFT. The check's verdict is its worst item's, and its
evidence leads with the eval: the accuracy before and after, the flips each way, and the paired gate
of :mod:`pytest_llmdeterminism.judge.eval_gate` (exact McNemar p, the minimum detectable effect).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal, Union

import msgspec

from pytest_llmdeterminism.errors import printable
from pytest_llmdeterminism.generation import CHOICE, EvalItem, Evaluation
from pytest_llmdeterminism.goldens.fields import FORMAT, KindEntry, Margin, StepHash, Text
from pytest_llmdeterminism.judge import eval_gate
from pytest_llmdeterminism.judge.compare import Comparison, Verdict, default_tie_margin, near_tie

ItemScore = Annotated[float, msgspec.Meta(ge=-1e12, le=0.0)]
_ITEMS_SHOWN = 20
_ENTRY_KEYS = 7
_ITEM_KEYS = 7  # id, form, choice, correct, margin, input, numbers
Changed = tuple[EvalItem, EvalItem, Verdict]  # an item whose decision or correctness changed: golden, now


class ItemEntry(msgspec.Struct, forbid_unknown_fields=True, gc=False, kw_only=True, omit_defaults=True):
    """One item of an eval golden."""

    id: Text
    form: Literal["choice", "answer"]
    choice: Union[int, Text]  # noqa: UP007 - msgspec reads the annotation at run time
    correct: bool
    margin: Union[Margin, None]  # noqa: UP007 - None: no runner-up (a generation of no step)
    input: StepHash
    numbers: StepHash
    scores: tuple[ItemScore, ...] = ()
    label: Union[int, Text, None] = None  # noqa: UP007 - the right choice's index, or the answer


class EvalEntry(KindEntry, forbid_unknown_fields=True, gc=False, kw_only=True):
    """An eval golden's entry: its items, and the accuracy they give (checked against them)."""

    accuracy: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
    items: tuple[ItemEntry, ...]


class EvalKind:
    name = "eval"
    record_type: type = Evaluation
    entry_type: type = EvalEntry
    format = FORMAT
    shorten = "Split the eval into smaller ones"
    step_noun = "item"

    def to_entry(self, record: Evaluation) -> dict[str, Any]:
        items = [{"id": item.id, "form": item.form, "choice": item.choice, "correct": item.correct,
                  "margin": item.margin if math.isfinite(item.margin) else None, "input": item.input,
                  "numbers": item.numbers, **({"scores": list(item.scores)} if item.scores else {}),
                  **({"label": item.label} if item.label is not None else {})}
                 for item in record.items]
        return {"kind": self.name, "batch_shape": record.batch_shape, "fingerprint": dict(record.fingerprint),
                "prompt": record.prompt, "prompt_token_ids": [], "generation_config": dict(record.settings),
                "accuracy": record.accuracy, "items": items}

    def from_entry(self, entry: EvalEntry) -> Evaluation:
        items = tuple(EvalItem(id=item.id, form=item.form, choice=item.choice, correct=item.correct,
                               margin=item.margin if item.margin is not None else math.inf, input=item.input,
                               numbers=item.numbers, scores=item.scores, label=item.label)
                      for item in entry.items)
        return Evaluation(items=items, batch_shape=entry.batch_shape, settings=dict(entry.generation_config),
                          fingerprint=entry.fingerprint)

    def entry_problem(self, entry: EvalEntry) -> str | None:
        if not entry.items:
            return "is an eval entry (\"kind\": \"eval\") without items"
        ids = [item.id for item in entry.items]
        if len(set(ids)) != len(ids):
            return f"holds item {next(i for i in ids if ids.count(i) > 1)!r} twice"
        for item in entry.items:
            if (item.form == CHOICE) != isinstance(item.choice, int) or \
                    (item.form == CHOICE and not 0 <= item.choice < len(item.scores)):  # type: ignore[operator]
                return (f"item {item.id!r}: a {item.form} item's choice is "
                        + ("the index of one of its scores" if item.form == CHOICE else "the generated text"))
        for item in entry.items:
            if item.form == CHOICE and item.label is not None and \
                    (not isinstance(item.label, int) or not 0 <= item.label < len(item.scores)):
                return f"item {item.id!r}: a choice item's label is the index of one of its scores"
        accuracy = sum(item.correct for item in entry.items) / len(entry.items)
        if entry.accuracy != accuracy:
            return f"says accuracy {entry.accuracy!r}, but its items' is {accuracy!r}"
        return None

    def entry_texts(self, entry: EvalEntry) -> Iterable[tuple[str, str]]:
        return _texts(entry.prompt, entry.items)

    def entry_keys(self, entry: EvalEntry) -> int | None:
        # kind, batch_shape, fingerprint, prompt, prompt_token_ids, accuracy, items; the optional
        # fields where they hold other than their default; each item's 7 keys, its scores and label
        return (_ENTRY_KEYS + bool(entry.generation_config) + (entry.prompt_form != "text")
                + sum(_ITEM_KEYS + bool(item.scores) + (item.label is not None) for item in entry.items))

    def stored_texts(self, record: Evaluation) -> Iterable[tuple[str, str]]:
        return _texts(record.prompt, record.items)

    def compare(self, expected: Evaluation, actual: Evaluation, *, tie_margin: float | None) -> Comparison:
        return compare_evaluations(expected, actual, tie_margin=tie_margin)

    def sampling(self, record: Evaluation) -> dict[str, Any]:
        return {}

    def decoded_text(self, record: Evaluation) -> str | None:
        return None

    def text(self, record: Evaluation) -> str:
        return f"accuracy {100 * record.accuracy:.2f} % over {len(record.items)} item(s)"

    def report_steps(self, record: Evaluation) -> list[tuple[str, int, float, float | None]]:
        return [(f"{item.id}: {item.choice!r}{'' if item.correct else ' (wrong)'}", token,
                 item.margin if math.isfinite(item.margin) else 0.0, None)
                for item, token in zip(record.items, record.token_ids, strict=True)]

    def show_lines(self, key: str, variant: str, record: Evaluation) -> list[str]:
        lines = [f"{key} [{variant}]  eval: {self.text(record)}"]
        lines += [f"  {printable(item.id)!s:<20} {'right' if item.correct else 'wrong'}  "
                  f"choice {printable(repr(item.choice))[:40]}  margin {item.margin:.4g}"
                  for item in record.items]
        return [*lines, ""]


def compare_evaluations(expected: Evaluation, actual: Evaluation, *, tie_margin: float | None) -> Comparison:
    """The worst item's verdict, with the eval's evidence (see the module's docstring)."""
    dtype = expected.fingerprint.get("dtype", "")
    margin = tie_margin if tie_margin is not None else default_tie_margin(dtype)
    changes = _input_changes(expected, actual)
    if changes:
        return Comparison(Verdict.INPUT_CHANGED, input_changes=changes)
    verdicts = [_item_verdict(before, after, margin) for before, after in zip(expected.items, actual.items,
                                                                              strict=True)]
    worst = min(verdicts, key=lambda verdict: verdict.risk)
    drift = max((abs(a - b) for before, after in zip(expected.items, actual.items, strict=True)
                 for a, b in zip(before.scores, after.scores, strict=False)), default=0.0)
    gate = eval_gate.compare_evals(eval_gate.outcomes(expected), eval_gate.outcomes(actual),
                                   tie_margin=margin)
    # the headline's item: the first with the verdict the check has (None: every item identical)
    first = next((index for index, verdict in enumerate(verdicts) if verdict is worst), None) \
        if worst is not Verdict.IDENTICAL else None
    pairs = zip(expected.items, actual.items, verdicts, strict=True)
    changed: list[Changed] = [(before, after, verdict) for before, after, verdict in pairs
                              if verdict in (Verdict.TIE_FLIP, Verdict.REGRESSION)]
    return Comparison(worst, first_hash_step=first, steps_compared=len(verdicts), total_steps=len(verdicts),
                      max_logprob_delta=drift, tie_margin=margin, finding=_finding(gate, changed),
                      lines=tuple(_evidence(gate, changed, actual, margin)), gate=gate.gate.value)


def _input_changes(expected: Evaluation, actual: Evaluation) -> tuple[tuple[str, Any, Any], ...]:
    found: list[tuple[str, Any, Any]] = []
    if dict(expected.settings) != dict(actual.settings):
        found.append(("settings", dict(expected.settings), dict(actual.settings)))
    ids = [item.id for item in expected.items], [item.id for item in actual.items]
    if ids[0] != ids[1]:
        found.append(("items", _listed(ids[0]), _listed(ids[1])))
        return tuple(found)
    inputs = [before.id for before, after in zip(expected.items, actual.items, strict=True)
              if before.input != after.input or before.form != after.form
              or len(before.scores) != len(after.scores)]
    if inputs:
        found.append(("items' prompts or choices", f"{len(expected.items)} item(s) as recorded",
                      f"changed: {_listed(inputs)}"))
    return tuple(found)


def _item_verdict(before: EvalItem, after: EvalItem, margin: float) -> Verdict:
    if None not in (before.label, after.label) and before.label != after.label:
        return Verdict.REGRESSION  # the answer key changed: what the item is judged against
    if before.choice != after.choice or before.correct != after.correct:
        flipped = before.choice != after.choice and near_tie(before.margin, margin, 0.0)
        return Verdict.TIE_FLIP if flipped else Verdict.REGRESSION
    return Verdict.IDENTICAL if before.numbers == after.numbers else Verdict.LOGIT_DRIFT


def _finding(gate: eval_gate.EvalComparison, changed: list[Changed]) -> str:
    before, after = (100 * value for value in gate.accuracy)
    if not changed:
        return f"every item's decision is the same (accuracy {before:.2f} %)"
    return (f"accuracy {before:.2f} % -> {after:.2f} %: {gate.right_to_wrong} right->wrong, "
            f"{gate.wrong_to_right} wrong->right, {len(changed)} decision(s) changed; gate {gate.gate.value}")


def _evidence(gate: eval_gate.EvalComparison, changed: list[Changed],
              actual: Evaluation, margin: float) -> Iterable[str]:
    if changed:
        yield (f"exact McNemar p = {gate.p_value:.3g}, churn {100 * gate.churn:.1f} %, minimum detectable "
               f"effect {100 * gate.mde:.2f} points at {gate.items} items: {gate.reason}")
        if gate.items_needed is not None:
            yield f"resolving a change of this size takes about {gate.items_needed:,} items"
        yield "changed items (the confident first):"
    ordered = sorted(changed, key=lambda entry: (entry[2].risk, -entry[0].margin))
    for before, after, verdict in ordered[:_ITEMS_SHOWN]:
        moved = (f"{'right' if before.correct else 'wrong'} -> {'right' if after.correct else 'wrong'}"
                 if before.correct != after.correct else f"still {'right' if after.correct else 'wrong'}")
        if None not in (before.label, after.label) and before.label != after.label:
            moved += f"; its label changed: {_short(before.label)} -> {_short(after.label)}"
        tie = "a near tie" if near_tie(before.margin, margin, 0.0) else "not a near tie"
        yield (f"  {printable(before.id)}: {verdict.value}, choice {_short(before.choice)} -> "
               f"{_short(after.choice)} ({moved}); margin {before.margin:.4g} in the golden ({tie}), "
               f"{after.margin:.4g} now")
    if len(changed) > _ITEMS_SHOWN:
        yield f"  ... and {len(changed) - _ITEMS_SHOWN} more (the report lists every item)"
    yield (f"forecast: {len(actual.near_ties(margin))} of {len(actual.items)} item(s) sit within the tie "
           f"margin {margin:g} now: a numeric change can flip those")


def _short(choice: int | str | None) -> str:
    if choice is None or isinstance(choice, int):
        return str(choice)
    return repr(choice[:30] + ("…" if len(choice) > 30 else ""))


def _listed(ids: list[str], shown: int = 5) -> str:
    return ", ".join(ids[:shown]) + (f", and {len(ids) - shown} more" if len(ids) > shown else "")


def _texts(prompt: str, items: Sequence[ItemEntry | EvalItem]) -> list[tuple[str, str]]:
    """The texts a golden of these items holds: the prompt, and each item's id, generated answer and
    expected answer."""
    texts = [("its prompt", prompt)]
    for item in items:
        texts.append(("an item's id", item.id))
        texts += [(f"item {item.id!r}'s {what}", text) for what, text in (("answer", item.choice),
                                                                         ("expected answer", item.label))
                  if isinstance(text, str)]
    return texts


EVAL = EvalKind()
