"""Failure text and terminal summary lines, built from data; nothing here prints or raises."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pytest_llmdeterminism.compare import Comparison, Verdict
from pytest_llmdeterminism.generation import Generation, TopK

Decode = Callable[[int], str]
CONTEXT_TOKENS = 4
_MAX_IDS_SHOWN = 12


def accept_command(rerun: str) -> str:
    """``rerun`` is the test id and the run's own ``--llm-*`` options, shell-quoted."""
    # The flag goes last: it takes an optional value and would swallow a path placed after it.
    return f"pytest {rerun} --llm-golden-update"


def shell_quote(text: str) -> str:
    return text if all(c.isalnum() or c in "/._-:=" for c in text) else "'" + text.replace("'", "'\\''") + "'"


def missing(key: str, location: str, nodeid: str, other_variants: Sequence[str] = ()) -> str:
    others = (f" (this test has goldens for {', '.join(map(repr, other_variants))}; compare with one of "
              "them via --llm-golden-fallback)") if other_variants else ""
    return (
        f"no golden recorded for {key!r} in {location}{others}.\n"
        f"Record it with: {accept_command(nodeid)}"
    )


def mismatch(key: str, location: str, nodeid: str | None, comparison: Comparison,
             expected: Generation, actual: Generation, decode: Decode, *, profile: str) -> str:
    """A failure message of bounded length: verdict, where and how confident, what changed, the fix."""
    lines = [f"golden mismatch in {key!r}: {_headline(comparison, decode)} — fails under {profile!r}"]
    if comparison.verdict is Verdict.INPUT_CHANGED:
        lines.append("  the input changed, so outputs were not compared:")
        lines += [f"    {field}: {_short(old)} -> {_short(new)}" for field, old, new in comparison.input_changes]
    elif comparison.divergence is not None:
        d = comparison.divergence
        lines.append(f"  context:  {_context(actual, d.step, decode)}")
        lines.append(f"  expected: {_continuation(expected, d.step, decode)}")
        lines.append(f"  got:      {_continuation(actual, d.step, decode)}")
        lines.append(f"  expected top-{len(d.expected_top)} at step {d.step}: {_top(d.expected_top, decode)}")
        lines.append(f"  got      top-{len(d.actual_top)} at step {d.step}: {_top(d.actual_top, decode)}")
        lines.append(_drift_line(comparison))
    elif comparison.verdict is Verdict.LOGIT_DRIFT:
        lines.append(f"  all {comparison.steps_compared} tokens match: {_short(expected.text, 80)}")
    lines += _fingerprint_changes(expected, actual)
    lines.append(f"  golden: {location}")
    if nodeid is not None:
        lines.append(f"Accept with: {accept_command(nodeid)}")
    return "\n".join(lines)


def _headline(comparison: Comparison, decode: Decode) -> str:
    verdict = comparison.verdict.value
    d = comparison.divergence
    if comparison.verdict is Verdict.INPUT_CHANGED:
        return f"{verdict} — " + ", ".join(field for field, _, _ in comparison.input_changes)
    if comparison.verdict is Verdict.LOGIT_DRIFT:
        return (f"{verdict} at step {comparison.first_hash_step} — same tokens, logits differ "
                f"(max |Δlogprob| in top-k {comparison.max_logprob_delta:.3g})")
    assert d is not None
    margins = f"golden margin {d.golden_margin:.3g}"
    if d.golden_margin >= comparison.tie_margin:
        confidence = f"{margins} >= tie margin {comparison.tie_margin:g}: confident"
    elif comparison.verdict is Verdict.TIE_FLIP:
        confidence = f"{margins} < tie margin {comparison.tie_margin:g}: near tie"
    else:
        confidence = f"{margins} < tie margin {comparison.tie_margin:g}, but the new token was not in its top-k"
    return (f"{verdict} at step {d.step} — expected {_token(d.expected_token, decode)}, "
            f"got {_token(d.actual_token, decode)}; {confidence}")


def _drift_line(comparison: Comparison) -> str:
    matched = comparison.steps_compared
    total = max(comparison.total_steps, 1)
    drift = ("logits identical before it" if comparison.first_hash_step is None
             or comparison.first_hash_step >= matched else
             f"logits differed from step {comparison.first_hash_step}, "
             f"max |Δlogprob| in top-k {comparison.max_logprob_delta:.3g}")
    return f"  before the divergence: {matched}/{comparison.total_steps} tokens matched " \
           f"({matched / total:.0%}); {drift}"


def decoder_for(expected: Generation, actual: Generation, tokenizer: Any = None) -> Decode:
    """Token id -> text: the tokenizer when given, else the pieces both generations recorded."""
    if tokenizer is not None:
        return lambda token: str(tokenizer.decode([token]))
    known = {t: p for gen in (expected, actual) for t, p in zip(gen.token_ids, gen.pieces)}
    return lambda token: known.get(token, f"<id {token}>")


def assertrepr(actual: Generation, expected: Generation) -> list[str]:
    """Lines for ``assert actual == expected`` on two Generations, as golden checks show them."""
    from pytest_llmdeterminism.compare import compare

    comparison = compare(expected, actual)
    if comparison.verdict is Verdict.IDENTICAL:
        return [("Generations differ only in fields outside tokens, logits and inputs "
                 "(e.g. decoded text or pieces)")]
    text = mismatch("left == right", "(right side)", None, comparison, expected, actual,
                    decoder_for(expected, actual), profile="exact")
    return ["Generation == Generation: " + text.split(": ", 1)[1].splitlines()[0],
            *text.splitlines()[1:]]


def _token(token: int, decode: Decode) -> str:
    return "end of output" if token < 0 else f"{decode(token)!r} (id {token})"


def _context(gen: Generation, step: int, decode: Decode) -> str:
    start = max(0, step - CONTEXT_TOKENS)
    before = [f"{decode(t)!r}" for t in gen.token_ids[start:step]]
    return ("… " if start else "") + " ".join(before or ["(start of output)"])


def _continuation(gen: Generation, step: int, decode: Decode) -> str:
    shown = gen.token_ids[step:step + CONTEXT_TOKENS]
    text = " ".join(f"{decode(t)!r}({t})" for t in shown) or "(end of output)"
    more = " …" if len(gen.token_ids) > step + CONTEXT_TOKENS else ""
    return f"[step {step}] {text}{more}   full text: {_short(gen.text, 80)}"


def _top(top: TopK, decode: Decode) -> str:
    return ", ".join(f"{decode(t)!r} {lp:.3f}" for t, lp in top) or "(none: output had ended)"


def _fingerprint_changes(expected: Generation, actual: Generation) -> list[str]:
    from pytest_llmdeterminism.fingerprint import diff

    changes = diff(expected.fingerprint, actual.fingerprint)
    if not changes:
        return ["  environment: unchanged since the golden was recorded"]
    return ["  environment changed since recording:"] + [
        f"    {field}: {_short(old)} -> {_short(new)}" for field, old, new in changes
    ]


def _short(value: Any, limit: int = 100) -> str:
    if isinstance(value, (list, tuple)) and len(value) > _MAX_IDS_SHOWN:
        text = f"[{', '.join(map(str, value[:_MAX_IDS_SHOWN]))}, … ({len(value)} ids)]"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def summary(counts: dict[str, int], written: Sequence[str], errors: Iterable[str],
            notes: Sequence[str] = ()) -> list[str]:
    """Terminal summary lines: checks per outcome, files written, write problems, notes."""
    if not counts and not written:
        return []
    parts = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))
    lines = [f"golden checks: {parts}" if parts else "golden checks: none"]
    lines += list(notes)
    lines += [f"wrote {path}" for path in written]
    lines += [f"NOT written: {problem}" for problem in errors]
    return lines
