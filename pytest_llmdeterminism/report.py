"""Failure text and terminal summary lines, built from data; nothing here prints or raises."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pytest_llmdeterminism.compare import Comparison, Verdict
from pytest_llmdeterminism.generation import Generation, TopK

Decode = Callable[[int], str]
CONTEXT_TOKENS = 4
_MAX_IDS_SHOWN = 12


def accept_command(nodeid: str) -> str:
    # The flag goes last: it takes an optional value and would swallow a path placed after it.
    return f"pytest {_shell_quote(nodeid)} --llm-golden-update"


def missing(key: str, location: str, nodeid: str) -> str:
    return (
        f"no golden recorded for {key!r} in {location}.\n"
        f"Record it with: {accept_command(nodeid)}"
    )


def mismatch(key: str, location: str, nodeid: str, comparison: Comparison,
             expected: Generation, actual: Generation, decode: Decode) -> str:
    lines = [f"golden mismatch in {key!r}: {_headline(comparison, expected, actual, decode)}"]
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
        if comparison.first_hash_step is not None and comparison.first_hash_step < d.step:
            lines.append(f"  logits already differed from step {comparison.first_hash_step} "
                         f"(max |Δlogprob| in top-k before the divergence: {comparison.max_logprob_delta:.3g})")
    elif comparison.verdict is Verdict.LOGIT_DRIFT:
        lines.append(f"  all {comparison.steps_compared} tokens match: {expected.text!r}")
    lines += _fingerprint_changes(expected, actual)
    lines.append(f"  golden: {location}")
    lines.append(f"Accept with: {accept_command(nodeid)}")
    return "\n".join(lines)


def _headline(comparison: Comparison, expected: Generation, actual: Generation, decode: Decode) -> str:
    verdict = comparison.verdict.value
    d = comparison.divergence
    if comparison.verdict is Verdict.INPUT_CHANGED:
        return f"{verdict} — " + ", ".join(field for field, _, _ in comparison.input_changes)
    if comparison.verdict is Verdict.LOGIT_DRIFT:
        return (f"{verdict} at step {comparison.first_hash_step} — same tokens, logits differ "
                f"(max |Δlogprob| in top-k {comparison.max_logprob_delta:.3g}); fails under 'exact'")
    assert d is not None
    confidence = "near tie" if comparison.verdict is Verdict.TIE_FLIP else "confident"
    return (f"{verdict} at step {d.step} — expected {_token(d.expected_token, decode)}, "
            f"got {_token(d.actual_token, decode)}; golden margin {d.golden_margin:.3g} ({confidence})")


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


def _shell_quote(text: str) -> str:
    return text if all(c.isalnum() or c in "/._-:" for c in text) else "'" + text.replace("'", "'\\''") + "'"


def summary(counts: dict[str, int], written: Sequence[str], errors: Iterable[str]) -> list[str]:
    """Terminal summary lines: checks per outcome, files written, write problems."""
    if not counts and not written:
        return []
    parts = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))
    lines = [f"golden checks: {parts}" if parts else "golden checks: none"]
    lines += [f"wrote {path}" for path in written]
    lines += [f"NOT written: {problem}" for problem in errors]
    return lines
