"""Hints that go with a golden check's result: the run summary's notes on a
:class:`~pytest_llmdeterminism.reporting.records.Decision` (:func:`notes`), the command that accepts
it, what a comparison across environments means and how to fix it, a tolerance that would pass a
drift, and what a changed ``max_new_tokens`` left unjudged. Built from data; nothing here prints or
raises."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pytest_llmdeterminism.engines.registry import recorded_by
from pytest_llmdeterminism.errors import pasteable
from pytest_llmdeterminism.judge.compare import Comparison, Verdict
from pytest_llmdeterminism.judge.decision import Decision
from pytest_llmdeterminism.reporting.records import CheckRecord
from pytest_llmdeterminism.reporting.text import delta


def accept_command(rerun: str) -> str:
    """``rerun`` is the test id and the run's own ``--llm-*`` options, shell-quoted."""
    # The flag goes last: it takes an optional value and would swallow a path placed after it.
    return f"pytest {rerun} --llm-golden-update"


def notes(decision: Decision, key: str, *, nodeid: str, attempt: int, accept: str) -> list[str]:
    """The run summary's lines on golden ``key``'s ``decision``, at this test's ``attempt``:
    the variant it fell back to, the attempt it contradicts, the environments it was compared
    across, what a changed budget left unjudged. ``accept``: the command that re-records it."""
    lines = []
    if decision.variant != decision.actual.variant:
        lines.append(f"{key!r}: no {decision.actual.variant!r} golden; compared with {decision.variant!r} "
                     "(--llm-golden-fallback)")
    if decision.earlier is not None:
        lines.append(rerun_note(key, nodeid, (decision.earlier.number, attempt)))
        return lines
    note = across(decision)
    if note:
        lines.append(note)
    serving = serving_note(decision)
    if serving:
        lines.append(f"{key!r}: {serving}")
    budget = budget_note(decision.comparison, accept) if decision.passed and decision.write is None else ""
    if budget:
        lines.append(f"{key!r}: {budget}")
    return lines


def serving_note(decision: Decision) -> str:
    """For a failed check of a server's golden: whether the golden's serving was verified (its
    fingerprint's ``serving_verified``, recorded under ``llm_server_checks = true``), and what that
    leaves possible; "" for a check that passed or is not a server's."""
    expected = decision.expected
    if decision.passed or expected is None:
        return ""
    engine = recorded_by(expected.fingerprint)
    if engine is None or not engine.served:
        return ""
    verified = expected.fingerprint.get("serving_verified")
    if not verified:
        return ("its golden was recorded without verifying how the server serves it (concurrency, prefix "
                "cache): other requests the server batched with it may have moved it. Audit the server "
                "with --llm-audit, or record with llm_server_checks = true, which verifies it and records "
                "what it found (docs: Testing a serving stack)")
    found = "; ".join(f"{name.replace('_', ' ')}: {value}" for name, value in sorted(verified.items()))
    return f"its golden was recorded on a server verified as serving it ({found})"


def rerun_note(key: str, nodeid: str, attempts: tuple[int, int]) -> str:
    """The summary's line for a golden check whose output changed between attempts of its test."""
    return (f"NONDETERMINISTIC: {nodeid} generated other output for {key!r} on attempt {attempts[1]} than on "
            f"attempt {attempts[0]} (rerun in the same process); it fails, whatever a rerun gives")


def across(decision: Decision) -> str:
    """The "compared across environments" line of a check judged across environments, or ""."""
    if not decision.environment or decision.profile is None:
        return ""
    return across_environments(list(decision.environment), explicit=decision.explicit,
                               tolerance=decision.profile.describe(decision.dtype),
                               run_variant=decision.actual.variant)


# Fields whose change makes the golden another variant (its key says device class and dtype, and
# the engine when not transformers): such a golden is compared only under --llm-golden-fallback.
_VARIANT_FIELDS = ("dtype", "device_class", "engine")
_THREAD_FIELDS = ("torch_threads",)  # what llm_threads pins (llama.cpp's are the spec's #threads=N)
# Library versions: an upgrade is a change to accept (or not), not a property of the machine.
_VERSION_FIELDS = ("torch", "transformers", "cuda", "cudnn", "cuda_driver", "engine_version",
                   "server_version")


def across_environments(changes: Sequence[tuple[str, Any, Any]], *, tolerance: str, explicit: bool,
                        run_variant: str) -> str:
    """The line that says a golden was compared across environments, which profile judged it, and
    the fix that fits the fields that changed: another dtype or device is another variant to
    record; another thread count (pytest-xdist's share of the cores) is pinned with ``llm_threads``;
    a library upgrade is accepted by re-recording; another machine can be re-recorded to compare
    exactly."""
    from pytest_llmdeterminism.judge.fingerprint import describe_changes

    line = (f"compared across environments: {describe_changes(list(changes))}; "
            f"tolerance {tolerance} {'as set' if explicit else 'by default'}")
    names = [name for name, _, _ in changes]
    variant = [name for name in names if name in _VARIANT_FIELDS]
    versions = [name for name in names if name in _VERSION_FIELDS]
    if variant:
        return (f"{line}; the golden is another variant ({', '.join(variant)}), whose numbers differ by "
                f"design: record this run's own {run_variant!r} golden beside it by re-running with "
                "--llm-golden-update (variants coexist, and each run compares with its own unless "
                "--llm-golden-fallback is given)")
    threads = [(old, new) for name, old, new in changes if name in _THREAD_FIELDS]
    if threads and len(threads) == len(changes):
        old, new = threads[0]
        return (f"{line}; the thread count is part of the numerics: the golden ran on {old} thread(s), this "
                f"run on {new} (under pytest-xdist each worker takes its share of the cores, cores // "
                f"workers). Pin it so that serial and pytest-xdist runs compute the same bits: "
                f"{pasteable('llm_threads', str(old))}")
    if explicit:
        return line
    profiles = {name: (old, new) for name, old, new in changes}.get("cpu_numerics")
    kernels = {name: (old, new) for name, old, new in changes}.get("batch_invariant")
    # each profile's own batch-invariant kernels (their generation moves with the profile) or none
    with_kernels = {"batch_invariant"} if kernels is not None and all(kernels) else set()
    if profiles is not None and set(profiles) == {"portable", "compatible"} \
            and set(names) <= {"cpu_numerics", "cpu_capability", *with_kernels}:
        return (f"{line}; the golden ran CPU numerics {profiles[0]!r} (goldens recorded as 'portable' before "
                "it moved to AVX2 kernels ran what 'compatible' pins now): compare exactly again with "
                f"{pasteable('llm_cpu_numerics', profiles[0])}, or re-record with --llm-golden-update "
                "--llm-tolerance=exact")
    if kernels is not None and kernels[1] and not kernels[0]:  # whatever else changed with them
        return (f"{line}; the golden was computed on the previous kernels (shape-dependent), before "
                "batch-invariant kernels became the default: re-record once with --llm-golden-update "
                "--llm-tolerance=exact (it re-records every check that is not IDENTICAL; the new goldens do "
                "not depend on the batch shape), or keep the previous kernels with "
                f"{pasteable('llm_batch_invariant', 'false')}")
    # an earlier generation of the batch-invariant kernels (a change of numerics too: the profile's hint)
    if kernels is not None and kernels[0] and kernels[1] and names == ["batch_invariant"]:
        return (f"{line}; the golden was computed on an earlier generation of the batch-invariant kernels "
                "(this release computes them otherwise: decode steps now equal the prefill, bit for bit): "
                "re-record once with --llm-golden-update --llm-tolerance=exact (it re-records every check "
                "that is not IDENTICAL)")
    if kernels is not None and names == ["batch_invariant"]:
        recorded = "true" if kernels[0] else "false"
        return (f"{line}; the golden was computed {'with' if kernels[0] else 'without'} batch-invariant "
                f"kernels: compare exactly again with {pasteable('llm_batch_invariant', recorded)}, or "
                "re-record under this run's setting with --llm-golden-update --llm-tolerance=exact")
    if versions:
        return (f"{line}; after an upgrade ({', '.join(versions)}) keep the goldens and let the tolerance "
                "judge the drift, or accept the new numbers: --llm-golden-update --llm-tolerance=exact "
                "re-records every check that is not IDENTICAL")
    return f"{line}; to compare exactly again, re-record with --llm-golden-update --llm-tolerance=exact"


def wider_tolerance(comparison: Comparison, *, dtype: str) -> str:
    """For a check that failed only on the size of its logit drift: a ``near_tie`` profile that
    would pass it, with the drift rounded up; "" for any other failure."""
    drift = comparison.max_logprob_delta
    if not comparison.verdict.tolerable:
        return ""
    if not 0 < drift < math.inf:
        return ""
    atol = _round_up(drift)
    return (f"to pass {dtype} drift of this size instead (max |Δlogprob| {delta(drift)}): "
            f"--llm-tolerance='near_tie(margin={comparison.tie_margin:g}, atol={atol:g})'")


def _round_up(value: float) -> float:
    """The first of 1, 2, 5 times a power of ten at or above ``value``."""
    scale = 10.0 ** math.floor(math.log10(value))
    return next(step * scale for step in (1, 2, 5, 10) if step * scale >= value)


def budget_note(comparison: Comparison, accept: str | None = None) -> str:
    """What a changed ``max_new_tokens`` left out of the comparison, or "" when it did not change.
    ``accept``: the command that re-records the golden, named when the golden is incomplete."""
    if comparison.budgets is None:
        return ""
    old, new = comparison.budgets
    judged = comparison.total_steps - comparison.unchecked_steps
    head = f"max_new_tokens {old} -> {new}: "
    if comparison.new_steps:
        last = judged + comparison.new_steps - 1
        steps = f"step {judged} is" if comparison.new_steps == 1 else f"steps {judged}–{last} are"
        record = f": {accept}" if accept else " (--llm-golden-update)"
        return (f"{head}judged on the golden's {judged} step(s) only; {steps} new and not judged. The golden "
                f"ends where its budget did: re-record it to cover the new steps{record}")
    if comparison.unchecked_steps:
        last = comparison.total_steps - 1
        steps = f"step {judged}" if judged == last else f"steps {judged}–{last}"
        return (f"{head}judged on the first {judged} step(s); the golden's {steps} lie beyond this run's "
                "budget")
    return f"{head}the golden ended (EOS) within both budgets, so it was judged in full"




# Fingerprint fields that say the checkpoint itself changed (its weights, or a hub id's commit).
_MODEL_FIELDS = ("weights_hash", "model_commit")


def after_model_change(checks: Sequence[CheckRecord], *, candidates: str | None) -> list[str]:
    """For a run whose failing checks ran another checkpoint than their goldens: what to run instead.
    In the same environment a golden is judged ``exact``, so every drift of a new checkpoint fails;
    the lines name the tolerance that would judge the drift and the review commands. ``candidates``:
    the ``--llm-golden-artifacts`` folder, or None when the run wrote none. [] for any other run."""
    changed = [check for check in checks if not check.passed
               and any(name in check.changed_fingerprint for name in _MODEL_FIELDS)]
    if not changed:
        return []
    fields = sorted({name for check in changed for name in check.changed_fingerprint} & set(_MODEL_FIELDS))
    counts: dict[str, int] = {}
    for check in changed:
        counts[check.verdict] = counts.get(check.verdict, 0) + 1
    verdicts = ", ".join(f"{n} {verdict}" for verdict, n in sorted(counts.items()))
    folder = candidates or "llm-candidates"
    lines = [f"the model changed ({', '.join(fields)}) under {len(changed)} failing check(s) ({verdicts}): "
             "a new checkpoint in the goldens' own environment is judged 'exact', so any drift fails. "
             "After a checkpoint upgrade:"]
    tolerable = [check for check in changed if _tolerable(check.verdict)]
    drifts = [check.max_logprob_delta for check in tolerable if 0 < check.max_logprob_delta < math.inf]
    if drifts:
        margin, atol = max(check.tie_margin for check in changed) or 0.1, _round_up(max(drifts))
        lines.append(f"  to pass drift up to this run's (max |Δlogprob| {delta(max(drifts))}) but not a "
                     f"changed token: --llm-tolerance='near_tie(margin={margin:g}, atol={atol:g})'")
    write = "" if candidates else f" (rerun with --llm-golden-artifacts={folder} to write them)"
    lines.append(f"  to see what moved, case by case: llm-golden diff {folder}{write}, or llm-golden review "
                 f"{folder}")
    # --only names the verdicts this run has that a tolerance may pass: a list that takes something.
    names = sorted({check.verdict for check in tolerable}, key=Verdict.risk_of)
    if names:
        lines.append(f"  to accept only the drift and near ties: llm-golden accept {folder} --only "
                     f"{','.join(names)} (or -k KEY)")
    return lines


def contradiction(key: str, location: str, nodeid: str, problem: str, verdict: Verdict) -> str:
    """The failure of a check whose golden's text or pieces contradict its own ids (``problem``)."""
    return (f"golden {key!r} does not describe its own token ids ({verdict.value}): {problem}. A check "
            "compares ids and logits, but a golden's text and pieces are what failures, `llm-golden show` "
            "and a review print, so it fails until they agree.\n"
            f"  golden: {location}\n"
            f"Re-record it with: {accept_command(nodeid)}")


def _tolerable(name: str) -> bool:
    verdict = Verdict.named(name)
    return verdict is not None and verdict.tolerable
