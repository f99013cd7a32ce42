"""A verdict added for one test, with its rule: adding a verdict is one member of ``Verdict`` (its
facts given as the enum's own members give theirs) and the rule that returns it, here in a kind.

``OPTIONS_REORDERED``: a choice (tests/helpers/choice_kind.py) whose chosen option is the golden's
but whose other options now rank in another order. Its risk sits between NONDETERMINISTIC and
INPUT_CHANGED; it is no flip and not tolerable, so every tool must ask a reviewer about it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

from pytest_llmdeterminism.goldens import kinds
from pytest_llmdeterminism.judge.compare import Comparison
from pytest_llmdeterminism.judge.verdict import Verdict
from tests.helpers.choice_kind import Choice, ChoiceKind

NAME = "OPTIONS_REORDERED"
RISK = 1.5


def add(name: str, risk: float, *facts: str) -> Verdict:
    """A new member of ``Verdict``, made by the enum's own constructor (so its facts are read as the
    declared members' are), in every table the enum looks members up in."""
    new_member = getattr(Verdict, "_new_member_", None) or Verdict.__new_member__  # type: ignore[attr-defined]
    member: Verdict = new_member(Verdict, name, risk, *facts)
    member._name_ = name
    member.__objclass__ = Verdict  # type: ignore[misc]
    member._sort_order_ = len(Verdict._member_names_)  # type: ignore[attr-defined]
    Verdict._member_map_[name] = member
    Verdict._value2member_map_[name] = member
    Verdict._member_names_.append(name)  # type: ignore[attr-defined]
    _forget_decoders()
    return member


def remove(name: str) -> None:
    Verdict._member_names_.remove(name)  # type: ignore[attr-defined]
    del Verdict._member_map_[name], Verdict._value2member_map_[name]
    _forget_decoders()


def _forget_decoders() -> None:
    """msgspec keeps an enum's values on the class once it decoded one (records under xdist): a
    member added or removed afterwards must be read again."""
    if "__msgspec_cache__" in vars(Verdict):
        delattr(Verdict, "__msgspec_cache__")


class ReorderingChoiceKind(ChoiceKind):
    """The choice kind with one more rule: the same choice, its other options reordered."""

    def compare(self, expected: Choice, actual: Choice, *, tie_margin: float | None) -> Comparison:
        found = super().compare(expected, actual, tie_margin=tie_margin)
        order = [[index for index, _ in choice.ranked] for choice in (expected, actual)]
        if found.divergence is None and not found.input_changes and order[0] != order[1]:
            before, after = (" > ".join(choice.options[i] for i in ranks)
                             for choice, ranks in zip((expected, actual), order, strict=True))
            return dataclasses.replace(found, verdict=Verdict(NAME),
                                       finding=f"the same choice, the options ranked {before} -> {after}")
        return found


REORDERING = ReorderingChoiceKind()


def register() -> None:
    add(NAME, RISK)
    kinds.register(REORDERING)


def unregister() -> None:
    kinds.unregister(REORDERING.name)
    remove(NAME)


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """The verdict and its kind, for the llm-golden tools a test runs in its own process."""
    register()
    try:
        yield
    finally:
        unregister()
