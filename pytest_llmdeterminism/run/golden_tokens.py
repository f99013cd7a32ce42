"""The ``golden_tokens`` fixture object: one check engine for missing / record / compare / fail.

``check()`` runs in one direction, each module once: look up (the golden, from ``goldens.files``),
decide (:func:`~pytest_llmdeterminism.judge.decision.decide`, pure), word (``reporting`` words the
decision), record (the test's recorder keeps it; a failing check fails the test). The earlier
attempts' outputs are taken when the object is built. ``assert_tokens_match`` is the same judgement
for two generations in memory. The path is drawn in docs/design/check-path.md.
"""

from __future__ import annotations

import dataclasses
import inspect
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import msgspec

from pytest_llmdeterminism.errors import NO_VALUE, ConfigurationError
from pytest_llmdeterminism.generation import Generation, Score
from pytest_llmdeterminism.goldens import kinds, schema
from pytest_llmdeterminism.goldens.consistency import stored_text_problem
from pytest_llmdeterminism.judge.compare import Comparison, GoldenMismatchError, Recorded, Verdict
from pytest_llmdeterminism.judge.decision import Decision, Written, decide
from pytest_llmdeterminism.judge.judgement import judge_with
from pytest_llmdeterminism.judge.tolerance import Profile, parse_profile
from pytest_llmdeterminism.reporting import failure, hints

if TYPE_CHECKING:
    from pytest_llmdeterminism.engines import ModelCache
    from pytest_llmdeterminism.goldens.files import GoldenFiles
    from pytest_llmdeterminism.reporting.recorder import Site, TestOutcomes
    from pytest_llmdeterminism.run.options import Options


class GoldenTokens:
    """Compares generations with the test's stored goldens, or records them when updating.
    ``models``: the run's model cache, asked for the tokenizer only to word a failure."""

    def __init__(self, files: GoldenFiles, outcomes: TestOutcomes, options: Options, *, nodeid: str,
                 test_path: Path, models: ModelCache, rerun: str | None = None,
                 tolerance: Profile | None = None) -> None:
        self._files = files
        self._outcomes = outcomes
        self._options = options
        self._target = rerun or shlex.quote(nodeid)
        self._nodeid = nodeid
        self._test_key = nodeid.split("::", 1)[1] if "::" in nodeid else nodeid
        self._path = files.path_for(test_path)
        self._shown_path = files.display(self._path)  # as a failure names it
        self._models = models
        self._tolerance = tolerance
        # Fixed for this attempt of the test (pytest-rerunfailures builds the fixture again for the next).
        self._attempt, self._earlier = outcomes.attempt, outcomes.earlier_attempts()
        self._used: set[str] = set()
        self._unnamed = 0

    @property
    def accept_command(self) -> str:
        """The command that records (or re-records) this test's goldens, with the run's options."""
        return hints.accept_command(self._target)

    def check(self, generation: Generation | Score, name: str | None = None) -> Comparison | None:
        """Compare ``generation`` with its golden (or record it under ``--llm-golden-update``); a
        :class:`~pytest_llmdeterminism.generation.Score` from ``llm_model.score()`` is recorded and
        checked the same way, position by position (a score golden: ``"kind": "score"``).

        Several checks in one test need distinct goldens: unnamed ones are numbered in call order
        (``test``, ``test#2``, ...), named ones are stored as ``test::name``. Returns the comparison, or
        None when a golden was recorded. A failing check does not stop the test: every check is
        judged and gets its candidate, and the test fails at the end of the phase that checked (its
        body; a fixture's setup or teardown, or a finalizer: an error in setup or teardown) listing
        each failing one. A check runs, is recorded and counts as used in any phase of the test.
        """
        __tracebackhide__ = True
        self._refuse_outside_the_test()
        if not kinds.is_record(generation):
            raise TypeError(f"golden_tokens.check() takes a Generation from llm_model.generate() or a Score "
                            f"from llm_model.score(), got {type(generation).__name__}")
        unstorable = schema.generation_problem(generation)
        if unstorable:
            raise ConfigurationError(
                "golden_tokens.check(generation)", NO_VALUE,
                f"{unstorable}, so no golden can hold this {type(generation).__name__.lower()}: nothing "
                "was recorded or compared. "
                + (kinds.of(generation).shorten + " or shorten the prompt" if unstorable.too_long else
                   "The engine returned it (a server's answer, say): check the engine, or test this "
                   "generation's fields with plain asserts"))
        site = _caller_site()
        key = self._key(name)
        try:
            decision = self._decide(key, generation)  # look up, then decide
            accept = self.accept_command
            notes = hints.notes(decision, key, nodeid=self._nodeid, attempt=self._attempt,
                                accept=accept)
        except BaseException:
            self._outcomes.used(self._path, key)  # stopped before its record: its key was still looked up
            raise
        return self._record(decision, key, notes, site, accept)  # word its failure, record (and report it)

    def _refuse_outside_the_test(self) -> None:
        """A check belongs to the test whose ``golden_tokens`` it uses: outside that test's setup, call
        and teardown (a fixture object kept for later) no report would carry it, so it is refused."""
        __tracebackhide__ = True
        if self._outcomes.phase is None or self._outcomes.attempt != self._attempt:
            raise ConfigurationError(
                "golden_tokens.check()", NO_VALUE,
                f"called after {self._nodeid} ended (or between its setup, call and teardown): its "
                "golden_tokens records checks for that test alone, and no report of it would carry this "
                "one, so nothing was recorded or compared. Check in the test itself, in a fixture it uses "
                "(before or after the fixture's yield) or in a finalizer it adds (request.addfinalizer)")

    def _decide(self, key: str, generation: Recorded) -> Decision:
        """Look up what the decision needs (the key's golden, the profile the test or the run set);
        decide."""
        update = self._options.update
        found = self._files.look_up(self._path, key, generation.variant,
                                    fallback=not update and self._options.golden_fallback)
        explicit = self._tolerance or self._options.tolerance.explicit_for(
            str(generation.fingerprint.get("device_class", "cpu")))
        decision = decide(generation, golden=found.golden, variant=found.variant, explicit=explicit,
                          update=update, earlier=self._earlier.get(key, ()), others=found.variants)
        contradiction = None if found.golden is None or decision.expected is not found.golden else \
            stored_text_problem(found.golden, generation)
        if contradiction is None:
            return decision
        # The golden does not describe its own ids: the check fails (an update re-records it).
        # Its ids and logits compare IDENTICAL: its verdict is what was found, FIELDS_CHANGED.
        rewrite = update == "all"
        comparison = decision.comparison
        if comparison.verdict is Verdict.IDENTICAL:
            comparison = dataclasses.replace(comparison, verdict=Verdict.FIELDS_CHANGED)
        return dataclasses.replace(decision, passed=False, contradiction=contradiction,
                                   comparison=comparison, candidate=not rewrite,
                                   write=Written.UPDATED if rewrite else decision.write)

    def _record(self, decision: Decision, key: str, notes: list[str], site: Site | None,
                accept: str) -> Comparison | None:
        """Word a failing ``decision``'s failure, then record the decision with its ``notes`` (for the
        run's summary) and that failure in one call: the failure fails the test (at the end of its
        body; ``accept`` re-records the test's goldens). The failure's words need the tokenizer,
        which loads the model where no test loaded it yet: where that raises, the decision is
        recorded without its failure, so a test whose model cannot load still reports its checks."""
        __tracebackhide__ = True
        try:
            error = self._failure(decision, key) if decision.fails else None
        except BaseException:
            self._outcomes.decided(self._path, key, decision, notes=notes)
            raise
        self._outcomes.decided(self._path, key, decision, notes=notes, failure=error, site=site,
                               accept=accept)
        return None if decision.write is Written.RECORDED else decision.comparison

    def _failure(self, decision: Decision, key: str) -> GoldenMismatchError:
        """The error a failing check raises, with the text ``reporting`` words for it."""
        location = f"{self._shown_path} [{key!r}][{decision.variant!r}]"
        # Only a failure that shows tokens needs the tokenizer (top-k ids neither side generated).
        tokenizer = None if decision.expected is None else self._models.get(self._nodeid).tokenizer
        message = failure.message(decision, key, location=location, nodeid=self._target,
                                  attempt=self._attempt, tokenizer=tokenizer)
        sides: dict[str, Any] = {} if decision.expected is None else {
            "expected": decision.expected, "actual": decision.actual}
        return GoldenMismatchError(message, decision.comparison, key=key, path=self._path, **sides)

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


def assert_tokens_match(actual: Generation | Score, expected: Generation | Score | Mapping[str, Any],
                        tolerance: str | Profile = "exact", *, tokenizer: Any = None) -> Comparison:
    """Assert that ``actual`` matches ``expected`` under a tolerance profile.

    ``expected`` is a :class:`Generation` (or a :class:`Score`, for a score) or a stored golden
    entry (one variant's dict from a golden file). Raises :class:`GoldenMismatchError` (an
    ``AssertionError``) carrying the comparison; returns the comparison when it passes. Pass
    ``tokenizer`` to decode top-k tokens that neither side generated.
    """
    __tracebackhide__ = True
    if not kinds.is_record(expected):
        try:
            expected = schema.from_entry(cast("Mapping[str, Any]", expected))  # validated once, here
        except (msgspec.ValidationError, TypeError) as error:
            problem = schema.validation_message(error) if isinstance(error, msgspec.ValidationError) \
                else error
            raise TypeError(f"assert_tokens_match(expected=...) takes a Generation or one golden entry "
                            f"(goldens[key][variant], e.g. goldens['test_x']['cpu/float32']): {problem}"
                            ) from None
    profile = tolerance if isinstance(tolerance, Profile) else parse_profile(tolerance, setting="tolerance")
    comparison, passed = judge_with(expected, actual, profile)
    if not passed:
        decode = failure.decoder_for(expected, actual, tokenizer)
        dtype = str(actual.fingerprint.get("dtype", expected.fingerprint.get("dtype", "float32")))  # judge's
        message = failure.mismatch("assert_tokens_match", "(in memory)", None, comparison, expected, actual,
                                  decode, profile=profile, dtype=dtype)
        raise GoldenMismatchError(message, comparison)
    return comparison
