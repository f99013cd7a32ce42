"""The ``golden_tokens`` fixture object: one check engine for missing / record / compare / fail."""

from __future__ import annotations

import dataclasses
import inspect
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.compare import Comparison, GoldenMismatchError, Verdict
from pytest_llmdeterminism.errors import NO_VALUE, ConfigurationError
from pytest_llmdeterminism.generation import Generation
from pytest_llmdeterminism.goldens import schema
from pytest_llmdeterminism.goldens.files import fallback_variant
from pytest_llmdeterminism.goldens.fingerprint import diff
from pytest_llmdeterminism.reporting import failure, hints
from pytest_llmdeterminism.reporting.records import Written
from pytest_llmdeterminism.run.decision import Decision, decide, judge
from pytest_llmdeterminism.tolerance import Profile, parse_profile

if TYPE_CHECKING:
    from pytest_llmdeterminism.goldens.files import GoldenFiles
    from pytest_llmdeterminism.reporting.recorder import Attempt, Site, TestOutcomes
    from pytest_llmdeterminism.run.options import Options


class GoldenTokens:
    """Compares generations with the test's stored goldens, or records them when updating."""

    def __init__(self, files: GoldenFiles, outcomes: TestOutcomes, options: Options, *, nodeid: str,
                 test_path: Path, tokenizer: Callable[[], Any], rerun: str | None = None,
                 tolerance: Profile | None = None) -> None:
        self._files = files
        self._outcomes = outcomes
        self._options = options
        self._target = rerun or shlex.quote(nodeid)
        self._nodeid = nodeid
        self._test_key = nodeid.split("::", 1)[1] if "::" in nodeid else nodeid
        self._path = files.path_for(test_path)
        self._tokenizer = tokenizer
        self._tolerance = tolerance
        self._used: set[str] = set()
        self._unnamed = 0

    @property
    def accept_command(self) -> str:
        """The command that records (or re-records) this test's goldens, with the run's options."""
        return hints.accept_command(self._target)

    def check(self, generation: Generation, name: str | None = None) -> Comparison | None:
        """Compare ``generation`` with its golden (or record it under ``--llm-golden-update``).

        Several checks in one test need distinct goldens: unnamed ones are numbered in call order
        (``test``, ``test#2``, ...), named ones are stored as ``test::name``. Returns the comparison, or
        None when a golden was recorded. A failing check does not stop the test: every check is
        judged and gets its candidate, and the test fails at its end listing each failing one.
        """
        __tracebackhide__ = True
        if not isinstance(generation, Generation):
            raise TypeError(f"golden_tokens.check() takes a Generation from llm_model.generate(), "
                            f"got {type(generation).__name__}")
        unstorable = schema.generation_problem(generation)
        if unstorable:
            raise ConfigurationError(
                "golden_tokens.check(generation)", NO_VALUE,
                f"{unstorable}, so no golden can hold this generation: nothing was recorded or compared. "
                + ("Generate fewer tokens (llm_model.generate(..., max_new_tokens=...)) or shorten the prompt"
                   if unstorable.too_long else
                   "The engine returned it (a server's answer, say): check the engine, or test this "
                   "generation's fields with plain asserts"))
        site = _caller_site()
        key = self._key(name)
        self._outcomes.used(self._path, key)
        variants = self._files.read(self._path).get(key, {})
        variant = generation.variant
        update = self._options.update
        if variant not in variants and not update and self._options.golden_fallback:
            variant = fallback_variant(variant, variants) or variant
            if variant != generation.variant:
                self._outcomes.note(f"{key!r}: no {generation.variant!r} golden; compared with "
                                   f"{variant!r} (--llm-golden-fallback)")
        location = f"{self._files.display(self._path)} [{key!r}][{variant!r}]"
        earlier = self._outcomes.other_output(key, generation)
        if earlier is not None:  # whatever the golden says: this attempt contradicts an earlier one
            return self._nondeterministic(key, variant, location, generation, *earlier, site=site)
        stored = variants.get(variant)
        if stored is None:
            if update:
                self._outcomes.record(self._path, key, generation, written=Written.RECORDED)
                return None
            missing = Comparison(Verdict.MISSING)
            self._outcomes.checked(key, variant, missing, passed=False, actual=generation)
            self._outcomes.candidate(self._path, key, generation)
            message = failure.missing(key, location, self._target, sorted(variants))
            self._outcomes.fail(GoldenMismatchError(message, missing, key=key, path=self._path), site,
                               accept=self.accept_command)
            return missing
        expected = schema.from_entry(stored)
        explicit = self._tolerance or self._options.tolerance.explicit_for(
            str(generation.fingerprint.get("device_class", "cpu")))
        decision = decide(expected, generation, explicit=explicit, update=update, compared_variant=variant,
                          accept_command=self.accept_command)
        return self._apply(decision, key, variant, location, expected, generation, site)

    def _apply(self, decision: Decision, key: str, variant: str, location: str, expected: Generation,
               generation: Generation, site: Site | None) -> Comparison:
        """Carry out a :class:`Decision`: record or report it, and fail the test where it failed."""
        __tracebackhide__ = True
        comparison = decision.comparison
        if decision.across:
            self._outcomes.note(decision.across)
        if decision.rerecord:
            self._outcomes.record(self._path, key, generation, written=Written.UPDATED,
                                  overwrote=comparison.verdict)
            return comparison
        self._outcomes.checked(key, variant, comparison, passed=decision.passed,
                               profile=str(decision.profile),
                               changed=diff(expected.fingerprint, generation.fingerprint),
                               numerics_changed=[name for name, _, _ in decision.environment],
                               expected=expected, actual=generation)
        if decision.candidate:
            self._outcomes.candidate(self._path, key, generation)
        if decision.passed:
            if decision.budget_note:
                self._outcomes.note(f"{key!r}: {decision.budget_note}")
            return comparison
        across = decision.across
        wider = hints.wider_tolerance(comparison, dtype=decision.dtype) if decision.environment else ""
        decode = failure.decoder_for(expected, generation, self._tokenizer())
        message = failure.mismatch(key, location, self._target, comparison, expected, generation,
                                  decode, profile=decision.profile, dtype=decision.dtype,
                                  across=f"{across}; {wider}" if wider else across)
        error = GoldenMismatchError(message, comparison, key=key, path=self._path, expected=expected,
                                    actual=generation)
        self._outcomes.fail(error, site, accept=self.accept_command)
        return comparison

    def _nondeterministic(self, key: str, variant: str, location: str, generation: Generation,
                          earlier: Attempt, between: Comparison, *, site: Site | None) -> Comparison:
        """This test ran before in this process (a rerun) and generated something else for ``key``:
        NONDETERMINISTIC, and failed, even where this attempt matches the golden."""
        __tracebackhide__ = True
        comparison = dataclasses.replace(between, verdict=Verdict.NONDETERMINISTIC)
        self._outcomes.checked(key, variant, comparison, passed=False, expected=earlier.output,
                               actual=generation)
        attempts = (earlier.number, self._outcomes.attempt)
        self._outcomes.note(failure.rerun_note(key, self._nodeid, attempts))
        decode = failure.decoder_for(earlier.output, generation, self._tokenizer())
        message = failure.nondeterministic(key, location, self._target, between, earlier.output, generation,
                                          decode, attempts=attempts, earlier_outcome=earlier.outcome)
        self._outcomes.fail(GoldenMismatchError(message, comparison, key=key, path=self._path,
                                                expected=earlier.output, actual=generation), site,
                            accept=self.accept_command)
        return comparison

    def _key(self, name: str | None) -> str:
        __tracebackhide__ = True
        if name is None:
            self._unnamed += 1
            key = self._test_key if self._unnamed == 1 else f"{self._test_key}#{self._unnamed}"
        else:
            if not name or not isinstance(name, str):
                raise ConfigurationError("golden_tokens.check(name=...)", name, "expected a non-empty string")
            problem = schema.text_problem([("the name", name)])
            if problem and problem.too_long:
                raise ConfigurationError("golden_tokens.check(name=...)", NO_VALUE,
                                         f"{problem}; pass a short name")
            if problem:
                raise ConfigurationError("golden_tokens.check(name=...)", name,
                                         f"{problem}; a golden file holding it would not read back. Pass a "
                                         "name of valid text, e.g. the bytes it came from decoded with "
                                         "errors='replace'")
            key = f"{self._test_key}::{name}"
        if key in self._used:
            raise ConfigurationError(
                "golden_tokens.check(name=...)", name,
                f"golden {key!r} is checked twice in one test; give each check its own name=")
        self._used.add(key)
        return key


def _caller_site() -> Site | None:
    """The line that called ``check()``, for the test's failure to point at when it is raised at the
    end of the test; a helper that hides itself (``__tracebackhide__``) is passed for its caller."""
    caller = inspect.currentframe()  # None where Python keeps no frames: then no site
    for _ in range(2):  # past this function and check()
        caller = caller.f_back if caller is not None else None
    while caller is not None and caller.f_back is not None and caller.f_locals.get("__tracebackhide__"):
        caller = caller.f_back  # a helper that hides itself: point at the line that called it
    return None if caller is None else (caller, caller.f_lasti, caller.f_lineno)


def assert_tokens_match(actual: Generation, expected: Generation | Mapping[str, Any],
                        tolerance: str | Profile = "exact", *, tokenizer: Any = None) -> Comparison:
    """Assert that ``actual`` matches ``expected`` under a tolerance profile.

    ``expected`` is a :class:`Generation` or a stored golden entry (one variant's dict from a
    golden file). Raises :class:`GoldenMismatchError` (an ``AssertionError``) carrying the
    comparison; returns the comparison when it passes. Pass ``tokenizer`` to decode top-k tokens
    that neither side generated.
    """
    __tracebackhide__ = True
    if not isinstance(expected, Generation):
        problem = schema.entry_problem(expected)
        if problem:
            raise TypeError(f"assert_tokens_match(expected=...) takes a Generation or one golden entry "
                            f"(goldens[key][variant], e.g. goldens['test_x']['cpu/float32']): {problem}")
        expected = schema.from_entry(expected)
    profile = tolerance if isinstance(tolerance, Profile) else parse_profile(tolerance, setting="tolerance")
    comparison, passed = judge(expected, actual, profile)
    if not passed:
        decode = failure.decoder_for(expected, actual, tokenizer)
        dtype = str(actual.fingerprint.get("dtype", expected.fingerprint.get("dtype", "float32")))  # judge's
        message = failure.mismatch("assert_tokens_match", "(in memory)", None, comparison, expected, actual,
                                  decode, profile=profile, dtype=dtype)
        raise GoldenMismatchError(message, comparison)
    return comparison
