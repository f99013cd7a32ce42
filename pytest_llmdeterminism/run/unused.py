"""Which goldens a run proves unused: the one rule behind ``--llm-golden-prune``, ``llm-golden prune``
and ``llm-golden merge --prune``. Pure: it reads no file and deletes nothing.

A golden key belongs to a test of its module (``test``, ``test#2`` and ``test::name`` to ``test``).
It is unused only when the run *proves* that no test of the module needs it:

- its owning test ran to its end and passed without looking it up; or
- no collected test owns it, and the module's source no longer names the function (or class) the key
  was recorded for: the test was deleted or renamed; or
- no collected test owns it, the module still names that function, and every case pytest collected
  of it ran and passed: the case was taken out of its parametrization.

Anything else is unknown, and an unknown golden is kept: a test that did not run to its end
(deselected, dropped by a conftest, skipped, failed, stopped), a parametrization that came out
empty today (pytest's ``NOTSET`` case, skipped), a function the source names but pytest never
collected (a collection hook dropped it), or a module whose source cannot be read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

PASSED = "passed"


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
    return re.split(r"[\[#]|::", key, maxsplit=1)[0]


def unused_keys(keys: Iterable[str], module: ModuleRun) -> list[str]:
    """The golden keys of ``module``'s golden file that the run proves unused (see the module's note)."""
    return sorted(key for key in keys if key not in module.used and _proven_unused(key, module))


def _proven_unused(key: str, module: ModuleRun) -> bool:
    test = owner(key, module.tests)
    if test is not None:
        return module.tests[test] == PASSED
    if module.source is None:
        return False
    name = defining_name(key)
    if not re.search(rf"(?<!\w){re.escape(name)}(?!\w)", module.source):
        return True  # deleted or renamed
    cases = [outcome for test, outcome in module.tests.items() if defining_name(test) == name]
    return bool(cases) and all(outcome == PASSED for outcome in cases)
