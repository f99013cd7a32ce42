"""Failure text and terminal summary lines, built from data; nothing here prints or raises."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.compare import Comparison, Verdict, first_token_divergence, id_window
from pytest_llmdeterminism.generation import TEXT_ONLY_IDS, Generation, TopK

if TYPE_CHECKING:
    from pytest_llmdeterminism.reporting.records import CheckRecord, RunRecord

Decode = Callable[[int], str]
CONTEXT_TOKENS = 4
_MAX_IDS_SHOWN = 12


def accept_command(rerun: str) -> str:
    """``rerun`` is the test id and the run's own ``--llm-*`` options, shell-quoted."""
    # The flag goes last: it takes an optional value and would swallow a path placed after it.
    return f"pytest {rerun} --llm-golden-update"


def shell_quote(text: str) -> str:
    return text if all(c.isalnum() or c in "/._-:=" for c in text) else "'" + text.replace("'", "'\\''") + "'"


def one_line_crash(longrepr: Any) -> None:
    """Keep only the first line (the verdict) of a failure's crash message, which pytest's short test
    summary prints (in full under CI or -vv): the FAILURES section above already shows all of it."""
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and "\n" in str(crash.message):
        crash.message = str(crash.message).split("\n", 1)[0].rstrip(":")


def missing(key: str, location: str, nodeid: str, other_variants: Sequence[str] = ()) -> str:
    others = (f" (this test has goldens for {', '.join(map(repr, other_variants))}; compare with one of "
              "them via --llm-golden-fallback)") if other_variants else ""
    return (
        f"no golden recorded for {key!r} in {location}{others}.\n"
        f"Record it with: {accept_command(nodeid)}"
    )


def mismatch(key: str, location: str, nodeid: str | None, comparison: Comparison,
             expected: Generation, actual: Generation, decode: Decode, *, profile: str, across: str = "") -> str:
    """A failure message of bounded length: verdict, where and how confident, what changed, the fix."""
    lines = [f"golden mismatch in {key!r}: {_headline(comparison, decode)} — fails under {profile!r}"]
    if across:
        lines.append(f"  {across}")
    if comparison.verdict is Verdict.INPUT_CHANGED:
        lines.append("  the input changed, so outputs were not compared (recorded -> now):")
        for field, old, new in comparison.input_changes:
            lines += _input_change(field, old, new, expected, actual)
        if all(field != "prompt_token_ids" for field, _, _ in comparison.input_changes):
            label = "prompt" + _form_label(expected.prompt_form, actual.prompt_form)
            lines.append(f"    {label}: unchanged, {_short(expected.prompt, 80)} "
                         f"({len(expected.prompt_token_ids)} ids, the same)")
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
    budget = budget_note(comparison)
    if budget:
        lines.append(f"  {budget}")
    lines += _fingerprint_changes(expected, actual)
    lines.append(f"  golden: {location}")
    if nodeid is not None:
        lines.append(f"Accept with: {accept_command(nodeid)}")
    return "\n".join(lines)


# Fields whose change makes the golden another variant (its key says device class and dtype, and
# the engine when not transformers): such a golden is compared only under --llm-golden-fallback.
_VARIANT_FIELDS = ("dtype", "device_class", "engine")
# Library versions: an upgrade is a change to accept (or not), not a property of the machine.
_VERSION_FIELDS = ("torch", "transformers", "cuda", "cudnn", "cuda_driver", "engine_version", "server_version")


def across_environments(changes: Sequence[tuple[str, Any, Any]], *, tolerance: str, explicit: bool,
                        run_variant: str) -> str:
    """The line that says a golden was compared across environments, which profile judged it, and
    the fix that fits the fields that changed: another dtype or device is another variant to
    record; a library upgrade is accepted by re-recording; another machine can be re-recorded to
    compare exactly."""
    from pytest_llmdeterminism.engines.fingerprint import describe_changes

    line = f"compared across environments: {describe_changes(list(changes))}; tolerance {tolerance} {'as set' if explicit else 'by default'}"
    names = [name for name, _, _ in changes]
    variant = [name for name in names if name in _VARIANT_FIELDS]
    versions = [name for name in names if name in _VERSION_FIELDS]
    if variant:
        return (f"{line}; the golden is another variant ({', '.join(variant)}), whose numbers differ by design: "
                f"record this run's own {run_variant!r} golden beside it by re-running with --llm-golden-update "
                "(variants coexist, and each run compares with its own unless --llm-golden-fallback is given)")
    if explicit:
        return line
    if versions:
        return (f"{line}; after an upgrade ({', '.join(versions)}) keep the goldens and let the tolerance judge "
                "the drift, or accept the new numbers: --llm-golden-update --llm-tolerance=exact re-records "
                "every check that is not IDENTICAL")
    return f"{line}; to compare exactly again, re-record with --llm-golden-update --llm-tolerance=exact"


def wider_tolerance(comparison: Comparison, *, dtype: str) -> str:
    """For a check that failed only on the size of its logit drift: a ``near_tie`` profile that
    would pass it, with the drift rounded up; "" for any other failure."""
    delta = comparison.max_logprob_delta
    if comparison.verdict not in (Verdict.LOGIT_DRIFT, Verdict.TIE_FLIP) or not 0 < delta < math.inf:
        return ""
    atol = _round_up(delta)
    return (f"to pass {dtype} drift of this size instead (max |Δlogprob| {_delta(delta)}): "
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
        return f"{head}judged on the first {judged} step(s); the golden's {steps} lie beyond this run's budget"
    return f"{head}the golden ended (EOS) within both budgets, so it was judged in full"


def nondeterministic(key: str, location: str, nodeid: str, between: Comparison, before: Generation,
                     after: Generation, decode: Decode, *, attempts: tuple[int, int], earlier_outcome: str) -> str:
    """Two attempts of one test in one process (a rerun) generated different outputs for ``key``."""
    first, now = attempts
    lines = [(f"golden check {key!r} is NONDETERMINISTIC: attempt {now} of this test generated other output "
              f"than attempt {first} in the same process ({_how_attempts_differ(between, decode)}); "
              "a rerun never passes a golden check"),
             f"  attempt {first}'s check was {earlier_outcome}; the same input must give the same output every time"]
    if between.verdict is Verdict.INPUT_CHANGED:
        for field, old, new in between.input_changes:
            lines += _input_change(field, old, new, before, after)
    elif between.divergence is not None:
        step = between.divergence.step
        lines.append(f"  context:    {_context(after, step, decode)}")
        lines.append(f"  attempt {first}: {_continuation(before, step, decode)}")
        lines.append(f"  attempt {now}: {_continuation(after, step, decode)}")
    lines.append(f"  golden: {location}")
    lines.append(f"Find what varies with: pytest {nodeid} --llm-audit")
    return "\n".join(lines)


def rerun_note(key: str, nodeid: str, attempts: tuple[int, int]) -> str:
    """The summary's line for a golden check whose output changed between attempts of its test."""
    return (f"NONDETERMINISTIC: {nodeid} generated other output for {key!r} on attempt {attempts[1]} than on "
            f"attempt {attempts[0]} (rerun in the same process); it fails, whatever a rerun gives")


def _how_attempts_differ(between: Comparison, decode: Decode) -> str:
    if between.verdict is Verdict.INPUT_CHANGED:
        return "its input changed: " + ", ".join(field for field, _, _ in between.input_changes)
    d = between.divergence
    if d is not None:
        return (f"tokens differ from step {d.step}: {_token(d.expected_token, decode)}, "
                f"then {_token(d.actual_token, decode)}")
    return f"same tokens, logits differ from step {between.first_hash_step}"


def _headline(comparison: Comparison, decode: Decode) -> str:
    verdict = comparison.verdict.value
    d = comparison.divergence
    if comparison.verdict is Verdict.INPUT_CHANGED:
        return f"{verdict} — " + ", ".join(field for field, _, _ in comparison.input_changes)
    if comparison.verdict is Verdict.LOGIT_DRIFT and comparison.hash_definitions is not None:
        return (f"{verdict} — same tokens; the step hashes are not comparable (golden {_hashes(comparison, 0)}, "
                f"this run {_hashes(comparison, 1)}); max |Δlogprob| in top-k {_delta(comparison.max_logprob_delta)}")
    if comparison.verdict is Verdict.LOGIT_DRIFT:
        return (f"{verdict} at step {comparison.first_hash_step} — same tokens, logits differ "
                f"(max |Δlogprob| in top-k {_delta(comparison.max_logprob_delta)})")
    assert d is not None
    margins = f"golden margin {d.golden_margin:.3g}"
    if d.golden_margin >= comparison.tie_margin:
        confidence = f"{margins} >= tie margin {comparison.tie_margin:g}: not a near tie"
    elif comparison.verdict is Verdict.TIE_FLIP:
        confidence = f"{margins} < tie margin {comparison.tie_margin:g}: near tie"
    else:
        confidence = f"{margins} < tie margin {comparison.tie_margin:g}, but the new token was not in its top-k"
    return (f"{verdict} at step {d.step} — expected {_token(d.expected_token, decode)}, "
            f"got {_token(d.actual_token, decode)}; {confidence}")


def _hashes(comparison: Comparison, side: int) -> str:
    assert comparison.hash_definitions is not None
    name = comparison.hash_definitions[side]
    return {"logits": "hashes raw logits", "served-topk": "hashes what a server returned",
            "vllm-topk": "hashes what vLLM returned"}.get(name, f"hash {name!r}")


def _drift_line(comparison: Comparison) -> str:
    matched = comparison.steps_compared
    total = max(comparison.total_steps, 1)
    if comparison.hash_definitions is not None:
        return (f"  before the divergence: {matched}/{comparison.total_steps} tokens matched ({matched / total:.0%}); "
                f"max |Δlogprob| in top-k {_delta(comparison.max_logprob_delta)} (golden {_hashes(comparison, 0)}, "
                f"this run {_hashes(comparison, 1)}: not comparable)")
    drift = ("logits identical before it" if comparison.first_hash_step is None
             or comparison.first_hash_step >= matched else
             f"logits differed from step {comparison.first_hash_step}, "
             f"max |Δlogprob| in top-k {_delta(comparison.max_logprob_delta)}")
    return f"  before the divergence: {matched}/{comparison.total_steps} tokens matched " \
           f"({matched / total:.0%}); {drift}"


def _input_change(field: str, old: Any, new: Any, expected: Generation, actual: Generation) -> list[str]:
    if field == "batch_shape" and str(old).startswith("1x") and new == f"1x{len(actual.prompt_token_ids)}":
        return [(f"    {field}: {_short(old)} -> {_short(new)} (at B = 1 a prompt now runs alone at its own length, "
                "unpadded, as a plain generate() does; a golden recorded padded is re-recorded once)")]
    if field != "prompt_token_ids":
        return [f"    {field}: {_short(old)} -> {_short(new)}"]
    first = _first_difference(old, new)
    return [*_prompt_lines(expected, actual),
            (f"    prompt_token_ids differ from position {first} ({len(old)} -> {len(new)} ids): "
             f"{_id_window(old, first)} -> {_id_window(new, first)}")]


def _prompt_lines(expected: Generation, actual: Generation) -> list[str]:
    """Both sides' prompt as the model saw it (a chat conversation rendered with its template)."""
    label = "prompt" + _form_label(expected.prompt_form, actual.prompt_form)
    if expected.prompt == actual.prompt:
        return [(f"    {label}: unchanged, {_short(expected.prompt, 80)}; the same text now tokenises "
                 "differently (a changed tokenizer or its settings)")]
    old_text, new_text = _differing_window(expected.prompt, actual.prompt)
    return [f"    {label}: {old_text} -> {new_text}"]


def _form_label(old: str, new: str) -> str:
    """`` (chat, rendered)`` for a prompt that was a chat conversation; both forms where they differ."""
    if old != new:
        return f" ({old} -> {new})"
    return {"chat": " (chat, rendered)", "token_ids": " (token ids, decoded)"}.get(old, "")


def _id_window(ids: Sequence[int], first: int) -> str:
    start, end = id_window(len(ids), first)
    shown = ", ".join(map(str, ids[start:end]))
    return f"[{'…, ' if start else ''}{shown}{', …' if len(ids) > end else ''}]"


def _first_difference(old: Sequence[object], new: Sequence[object]) -> int:
    first = first_token_divergence(old, new)
    return min(len(old), len(new)) if first is None else first


def _differing_window(old: str, new: str, before: int = 30, after: int = 50) -> tuple[str, str]:
    """Both texts around their first differing character (a rendered chat prompt is long; the
    change may sit anywhere in it)."""
    first = _first_difference(old, new)
    start = max(0, first - before)

    def window(text: str) -> str:
        return ("…" if start else "") + repr(text[start:first + after]) + ("…" if len(text) > first + after else "")

    return window(old), window(new)


def decoder_for(expected: Generation, actual: Generation, tokenizer: Any = None) -> Decode:
    """Token id -> text. Generated tokens use the pieces recorded with them (the golden's own
    text wins), other ids the current ``tokenizer`` when given, else ``<id N>``."""
    known = {t: p for gen in (actual, expected) for t, p in zip(gen.token_ids, gen.pieces)}

    def decode(token: int) -> str:
        if token in known:
            return known[token]
        if token >= TEXT_ONLY_IDS:
            return "<a served token with no id>"
        return str(tokenizer.decode([token])) if tokenizer is not None else f"<id {token}>"

    return decode


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


def _delta(value: float) -> str:
    # Logprobs are stored to 6 decimals: a smaller change shows only in the hash.
    return f"{value:.3g}" if value >= 1e-6 else "< 1e-6"


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
    from pytest_llmdeterminism.engines.fingerprint import diff

    changes = diff(expected.fingerprint, actual.fingerprint)
    if not changes:
        return ["  environment: the same on both sides"]
    return ["  environment changed (expected -> got):"] + [
        f"    {field}: {_short(old)} -> {_short(new)}" for field, old, new in changes
    ]


def _short(value: Any, limit: int = 100) -> str:
    if isinstance(value, (list, tuple)) and len(value) > _MAX_IDS_SHOWN:
        text = f"[{', '.join(map(str, value[:_MAX_IDS_SHOWN]))}, … ({len(value)} ids)]"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def audit_summary(audits: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """One table per audited generation, then which sources moved results, across the session."""
    from pytest_llmdeterminism.engines.audit import AuditReport

    if not audits:
        return []
    reports = [(nodeid, AuditReport.from_json(data)) for nodeid, data in audits]
    lines: list[str] = []
    for nodeid, found in reports:
        lines += [f"{nodeid}: " + found.lines()[0], *found.lines()[1:]]
    moved: dict[str, int] = {}
    for _, found in reports:
        for row in found.rows:
            moved[row.source] = moved.get(row.source, 0) + row.moved
    nondeterministic = sum(found.nondeterministic for _, found in reports)
    lines.append(f"audit summary: {len(reports)} generation(s), {nondeterministic} nondeterministic; "
                 "results moved by " + ", ".join(f"{source} {n}/{len(reports)}" for source, n in moved.items()))
    return lines


def unused_summary(unused: dict[str, list[str]], pruned: Sequence[str], partial: Sequence[str],
                   display: Callable[[Path], str], *, prune: bool, stopped: bool = False,
                   prune_command: str = "pytest --llm-golden-prune") -> list[str]:
    """Unused goldens after a complete run; after a partial one, why none were judged: always when
    the run stopped early, under ``--llm-golden-prune`` for any reason (``-k`` is quiet otherwise)."""
    if pruned:
        return [f"pruned {len(pruned)} unused golden(s):", *(f"  {item}" for item in pruned)]
    if partial:
        verb = "not pruned" if prune else "not judged"
        return [f"unused goldens {verb}: this run was partial ({'; '.join(partial)})"] if prune or stopped else []
    lines = []
    for path, keys in sorted(unused.items()):
        lines += [f"unused golden in {display(Path(path))}: {key!r}" for key in keys]
    if lines:
        lines.append("these goldens were not checked by any test in this complete run; "
                     f"delete them with: {prune_command}")
    return lines


def shards_markdown(shards: int, ran: int, suite: int, partial: Sequence[str], not_run: Sequence[str],
                    unused: dict[str, list[str]]) -> list[str]:
    """The last section of a merged report (``llm-golden merge``): coverage, then unused goldens or
    why they were not judged, with the tests no shard ran."""
    lines = ["### Shards", "", f"{shards} shard(s) ran {ran} of {suite} test(s) of the suite."]
    if partial:
        lines += ["", f"Unused goldens not judged: {_md('; '.join(partial))}."]
        if not_run:
            lines += ["", "Tests that no shard ran:", "", *(f"- {_md_code(nodeid)}" for nodeid in not_run[:50])]
            lines += [f"- … {len(not_run) - 50} more"] if len(not_run) > 50 else []
    elif unused:
        lines += ["", *(f"- unused golden in {_md_code(path)}: {_md_code(key)}"
                        for path, keys in sorted(unused.items()) for key in keys)]
    return lines


def summary(counts: dict[str, int], written: Sequence[str], errors: Iterable[str],
            notes: Sequence[str] = (), held_back: Sequence[str] = ()) -> list[str]:
    """Terminal summary lines: checks per outcome, files written, write problems, notes."""
    if not counts and not written:
        return []
    parts = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))
    lines = [f"golden checks: {parts}" if parts else "golden checks: none"]
    lines += list(notes)
    lines += [f"wrote {path}" for path in written]
    lines += [f"NOT written: {problem}" for problem in errors]
    if held_back:
        lines.append(f"NOT recorded: the goldens of {len(held_back)} test(s) that recorded, then failed or were "
                     "skipped (a golden is kept only when its test passes); fix them, then record again:")
        lines += [f"  {nodeid}" for nodeid in held_back]
    return lines


REPORT_SCHEMA = "pytest-llmdeterminism/report"
REPORT_VERSION = 1


def run_report(checks: Sequence[CheckRecord], audits: Sequence[tuple[str, dict[str, Any]]], *,
               run: RunRecord | None = None) -> dict[str, Any]:
    """The ``--llm-report *.json`` document: one entry per golden check, every audit and, in
    ``run``, what the run checked (:class:`~pytest_llmdeterminism.reporting.records.RunRecord`).

    Each check: ``test`` (node id), ``test_duration_s`` (the test's call phase), ``name`` (golden
    key), ``variant``, ``verdict``, ``passed``, ``profile``, ``first_divergence`` (step or null),
    ``golden_margin``, ``max_logprob_delta``, ``input_changes`` (field names),
    ``changed_fingerprint`` (field -> [recorded, now]), ``numerics_changed`` (the fields that
    decide the bits and differ: non-empty means compared across environments) and ``steps`` (``expected`` / ``actual``:
    ``[piece, token id, margin, top-1 logprob]`` per step, at most 64); for INPUT_CHANGED ``inputs``
    (both sides' prompt and id window), ``first_input_difference`` and ``input_diff``; where the
    budgets differ ``max_new_tokens``, ``judged_steps``, ``new_steps`` and ``unchecked_steps``.
    """
    import msgspec

    counts: dict[str, int] = {}
    for check in checks:
        counts[check.verdict] = counts.get(check.verdict, 0) + 1
    return _strict_json({"schema": REPORT_SCHEMA, "version": REPORT_VERSION,  # type: ignore[no-any-return]
                         "summary": {"checks": len(checks), "failed": sum(not c.passed for c in checks),
                                     "by_verdict": dict(sorted(counts.items()))},
                         "checks": msgspec.to_builtins(list(checks)),
                         "audits": [{"test": nodeid, **audit} for nodeid, audit in audits],
                         **({"run": msgspec.to_builtins(run)} if run is not None else {})})


def json_text(document: dict[str, Any]) -> str:
    """A report document as the ``.json`` report file holds it."""
    return json.dumps(document, indent=1, sort_keys=True, allow_nan=False)


def _strict_json(value: Any) -> Any:
    """``value`` with every NaN or infinite float as None: strict JSON parsers reject both."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict_json(item) for item in value]
    return value


def _md(value: Any) -> str:
    """Text for one Markdown table cell, inert: no column break, code span, link, HTML or new line."""
    text = str(value)
    for raw, entity in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "&#124;"), ("`", "&#96;"),
                        ("[", "&#91;"), ("]", "&#93;"), ("\\", "&#92;")):
        text = text.replace(raw, entity)
    return " ".join(text.split())


def _md_code(value: Any) -> str:
    """An identifier as an inert code span in a table cell (HTML inside a code span is shown, not run)."""
    text = " ".join(str(value).split()).replace("`", "'").replace("|", "\\|")
    return f"`{text}`"


def run_report_markdown(document: dict[str, Any]) -> str:
    """A pull-request comment: counts per verdict, then the failing checks, most confident first."""
    summary = document["summary"]
    lines = ["## LLM golden checks", "",
             f"{summary['checks']} checks, {summary['failed']} failed.", "",
             "| verdict | checks | failed |", "|---|---|---|"]
    for verdict, n in summary["by_verdict"].items():
        failed = sum(1 for c in document["checks"] if c["verdict"] == verdict and not c["passed"])
        lines.append(f"| `{verdict}` | {n} | {failed} |")
    failing = sorted((c for c in document["checks"] if not c["passed"]),
                     key=lambda c: -(c["golden_margin"] or 0))
    if failing:
        lines += ["", "### Failing checks (most confident divergence first)", "",
                  "| test | golden | verdict | step | golden margin | what changed |", "|---|---|---|---|---|---|"]
        for c in failing[:50]:
            changed = ", ".join(f"{k}: {v[0]} → {v[1]}" for k, v in c["changed_fingerprint"].items()
                                if k != "weights_hash") or ", ".join(c["input_changes"]) or "—"
            margin = "" if c["golden_margin"] is None else f"{c['golden_margin']:.3g}"
            step = "" if c["first_divergence"] is None else str(c["first_divergence"])
            lines.append(f"| {_md_code(c['test'])} | {_md_code(c['name'])} | `{c['verdict']}` | {step} | {margin} "
                         f"| {_md(changed)} |")
        if len(failing) > 50:
            lines.append(f"| … {len(failing) - 50} more | | | | | |")
    changed_inputs = [c for c in failing[:50] if c.get("inputs")]
    if changed_inputs:
        lines += ["", "### Inputs that changed (recorded → now; outputs not compared)", ""]
        for c in changed_inputs:
            lines += [f"- {_md_code(c['test'])} {_md_code(c['name'])}", *(f"  - {_md(line)}" for line in _input_lines(c))]
    short = [c for c in document["checks"] if c.get("new_steps")]
    if short:
        lines += ["", "### Goldens shorter than this run (re-record with `--llm-golden-update`)", ""]
        lines += [f"- {_md_code(c['test'])} {_md_code(c['name'])}: {_md(_budget_text(c))}" for c in short[:50]]
    return "\n".join(lines) + "\n"


def _input_lines(check: dict[str, Any]) -> list[str]:
    """Both sides' input of a report entry whose input changed, as lines of text."""
    old, new = check["inputs"]["expected"], check["inputs"]["actual"]
    label = "prompt" + _form_label(old["prompt_form"], new["prompt_form"])
    if old["prompt"] == new["prompt"]:
        lines = [f"{label}: unchanged, {_short(old['prompt'], 200)}"]
    else:
        old_text, new_text = _differing_window(old["prompt"], new["prompt"], before=40, after=80)
        lines = [f"{label}: {old_text} → {new_text}"]
    first = check.get("first_input_difference")
    if first is None:
        lines.append(f"prompt token ids: unchanged ({old['ids_total']} ids)")
    else:
        lines.append(f"prompt token ids differ from position {first} ({old['ids_total']} → {new['ids_total']} ids): "
                     f"{_ids_shown(old)} → {_ids_shown(new)}")
    lines += [f"{field}: {_short(values[0])} → {_short(values[1])}" for field, values in check["input_diff"].items()]
    return lines


def _ids_shown(side: dict[str, Any]) -> str:
    start, ids = side["ids_from"], side["prompt_token_ids"]
    more = side["ids_total"] > start + len(ids)
    return f"[{'…, ' if start else ''}{', '.join(map(str, ids))}{', …' if more else ''}] (from position {start})"


def _budget_text(check: dict[str, Any]) -> str:
    old, new = check["max_new_tokens"]
    return (f"max_new_tokens {old} → {new}: judged on the golden's {check['judged_steps']} step(s); "
            f"{check['new_steps']} new step(s) from step {check['judged_steps']} not judged")


_HTML_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#222}h1{font-size:20px}
section{border:1px solid #ddd;border-radius:6px;margin:1em 0;padding:.6em 1em}
section.failed{border-color:#d33}.verdict{font-weight:600}.passed .verdict{color:#1a7f37}.failed .verdict{color:#d33}
.tokens{display:flex;flex-wrap:wrap;gap:2px;margin:.3em 0;align-items:flex-end}
.tok{font-family:ui-monospace,monospace;background:#f3f3f3;padding:1px 3px;border-radius:3px;white-space:pre;
display:flex;flex-direction:column;align-items:center}
.tok.div{background:#ffd7d5;outline:2px solid #d33}.tok .bar{height:4px;background:#4a7bd0;margin-top:2px}
.tok.tie .bar{background:#e8a317}.tok.new{outline:1px dashed #888;background:#fff}
.input{font-family:ui-monospace,monospace;white-space:pre-wrap}mark{background:#ffd7d5}.label{color:#666;font-size:12px;width:5.5em;flex:none}
table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:left}
"""


def _visible(text: str) -> str:
    """Whitespace a reader can see: a token that is a space or a new line is not an empty box."""
    return text.replace(" ", "·").replace("\t", "→").replace("\n", "↵")


def _html_inputs(check: dict[str, Any]) -> str:
    """Both sides' input of a check whose input changed: prompt (the differing rest marked), the
    window of token ids (the first differing one marked), and the other input fields that changed."""
    import html

    old, new = check["inputs"]["expected"], check["inputs"]["actual"]
    first_char = _first_difference(old["prompt"], new["prompt"])
    first_id = check.get("first_input_difference")
    rows = []
    for label, side in (("recorded input", old), ("new input", new)):
        text = side["prompt"]
        marked = (html.escape(_visible(text[:first_char])) + "<mark>" + html.escape(_visible(text[first_char:]))
                  + "</mark>") if old["prompt"] != new["prompt"] else html.escape(_visible(text))
        ids = [f"<mark>{token}</mark>" if side["ids_from"] + i == first_id else str(token)
               for i, token in enumerate(side["prompt_token_ids"])]
        more = side["ids_total"] > side["ids_from"] + len(ids)
        shown = f"[{'…, ' if side['ids_from'] else ''}{', '.join(ids)}{', …' if more else ''}]"
        form = html.escape(_form_label(side["prompt_form"], side["prompt_form"]).strip() or "text")
        rows.append(f'<div class="tokens"><span class="label">{label}</span><span class="input">{form}: {marked}'
                    f"<br>{side['ids_total']} ids from position {side['ids_from']}: {shown}</span></div>")
    where = "same ids" if first_id is None else f"ids differ from position {first_id}"
    fields = "".join(f"<br>{html.escape(field)}: {html.escape(_short(values[0]))} → {html.escape(_short(values[1]))}"
                     for field, values in check["input_diff"].items())
    return (f'<div class="label" style="width:auto">the input changed ({where}); outputs were not compared'
            f"{fields}</div>{''.join(rows)}")


def run_report_html(document: dict[str, Any]) -> str:
    """A self-contained page: per check, both continuations token by token, the divergent token
    highlighted, and a bar under each token for the model's margin at that step."""
    import html

    summary = document["summary"]
    rows = "".join(f"<tr><td>{html.escape(v)}</td><td>{n}</td></tr>" for v, n in summary["by_verdict"].items())
    sections = []
    for check in document["checks"]:
        status = "passed" if check["passed"] else "failed"
        step = check["first_divergence"] if check["verdict"] in ("TIE_FLIP", "REGRESSION") else None
        lines = []
        inputs = check.get("inputs") or {}
        new_from = check.get("judged_steps", 0) if check.get("new_steps") else None
        labels = {"expected": "recorded output", "actual": "new output"} if inputs else {}
        for side in ("expected", "actual"):
            tokens = []
            for index, (piece, token, margin, _) in enumerate(check["steps"].get(side, [])):
                width = max(2, min(60, int(margin * 6)))
                tie = margin < check.get("tie_margin", 0.0)  # the comparator's near-tie margin for this check
                fresh = side == "actual" and new_from is not None and index >= new_from
                classes = ("tok" + (" div" if index == step else "") + (" tie" if tie else "")
                           + (" new" if fresh else ""))
                title = f"step {index}, id {token}, margin {margin:.3g}" + (", new: not judged" if fresh else "")
                tokens.append(f'<span class="{classes}" title="{title}">'
                              f'{html.escape(_visible(piece))}<span class="bar" style="width:{width}px"></span></span>')
            if tokens:
                label = labels.get(side, side)
                lines.append(f'<div class="tokens"><span class="label">{label}</span>{"".join(tokens)}</div>')
        variant = (f"{check['run_variant']} run, compared with {check['variant']}" if check.get("run_variant")
                   else check["variant"])
        prompt = (f'<div class="tokens"><span class="label">prompt</span><span class="prompt">'
                  f'{html.escape(_visible(check["prompt"]))}</span></div>' if check.get("prompt") else "")
        if inputs:
            prompt = _html_inputs(check)
        changed = "; ".join(f"{html.escape(k)}: {html.escape(str(v[0]))} → {html.escape(str(v[1]))}"
                            for k, v in check["changed_fingerprint"].items())
        drift = check["verdict"] == "LOGIT_DRIFT" or check["max_logprob_delta"]
        detail = [f"profile {html.escape(check['profile'])}" if check["profile"] else "",
                  f"max |Δlogprob| in top-k {_delta(check['max_logprob_delta'])}" if drift else "",
                  f"first divergence at step {check['first_divergence']}" if check["first_divergence"] is not None else "",
                  f"golden margin {check['golden_margin']:.3g}" if check["golden_margin"] is not None else "",
                  html.escape(_budget_text(check)) if check.get("new_steps") else "",
                  f"changed: {changed}" if changed else ""]
        sections.append(
            f'<section class="{status}"><div><span class="verdict">{html.escape(check["verdict"])}</span> '
            f'<code>{html.escape(check["test"])}</code> — <code>{html.escape(check["name"])}</code> '
            f'[{html.escape(variant)}]</div><div class="label" style="width:auto">'
            f'{" · ".join(d for d in detail if d)}</div>{prompt}{"".join(lines)}</section>')
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>LLM golden checks</title>'
            f"<style>{_HTML_STYLE}</style></head><body><h1>LLM golden checks</h1>"
            f"<p>{summary['checks']} checks, {summary['failed']} failed. Bars under tokens show the model's "
            f"top-1/top-2 margin at that step (amber: near tie); the divergent token is outlined.</p>"
            f"<table><tr><th>verdict</th><th>checks</th></tr>{rows}</table>{''.join(sections)}</body></html>\n")
