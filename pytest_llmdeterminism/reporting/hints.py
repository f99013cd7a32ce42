"""Hints that go with a golden check's result: the command that accepts it, what a comparison
across environments means and how to fix it, a tolerance that would pass a drift, and what a
changed ``max_new_tokens`` left unjudged. Built from data; nothing here prints or raises."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pytest_llmdeterminism.compare import Comparison, Verdict
from pytest_llmdeterminism.errors import pasteable
from pytest_llmdeterminism.reporting.text import delta


def accept_command(rerun: str) -> str:
    """``rerun`` is the test id and the run's own ``--llm-*`` options, shell-quoted."""
    # The flag goes last: it takes an optional value and would swallow a path placed after it.
    return f"pytest {rerun} --llm-golden-update"


# Fields whose change makes the golden another variant (its key says device class and dtype, and
# the engine when not transformers): such a golden is compared only under --llm-golden-fallback.
_VARIANT_FIELDS = ("dtype", "device_class", "engine")
# Library versions: an upgrade is a change to accept (or not), not a property of the machine.
_VERSION_FIELDS = ("torch", "transformers", "cuda", "cudnn", "cuda_driver", "engine_version",
                   "server_version")


def across_environments(changes: Sequence[tuple[str, Any, Any]], *, tolerance: str, explicit: bool,
                        run_variant: str) -> str:
    """The line that says a golden was compared across environments, which profile judged it, and
    the fix that fits the fields that changed: another dtype or device is another variant to
    record; a library upgrade is accepted by re-recording; another machine can be re-recorded to
    compare exactly."""
    from pytest_llmdeterminism.engines.fingerprint import describe_changes

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
    if explicit:
        return line
    profiles = {name: (old, new) for name, old, new in changes}.get("cpu_numerics")
    if profiles is not None and set(profiles) == {"portable", "compatible"} \
            and set(names) <= {"cpu_numerics", "cpu_capability"}:
        return (f"{line}; the golden ran CPU numerics {profiles[0]!r} (goldens recorded as 'portable' before "
                "it moved to AVX2 kernels ran what 'compatible' pins now): compare exactly again with "
                f"{pasteable('llm_cpu_numerics', profiles[0])}, or re-record with --llm-golden-update "
                "--llm-tolerance=exact")
    kernels = {name: (old, new) for name, old, new in changes}.get("batch_invariant")
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
    if comparison.verdict not in (Verdict.LOGIT_DRIFT, Verdict.TIE_FLIP, Verdict.SAMPLE_FLIP) \
            or not 0 < drift < math.inf:
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


