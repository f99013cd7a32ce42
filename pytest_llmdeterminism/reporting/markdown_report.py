"""The Markdown report (``--llm-report x.md``, and GitHub Actions' step summary): a pull-request
comment built from the JSON report's document; and the shards section of a merged one."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pytest_llmdeterminism.reporting.run_header import header_lines, times_per_test
from pytest_llmdeterminism.reporting.text import (
    budget_text,
    confidence,
    differing_window,
    drift_text,
    form_label,
    margin_text,
    sampling_lines,
    score_lines,
    short,
)


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
    lines = ["## LLM golden checks", "", *_run_lines(document),
             f"{summary['checks']} checks, {summary['failed']} failed.", "",
             *_next_steps(document), "| verdict | checks | failed |", "|---|---|---|"]
    for verdict, n in summary["by_verdict"].items():
        failed = sum(1 for c in document["checks"] if c["verdict"] == verdict and not c["passed"])
        lines.append(f"| {_md_code(verdict)} | {n} | {failed} |")
    lines += _times(document)
    failing = sorted((c for c in document["checks"] if not c["passed"]), key=lambda c: -confidence(c))
    if failing:
        lines += ["", "### Failing checks (most confident divergence first)", "",
                  "| test | golden | verdict | step | golden margin | drift | what changed |",
                  "|---|---|---|---|---|---|---|"]
        for c in failing[:50]:
            changed = ", ".join(f"{k}: {v[0]} → {v[1]}" for k, v in c["changed_fingerprint"].items()
                                if k != "weights_hash") or ", ".join(c["input_changes"]) or "—"
            step = "" if c["first_divergence"] is None else str(c["first_divergence"])
            lines.append(f"| {_md_code(c['test'])} | {_md_code(c['name'])} | {_md_code(c['verdict'])} "
                         f"| {step} | {_md(margin_text(c))} | {_md(drift_text(c))} | {_md(changed)} |")
        if len(failing) > 50:
            lines.append(f"| … {len(failing) - 50} more | | | | | | |")
    drifted = sorted((c for c in document["checks"] if c["passed"] and drift_text(c)),
                     key=lambda c: -(c["max_logprob_delta"] or 0))
    if drifted:
        lines += ["", "### Passed within the tolerance (largest drift first)", "",
                  "| test | golden | verdict | drift | profile |", "|---|---|---|---|---|"]
        lines += [f"| {_md_code(c['test'])} | {_md_code(c['name'])} | {_md_code(c['verdict'])} "
                  f"| {_md(drift_text(c))} | {_md_code(c['profile'])} |" for c in drifted[:50]]
        if len(drifted) > 50:
            lines.append(f"| … {len(drifted) - 50} more | | | | |")
    changed_inputs = [c for c in failing[:50] if c.get("inputs")]
    if changed_inputs:
        lines += ["", "### Inputs that changed (recorded → now; outputs not compared)", ""]
        for c in changed_inputs:
            lines += [f"- {_md_code(c['test'])} {_md_code(c['name'])}",
                      *(f"  - {_md(line)}" for line in _input_lines(c))]
    changed_text = [c for c in failing[:50] if c.get("actual_text") is not None]
    changed_text += [c for c in document["checks"] if c["passed"] and c.get("actual_text") is not None
                     and c.get("expected_text") not in (None, c["actual_text"])][:50]
    if changed_text:
        lines += ["", "### What the model says (expected → got)", ""]
        for c in changed_text:
            step = "" if c["first_divergence"] is None else f" at step {_md(c['first_divergence'])}"
            passed = " (passed)" if c["passed"] else ""
            verdict = _md_code(c["verdict"])
            lines += [f"- {_md_code(c['test'])} {_md_code(c['name'])}: {verdict}{step}{passed}",
                      *(f"  - {_md(line)}" for line in sampling_lines(c)),
                      *(f"  - {line}" for line in _text_lines(c))]
    scored = [c for c in document["checks"] if c.get("log_likelihood")  # a score check's, with a golden
              and (not c["passed"] or c["verdict"] != "IDENTICAL")][:50]
    if scored:
        lines += ["", "### Score checks that moved (log-likelihood of the continuation, golden → now)", ""]
        for c in scored:
            passed = " (passed)" if c["passed"] else ""
            lines += [f"- {_md_code(c['test'])} {_md_code(c['name'])}: {_md_code(c['verdict'])}{passed}",
                      *(f"  - {_md(line)}" for line in score_lines(c))]
    found = [c for c in document["checks"] if c.get("evidence") and not c["passed"]][:50]
    if found:
        lines += ["", "### What the checks' own rules found", ""]
        for c in found:
            lines += [f"- {_md_code(c['test'])} {_md_code(c['name'])}: {_md_code(c['verdict'])} — "
                      f"{_md(c.get('finding', ''))}", *(f"  - {_md(line.strip())}" for line in c["evidence"])]
    incomplete = [c for c in document["checks"] if c.get("new_steps")]
    if incomplete:
        lines += ["", "### Goldens shorter than this run (re-record with `--llm-golden-update`)", ""]
        lines += [f"- {_md_code(c['test'])} {_md_code(c['name'])}: {_md(budget_text(c))}"
                  for c in incomplete[:50]]
    return "\n".join(lines) + "\n"


def shards_markdown(shards: int, ran: int, suite: int, partial: Sequence[str], not_run: Sequence[str],
                    unused: dict[str, list[str]]) -> list[str]:
    """The last section of a merged report (``llm-golden merge``): coverage, then unused goldens or
    why they were not judged, with the tests no shard ran."""
    lines = ["### Shards", "", f"{shards} shard(s) ran {ran} of {suite} test(s) of the suite."]
    if partial:
        lines += ["", f"Unused goldens not judged: {_md('; '.join(partial))}."]
        if not_run:
            lines += ["", "Tests that no shard ran:", "",
                      *(f"- {_md_code(nodeid)}" for nodeid in not_run[:50])]
            lines += [f"- … {len(not_run) - 50} more"] if len(not_run) > 50 else []
    elif unused:
        lines += ["", *(f"- unused golden in {_md_code(path)}: {_md_code(key)}"
                        for path, keys in sorted(unused.items()) for key in keys)]
    return lines


def _md_span(text: str) -> str:
    """One line of text as an inert code span in Markdown (backticks, pipes and HTML are shown, not
    read): fenced with one more backtick than its longest run, a space inside where it touches one."""
    text = " ".join(text.splitlines())
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _text_lines(check: dict[str, Any]) -> list[str]:
    """The prompt's end, then the golden's text and this run's around where they first differ, as
    Python literals (a space or a new line in the output is visible) in inert code spans."""
    prompt = check.get("prompt") or ""
    lines = [f"prompt: {_md_span(_tail(prompt, _PROMPT_SHOWN))}"] if prompt else []
    expected, actual = check.get("expected_text"), check["actual_text"]
    if expected is None:
        return [*lines, f"no golden; got: {_md_span(short(actual, _TEXT_SHOWN))}"]
    if expected == actual:
        return [*lines, f"same text: {_md_span(short(actual, _TEXT_SHOWN))}"]
    old, new = differing_window(expected, actual, before=40, after=_TEXT_SHOWN)
    return [*lines, f"expected: {_md_span(old)}", f"got: {_md_span(new)}"]


def _tail(text: str, limit: int) -> str:
    """The end of a long text (where a prompt asks its question), as a Python literal."""
    return repr(text) if len(text) <= limit else "…" + repr(text[-limit:])


_PROMPT_SHOWN = 160  # characters of a prompt's end in the Markdown report
_TEXT_SHOWN = 160  # characters of output text from where the two sides first differ


def _input_lines(check: dict[str, Any]) -> list[str]:
    """Both sides' input of a report entry whose input changed, as lines of text."""
    old, new = check["inputs"]["expected"], check["inputs"]["actual"]
    label = "prompt" + form_label(old["prompt_form"], new["prompt_form"])
    if old["prompt"] == new["prompt"]:
        lines = [f"{label}: unchanged, {short(old['prompt'], 200)}"]
    else:
        old_text, new_text = differing_window(old["prompt"], new["prompt"], before=40, after=80)
        lines = [f"{label}: {old_text} → {new_text}"]
    first = check.get("first_input_difference")
    if first is None:
        lines.append(f"prompt token ids: unchanged ({old['ids_total']} ids)")
    else:
        lines.append(f"prompt token ids differ from position {first} "
                     f"({old['ids_total']} → {new['ids_total']} ids): {_ids_shown(old)} → {_ids_shown(new)}")
    lines += [f"{field}: {short(values[0])} → {short(values[1])}"
              for field, values in check["input_diff"].items()]
    return lines


def _ids_shown(side: dict[str, Any]) -> str:
    start, ids = side["ids_from"], side["prompt_token_ids"]
    more = side["ids_total"] > start + len(ids)
    shown = f"[{'…, ' if start else ''}{', '.join(map(str, ids))}{', …' if more else ''}]"
    return f"{shown} (from position {start})"


def _run_lines(document: dict[str, Any]) -> list[str]:
    """What ran: model, commits, versions, shape (the report's ``header``), one cell each."""
    lines = header_lines(document.get("header") or {})
    return ["**Run:** " + " · ".join(_md(line) for line in lines), ""] if lines else []


def _next_steps(document: dict[str, Any]) -> list[str]:
    """The commands the terminal gives, verbatim in an inert code block."""
    steps = document.get("next_steps") or []
    if not steps:
        return []
    text = "\n".join(" ".join(step.splitlines()) for step in steps)
    fence = "`" * max(3, max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    return ["### Next steps", "", f"{fence}text", text, fence, ""]


_TIMES_LISTED = 10


def _times(document: dict[str, Any]) -> list[str]:
    """Time per test with golden checks, slowest first."""
    rows = times_per_test(document["checks"])
    if not rows:
        return []
    total = sum(row[3] for row in rows)
    lines = ["", f"### Time per test (slowest first; {total:.1f} s in all)", "",
             "| test | checks | failed | seconds |", "|---|---|---|---|"]
    lines += [f"| {_md_code(test)} | {n} | {failed} | {seconds:.1f} |"
              for test, n, failed, seconds in rows[:_TIMES_LISTED]]
    more = len(rows) - _TIMES_LISTED
    return lines + ([f"| … {more} more | | | |"] if more > 0 else [])
