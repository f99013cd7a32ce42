"""Which goldens a run proves unused: the one rule behind ``--llm-golden-prune``, ``llm-golden prune``
and ``llm-golden merge --prune``. Pure: it reads no file and deletes nothing.

A golden key belongs to a test of its module (``test``, ``test#2`` and ``test::name`` to ``test``).
It is unused only when the run *proves* that no test of the module needs it:

- its owning test ran to its end and passed without looking it up; or
- no collected test owns it, and the module's source no longer names the function, or the class
  or method, the key was recorded for (``TestC::test_m`` needs both ``TestC`` and ``test_m``): the
  test was deleted or renamed.

A key of a case of a parametrization that the run did not collect, while other cases of the same
function ran and passed, is a *case* (:attr:`Reading.CASE`): the list may depend on the machine, the
environment or a data file, so only ``--llm-golden-prune=cases`` treats it as unused; otherwise it
is kept and named.

Anything else is unknown, and an unknown golden is kept: a test that did not run to its end
(deselected, dropped by a conftest, skipped, failed, stopped), a parametrization that came out
empty today (pytest's ``NOTSET`` case, skipped), a function or method the source names but pytest
never collected (a ``def`` under ``if``, a collection hook that dropped it), or a module whose
source cannot be read.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

PASSED = "passed"


class Reading(enum.Enum):
    """What a run proves of a golden no check looked up."""

    UNUSED = "unused"
    CASE = "case"  # of a parametrized case the run did not collect: unused under --llm-golden-prune=cases
    KEPT = "kept"  # unknown


UNUSED, CASE, KEPT = Reading.UNUSED, Reading.CASE, Reading.KEPT


@dataclass(frozen=True)
class ModuleRun:
    """What one run knows of one test module."""

    # every test of the module pytest collected, by its key (the node id after the module) -> its
    # outcome ("passed", "skipped", "failed"), or None when it did not run to its end
    tests: Mapping[str, str | None]
    source: str | None  # the module's text as the checkout has it; None where it could not be read
    used: frozenset[str] = field(default_factory=frozenset)  # golden keys a check looked up


def owner(key: str, test_keys: Iterable[str]) -> str | None:
    """The test a golden key belongs to: ``test``, ``test#2`` and ``test::name`` belong to ``test``."""
    matches = [t for t in test_keys if key == t or key.startswith((f"{t}#", f"{t}::"))]
    return max(matches, key=len, default=None)


def defining_name(key: str) -> str:
    """The module-level name a key was recorded for: the function, or the class of a method
    (``TestC::test_m[1]#2`` -> ``TestC``)."""
    return _path(key)[0]


def _path(key: str) -> list[str]:
    """A key's names before its parameters and repeat number: ``TestC::test_m[1]#2`` -> ``[TestC,
    test_m]``; ``test_f::Paris`` -> ``[test_f, Paris]`` (a named check: which it is, the source says)."""
    return re.split(r"[\[#]", key, maxsplit=1)[0].split("::")


def defining_names(key: str, source: str) -> list[str]:
    """The names a key was recorded for, as far as the source says they are definitions: the
    module-level name, and after each class of the source the name inside it (its method or nested
    class); a name after a function is a check's ``name=``, no definition."""
    path = _path(key)
    names = path[:1]
    for name in path[1:]:
        if not re.search(rf"^[ \t]*class[ \t]+{re.escape(names[-1])}\b", source, re.MULTILINE):
            break
        names.append(name)
    return names


def reading(key: str, module: ModuleRun) -> Reading:
    """What the run proves of a golden ``key`` no check looked up (see the module's note)."""
    test = owner(key, module.tests)
    if test is not None:
        return UNUSED if module.tests[test] == PASSED else KEPT
    if module.source is None:
        return KEPT
    if not all(_named(name, module.source) for name in defining_names(key, module.source)):
        return UNUSED  # deleted or renamed
    path = _path(key)
    cases = [outcome for test, outcome in module.tests.items() if path[:len(_path(test))] == _path(test)]
    return CASE if cases and all(outcome == PASSED for outcome in cases) else KEPT


def _named(name: str, source: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", source) is not None


def unused_keys(keys: Iterable[str], module: ModuleRun, *, cases: bool = False) -> list[str]:
    """The golden keys of ``module``'s golden file that the run proves unused (see the module's
    note); with ``cases`` (``--llm-golden-prune=cases``), the cases no longer collected too."""
    proven = (UNUSED, CASE) if cases else (UNUSED,)
    return sorted(key for key in keys if key not in module.used and reading(key, module) in proven)


def uncollected_cases(keys: Iterable[str], module: ModuleRun) -> list[str]:
    """The golden keys of cases of a parametrization that the run did not collect (its other cases
    ran and passed): kept unless ``--llm-golden-prune=cases``."""
    return sorted(key for key in keys if key not in module.used and reading(key, module) == CASE)
