"""The text of a failing golden check: missing, mismatch (verdict, where, what changed, how
confident), nondeterministic across attempts (:func:`message` picks the one a
:class:`~pytest_llmdeterminism.reporting.records.Decision` needs), and ``assert a == b`` on two
generations. Built from data; nothing here prints or raises. A score check's own lines are
:mod:`~pytest_llmdeterminism.reporting.score_failure`'s."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.generation import TEXT_ONLY_IDS, TopK
from pytest_llmdeterminism.goldens import kinds
from pytest_llmdeterminism.judge.compare import (
    Comparison,
    Recorded,
    Verdict,
    id_window,
    near_tie,
    within_drift,
)
from pytest_llmdeterminism.judge.tolerance import DEFAULT_ATOL, Profile, ProfileName
from pytest_llmdeterminism.reporting import hints
from pytest_llmdeterminism.reporting.hints import accept_command, across, budget_note, wider_tolerance
from pytest_llmdeterminism.reporting.score_failure import score_headline, score_lines
from pytest_llmdeterminism.reporting.text import (
    Decode,
    delta,
    differing_window,
    first_difference,
    form_label,
    hashes_text,
    short,
    tie_text,
    token_text,
)
from pytest_llmdeterminism.sampling import default_change_note, settings_text

if TYPE_CHECKING:
    from pytest_llmdeterminism.judge.decision import Change, Decision, Outcome

CONTEXT_TOKENS = 4


def message(decision: Decision, key: str, *, location: str, nodeid: str, attempt: int,
            tokenizer: Any = None) -> str:
    """The failure text of a check that ``decision`` failed: golden ``key`` at ``location``, this
    test's ``attempt``; ``nodeid``: the test id and the run's options, shell-quoted; ``tokenizer``
    decodes top-k ids that neither side generated."""
    comparison, expected, actual = decision.comparison, decision.expected, decision.actual
    if expected is None:
        return missing(key, location, nodeid, decision.others)
    if decision.contradiction is not None:
        return hints.contradiction(key, location, nodeid, decision.contradiction, comparison.verdict)
    decode = decoder_for(expected, actual, tokenizer)
    if decision.earlier is not None and decision.between is not None:
        return nondeterministic(key, location, nodeid, decision.between, expected, actual, decode,
                                attempts=(decision.earlier.number, attempt),
                                earlier_outcome=decision.earlier.outcome)
    assert decision.profile is not None  # a check judged against a golden
    note = across(decision)
    wider = wider_tolerance(comparison, dtype=decision.dtype) if decision.environment else ""
    return mismatch(key, location, nodeid, comparison, expected, actual, decode, profile=decision.profile,
                    dtype=decision.dtype, across=f"{note}; {wider}" if wider else note,
                    changed=decision.changed)


def missing(key: str, location: str, nodeid: str, other_variants: Sequence[str] = ()) -> str:
    others = (f" (this test has goldens for {', '.join(map(repr, other_variants))}; compare with one of "
              "them via --llm-golden-fallback)") if other_variants else ""
    return (
        f"no golden recorded for {key!r} in {location}{others}.\n"
        f"Record it with: {accept_command(nodeid)}"
    )


def mismatch(key: str, location: str, nodeid: str | None, comparison: Comparison,
             expected: Recorded, actual: Recorded, decode: Decode, *, profile: Profile | str,
             dtype: str = "float32", across: str = "", changed: Sequence[Change] | None = None) -> str:
    """A failure message of bounded length: verdict, where and how confident, what changed, the fix.
    ``profile``: the tolerance that failed it (with ``dtype``, the thresholds it applied, so the
    headline names the condition that failed), or its description alone; ``changed``: the
    fingerprint fields that differ, where the caller knows them."""
    failed = _failed_condition(comparison, profile, dtype) if isinstance(profile, Profile) else ""
    shown = profile.describe(dtype) if isinstance(profile, Profile) else profile
    headline = _headline(comparison, decode, failed, noun=kinds.of(expected).step_noun)
    lines = [f"golden mismatch in {key!r}: {headline} — fails under {shown!r}"]
    if across:
        lines.append(f"  {across}")
    sampling = kinds.of(actual).sampling(actual)
    if sampling and comparison.verdict is not Verdict.INPUT_CHANGED:
        lines.append(f"  {settings_text(sampling)}")
    if comparison.verdict is Verdict.INPUT_CHANGED:
        lines.append("  the input changed, so outputs were not compared (recorded -> now):")
        for field, old, new in comparison.input_changes:
            lines += _input_change(field, old, new, expected, actual)
        if all(field != "prompt_token_ids" for field, _, _ in comparison.input_changes):
            label = "prompt" + form_label(expected.prompt_form, actual.prompt_form)
            lines.append(f"    {label}: unchanged, {short(expected.prompt, 80)} "
                         f"({len(expected.prompt_token_ids)} ids, the same)")
    elif comparison.score is not None:
        lines += score_lines(comparison, decode)
    elif comparison.divergence is not None:
        d = comparison.divergence
        lines.append(f"  context:  {_context(actual, d.step, decode)}")
        lines.append(f"  expected: {_continuation(expected, d.step, decode)}")
        lines.append(f"  got:      {_continuation(actual, d.step, decode)}")
        lines.append(f"  expected top-{len(d.expected_top)} at step {d.step}: {_top(d.expected_top, decode)}")
        lines.append(f"  got      top-{len(d.actual_top)} at step {d.step}: {_top(d.actual_top, decode)}")
        lines.append(_drift_line(comparison))
    elif comparison.verdict is Verdict.LOGIT_DRIFT and not comparison.lines:
        text = kinds.of(expected).text(expected)
        lines.append(f"  all {comparison.steps_compared} tokens match: {short(text, 80)}")
    lines += [f"  {line}" for line in comparison.lines]
    budget = budget_note(comparison)
    if budget:
        lines.append(f"  {budget}")
    lines += _fingerprint_changes(expected, actual, changed)
    lines.append(f"  golden: {location}")
    if nodeid is not None:
        lines.append(f"Accept with: {accept_command(nodeid)}")
    return "\n".join(lines)


def nondeterministic(key: str, location: str, nodeid: str, between: Comparison, before: Recorded,
                     after: Recorded, decode: Decode, *, attempts: tuple[int, int],
                     earlier_outcome: Outcome) -> str:
    """Two attempts of one test in one process (a rerun) generated different outputs for ``key``."""
    first, now = attempts
    lines = [(f"golden check {key!r} is NONDETERMINISTIC: attempt {now} of this test generated other output "
              f"than attempt {first} in the same process ({_how_attempts_differ(between, decode)}); "
              "a rerun never passes a golden check"),
             f"  attempt {first}'s check was {earlier_outcome}; the same input must give the same output "
             "every time"]
    if between.verdict is Verdict.INPUT_CHANGED:
        for field, old, new in between.input_changes:
            lines += _input_change(field, old, new, before, after)
    elif between.score is not None:
        lines += score_lines(between, decode)
    elif between.divergence is not None:
        step = between.divergence.step
        lines.append(f"  context:    {_context(after, step, decode)}")
        lines.append(f"  attempt {first}: {_continuation(before, step, decode)}")
        lines.append(f"  attempt {now}: {_continuation(after, step, decode)}")
    lines.append(f"  golden: {location}")
    lines.append(f"Find what varies with: pytest {nodeid} --llm-audit")
    return "\n".join(lines)


def _how_attempts_differ(between: Comparison, decode: Decode) -> str:
    if between.verdict is Verdict.INPUT_CHANGED:
        return "its input changed: " + ", ".join(field for field, _, _ in between.input_changes)
    d = between.divergence
    if d is not None:
        return (f"tokens differ from step {d.step}: {token_text(d.expected_token, decode)}, "
                f"then {token_text(d.actual_token, decode)}")
    if between.score is not None:
        return f"the same continuation scored differently from position {between.first_hash_step}"
    return f"same tokens, logits differ from step {between.first_hash_step}"


def _failed_condition(comparison: Comparison, profile: Profile, dtype: str) -> str:
    """The condition of ``profile`` that a verdict it may pass failed, with both numbers; "" where
    the verdict alone fails the profile (a REGRESSION, anything under ``exact``)."""
    verdict = comparison.verdict
    if not verdict.tolerable or profile.name is ProfileName.EXACT:
        return ""
    flipped = verdict is not Verdict.LOGIT_DRIFT
    if profile.name is ProfileName.TOKENS:
        return "a changed token fails 'tokens'" if flipped else ""
    atol = profile.atol if profile.atol is not None else DEFAULT_ATOL.get(dtype, DEFAULT_ATOL["float32"])
    drift = comparison.max_logprob_delta
    if drift > atol:
        measured = ("max |Δlogprob|" if comparison.score is not None else
                    "drift before the flip" if flipped else "max |Δlogprob| in top-k")
        return f"{measured} {delta(drift)} > atol {atol:g}"
    return "a changed token fails 'close'" if flipped and profile.name is ProfileName.CLOSE else ""


def _headline(comparison: Comparison, decode: Decode, failed: str = "", *, noun: str = "step") -> str:
    """Verdict, step, tokens and margins; ``failed`` (the tolerance's condition that failed) first
    where there is one, the margin that would have passed after it. ``noun``: what the record's kind
    calls a step (a kind's own verdict names it: "at item 7")."""
    verdict = comparison.verdict.value
    d = comparison.divergence
    if comparison.verdict is Verdict.INPUT_CHANGED:
        return f"{verdict} — " + ", ".join(field for field, _, _ in comparison.input_changes)
    if comparison.score is not None:
        return score_headline(comparison, decode, failed)
    if comparison.verdict is Verdict.IDENTICAL:  # shown where nothing failed (llm-golden review)
        return f"{verdict} — same tokens, same logits"
    if comparison.verdict is Verdict.LOGIT_DRIFT and comparison.hash_definitions is not None:
        return (f"{verdict} — same tokens; the step hashes are not comparable "
                f"(golden {hashes_text(comparison, 0)}, this run {hashes_text(comparison, 1)}); "
                + (failed or f"max |Δlogprob| in top-k {delta(comparison.max_logprob_delta)}"))
    if comparison.verdict is Verdict.LOGIT_DRIFT:
        return (f"{verdict} at step {comparison.first_hash_step} — same tokens, logits differ"
                + (f"; {failed}" if failed else
                   f" (max |Δlogprob| in top-k {delta(comparison.max_logprob_delta)})"))
    if d is None:  # a verdict whose rule names no token that changed: what the rule found
        where = f" at {noun} {comparison.first_hash_step}" if comparison.first_hash_step is not None else ""
        found = comparison.finding or "no token changed"
        return f"{verdict}{where} — {found}" + (f"; {failed}" if failed else "")
    tokens = (f"{verdict} at step {d.step} — expected {token_text(d.expected_token, decode)}, "
              f"got {token_text(d.actual_token, decode)}")
    drift = comparison.max_logprob_delta  # measured before the divergence
    if d.draw_margin is not None and d.temperature is not None:
        bound = comparison.tie_margin / d.temperature
        against = f"bound {bound:.3g} (tie margin {comparison.tie_margin:g} / T {d.temperature:g})"
        if within_drift(d.draw_margin, bound, drift / d.temperature):
            near = (f"draw margin {d.draw_margin:.3g} >= {against}, within this run's drift "
                    f"({drift:.3g} / T = {drift / d.temperature:.3g}): a near tie of the draw")
        elif d.draw_margin < bound:
            near = f"draw margin {d.draw_margin:.3g} < {against}: a near tie of the draw"
        else:
            near = f"draw margin {d.draw_margin:.3g} >= {against}: not a near tie of the draw"
        return f"{tokens} (sampled); " + (f"{failed} ({near}, which alone would pass)" if failed else near)
    confidence = tie_text(d.golden_margin, comparison.tie_margin, drift)
    if comparison.verdict is Verdict.REGRESSION and near_tie(d.golden_margin, comparison.tie_margin, drift):
        confidence = confidence.removesuffix(": near tie") + ", but the new token was not in its top-k"
    return f"{tokens}; " + (f"{failed} ({confidence}, which alone would pass)" if failed else confidence)


def _drift_line(comparison: Comparison) -> str:
    matched = comparison.steps_compared
    total = max(comparison.total_steps, 1)
    if matched == 0:  # nothing came before the divergence to say anything of
        return f"  diverged at the first step: 0/{comparison.total_steps} tokens matched"
    if comparison.hash_definitions is not None:
        return (f"  before the divergence: {matched}/{comparison.total_steps} tokens matched "
                f"({matched / total:.0%}); max |Δlogprob| in top-k {delta(comparison.max_logprob_delta)} "
                f"(golden {hashes_text(comparison, 0)}, this run {hashes_text(comparison, 1)}: "
                "not comparable)")
    drift = ("logits identical before it" if comparison.first_hash_step is None
             or comparison.first_hash_step >= matched else
             f"logits differed from step {comparison.first_hash_step}, "
             f"max |Δlogprob| in top-k {delta(comparison.max_logprob_delta)}")
    return f"  before the divergence: {matched}/{comparison.total_steps} tokens matched " \
           f"({matched / total:.0%}); {drift}"


def _input_change(field: str, old: Any, new: Any, expected: Recorded, actual: Recorded) -> list[str]:
    if field == "kind":
        return [(f"    kind: {old} -> {new} (the golden holds a {old}, this check gave a {new}: give the "
                 f"{new} check its own name, golden_tokens.check(..., name=...), or re-record the golden "
                 "with --llm-golden-update)")]
    if field == "continuation":
        first = first_difference(old, new)
        texts = [kinds.of(gen).text(gen) for gen in (expected, actual)]  # the given continuations
        return [f"    continuation: {short(texts[0], 60)} -> {short(texts[1], 60)}",
                (f"    continuation token ids differ from position {first} ({len(old)} -> {len(new)} ids): "
                 f"{_id_window(old, first)} -> {_id_window(new, first)}")]
    if field == "batch_shape" and str(old).startswith("1x") and new == f"1x{len(actual.prompt_token_ids)}":
        return [(f"    {field}: {short(old)} -> {short(new)} (at B = 1 a prompt now runs alone at its own "
                "length, unpadded, as a plain generate() does; a golden recorded padded is re-recorded "
                "once)")]
    if field == "batch_shape":
        kernels = [gen.fingerprint.get("batch_invariant") for gen in (expected, actual)]
        if kernels[1] and not kernels[0]:
            return [(f"    {field}: {short(old)} -> {short(new)} (the golden was computed on the previous, "
                     "shape-dependent kernels, so its shape is part of it; re-record it once with "
                     "--llm-golden-update on the batch-invariant kernels, now the default, and the shape is "
                     "informational from then on; or keep the previous kernels with "
                     "llm_batch_invariant = false)")]
        if any(kernels):
            return [(f"    {field}: {short(old)} -> {short(new)} (the shape is informational only where the "
                     f"golden and the run both ran batch-invariant kernels: golden {_kernels(kernels[0])}, "
                     f"this run {_kernels(kernels[1])}; llm_batch_invariant = true on both sides, or record "
                     "again under this setting)")]
    if field != "prompt_token_ids":
        why = default_change_note(field, old, new)
        return [f"    {field}: {short(old)} -> {short(new)}" + (f" ({why})" if why else "")]
    first = first_difference(old, new)
    return [*_prompt_lines(expected, actual),
            (f"    prompt_token_ids differ from position {first} ({len(old)} -> {len(new)} ids): "
             f"{_id_window(old, first)} -> {_id_window(new, first)}")]


def _kernels(generation: Any) -> str:
    return f"batch-invariant ({generation})" if generation else "shape-dependent"


def _prompt_lines(expected: Recorded, actual: Recorded) -> list[str]:
    """Both sides' prompt as the model saw it (a chat conversation rendered with its template)."""
    label = "prompt" + form_label(expected.prompt_form, actual.prompt_form)
    if expected.prompt == actual.prompt:
        return [(f"    {label}: unchanged, {short(expected.prompt, 80)}; the same text now tokenises "
                 "differently (a changed tokenizer or its settings)")]
    old_text, new_text = differing_window(expected.prompt, actual.prompt)
    return [f"    {label}: {old_text} -> {new_text}"]


def _id_window(ids: Sequence[int], first: int) -> str:
    start, end = id_window(len(ids), first)
    shown = ", ".join(map(str, ids[start:end]))
    return f"[{'…, ' if start else ''}{shown}{', …' if len(ids) > end else ''}]"


def decoder_for(expected: Recorded, actual: Recorded, tokenizer: Any = None) -> Decode:
    """Token id -> text. Generated tokens use the pieces recorded with them (the golden's own
    text wins), other ids the current ``tokenizer`` when given, else ``<id N>``."""
    known = {t: p for gen in (actual, expected) for t, p in zip(gen.token_ids, gen.pieces, strict=False)}

    def decode(token: int) -> str:
        if token in known:
            return known[token]
        if token >= TEXT_ONLY_IDS:
            return "<a served token with no id>"
        return str(tokenizer.decode([token])) if tokenizer is not None else f"<id {token}>"

    return decode


def assertrepr(actual: Recorded, expected: Recorded) -> list[str]:
    """Lines for ``assert actual == expected`` on two Generations (or two Scores), as golden checks
    show them."""
    from pytest_llmdeterminism.judge.compare import compare

    kind = type(actual).__name__
    comparison = compare(expected, actual)
    if comparison.verdict is Verdict.IDENTICAL:
        return [(f"{kind}s differ only in fields outside tokens, logits and inputs "
                 "(e.g. decoded text or pieces)")]
    text = mismatch("left == right", "(right side)", None, comparison, expected, actual,
                    decoder_for(expected, actual), profile="exact")
    return [f"{kind} == {kind}: " + text.split(": ", 1)[1].splitlines()[0],
            *text.splitlines()[1:]]


def _context(gen: Recorded, step: int, decode: Decode) -> str:
    start = max(0, step - CONTEXT_TOKENS)
    before = [f"{decode(t)!r}" for t in gen.token_ids[start:step]]
    return ("… " if start else "") + " ".join(before or ["(start of output)"])


def _continuation(gen: Recorded, step: int, decode: Decode) -> str:
    shown = gen.token_ids[step:step + CONTEXT_TOKENS]
    text = " ".join(f"{decode(t)!r}({t})" for t in shown) or "(end of output)"
    more = " …" if len(gen.token_ids) > step + CONTEXT_TOKENS else ""
    return f"[step {step}] {text}{more}   full text: {short(kinds.of(gen).text(gen), 80)}"


def _top(top: TopK, decode: Decode) -> str:
    return ", ".join(f"{decode(t)!r} {lp:.3f}" for t, lp in top) or "(none: output had ended)"


def _fingerprint_changes(expected: Recorded, actual: Recorded,
                         changes: Sequence[Change] | None = None) -> list[str]:
    if changes is None:
        from pytest_llmdeterminism.judge.fingerprint import diff

        changes = diff(expected.fingerprint, actual.fingerprint)
    if not changes:
        return ["  environment: the same on both sides"]
    return ["  environment changed (expected -> got):"] + [
        f"    {field}: {short(old)} -> {short(new)}" for field, old, new in changes
    ]


