"""The HTML report (``--llm-report x.html``): a self-contained page built from the JSON report's
document, with filters and a search box; its style and script are the package's
``reporting/static`` files, inlined (nothing is fetched)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

from pytest_llmdeterminism.goldens import kinds
from pytest_llmdeterminism.judge.compare import Verdict
from pytest_llmdeterminism.reporting.run_header import header_lines, times_per_test
from pytest_llmdeterminism.reporting.text import (
    budget_text,
    confidence,
    delta,
    first_difference,
    form_label,
    number,
    sampling_lines,
    score_lines,
    short,
)


@functools.cache
def static(name: str) -> str:
    """A file of the package's ``reporting/static`` folder, read when a page is first written (not
    when the plugin loads): ``report.css``, the pages' style, and ``filters.js``, their only script,
    which shows the rows (elements with data-groups) of the pressed filter whose data-search holds
    the search box's text, and keeps both in the page's address. Which filter a row belongs to is
    decided in Python."""
    folder = resources.files("pytest_llmdeterminism.reporting").joinpath("static")
    return folder.joinpath(name).read_text("utf-8").rstrip("\n")

# The report's filters: name, label, and which checks each shows (verdict, passed).
_CHECK_FILTERS: tuple[tuple[str, str, Callable[[str, bool], bool]], ...] = (
    ("all", "all", lambda verdict, passed: True),
    ("changed", "changed", lambda verdict, passed: verdict != "IDENTICAL"),
    ("failed", "failed", lambda verdict, passed: not passed),
    ("regression", "REGRESSION", lambda verdict, passed: verdict == "REGRESSION"),
    ("near-tie", f"near ties ({', '.join(v.value for v in Verdict.by_risk() if v.flip)})",
     lambda verdict, passed: Verdict.is_flip(verdict)),
    ("drift", "drift (LOGIT_DRIFT)", lambda verdict, passed: verdict == "LOGIT_DRIFT"),
)

def filter_bar(filters: Sequence[tuple[str, str, int]], *, placeholder: str) -> str:
    """Filter buttons (name, label, rows it shows) and a search box, for ``filters.js`` (:func:`static`)."""
    import html

    buttons = "".join(f'<button type="button" data-filter="{name}" aria-pressed="{_js_bool(name == "all")}">'
                      f"{html.escape(label)} ({n})</button>" for name, label, n in filters)
    return (f'<div class="filters"><span class="label">show</span>{buttons}'
            f'<input id="search" type="search" placeholder="{html.escape(placeholder)}" '
            f'aria-label="search"><span class="label" id="shown"></span></div>')


def _js_bool(value: bool) -> str:
    return "true" if value else "false"


def filter_attributes(groups: Sequence[str], searched: Sequence[str | None]) -> str:
    """The attributes that put a row under ``groups`` and make it found by the texts ``searched``."""
    import html

    text = " ".join(value for value in searched if value)
    return f'data-groups="{html.escape(" ".join(groups))}" data-search="{html.escape(text)}"'


def _visible(text: str) -> str:
    """Whitespace a reader can see: a token that is a space or a new line is not an empty box."""
    return text.replace(" ", "·").replace("\t", "→").replace("\n", "↵")


def _html_inputs(check: dict[str, Any]) -> str:
    """Both sides' input of a check whose input changed: prompt (the differing rest marked), the
    window of token ids (the first differing one marked), and the other input fields that changed."""
    import html

    old, new = check["inputs"]["expected"], check["inputs"]["actual"]
    first_char = first_difference(old["prompt"], new["prompt"])
    first_id = check.get("first_input_difference")
    rows = []
    for label, side in (("recorded input", old), ("new input", new)):
        text = side["prompt"]
        marked = (html.escape(_visible(text[:first_char])) + "<mark>"
                  + html.escape(_visible(text[first_char:])) + "</mark>"
                  ) if old["prompt"] != new["prompt"] else html.escape(_visible(text))
        ids = [f"<mark>{token}</mark>" if side["ids_from"] + i == first_id else str(token)
               for i, token in enumerate(side["prompt_token_ids"])]
        more = side["ids_total"] > side["ids_from"] + len(ids)
        shown = f"[{'…, ' if side['ids_from'] else ''}{', '.join(ids)}{', …' if more else ''}]"
        form = html.escape(form_label(side["prompt_form"], side["prompt_form"]).strip() or "text")
        rows.append(f'<div class="tokens"><span class="label">{label}</span>'
                    f'<span class="input">{form}: {marked}'
                    f"<br>{side['ids_total']} ids from position {side['ids_from']}: {shown}</span></div>")
    where = "same ids" if first_id is None else f"ids differ from position {first_id}"
    fields = "".join(f"<br>{html.escape(field)}: {html.escape(short(values[0]))} → "
                     f"{html.escape(short(values[1]))}" for field, values in check["input_diff"].items())
    return (f'<div class="label" style="width:auto">the input changed ({where}); outputs were not compared'
            f"{fields}</div>{''.join(rows)}")


def _bar_width(margin: float | None) -> int:
    """Pixels of the bar under a token: 6 per unit of margin, from 2 to 60. A margin beyond 10 (1e308
    too) is a full bar, and so is a JSON null (a margin that was not finite: the golden had stopped)."""
    if margin is None or math.isnan(margin):
        return 60
    return max(2, int(min(margin, 10.0) * 6))


def run_report_html(document: dict[str, Any]) -> str:
    """A self-contained page that leads with the run (model, commits, versions, shape), the next
    steps and the time per test; then per check, riskiest first (failing, then by verdict, the most
    confident divergence first), both continuations token by token, the divergent token
    highlighted, a bar under each token for the model's margin at that step, and a tooltip with
    its logprob and the top 5."""
    import html

    summary = document["summary"]
    rows = "".join(f"<tr><td>{html.escape(v)}</td><td>{n}</td></tr>"
                   for v, n in summary["by_verdict"].items())
    filters = [(name, label, sum(shows(c["verdict"], c["passed"]) for c in document["checks"]))
               for name, label, shows in _CHECK_FILTERS]
    sections = [_section(check) for check in sorted(document["checks"], key=_risk)]
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>LLM golden checks</title>'
            f"<style>{static('report.css')}</style></head><body><h1>LLM golden checks</h1>{_lead(document)}"
            f"<p>{summary['checks']} checks, {summary['failed']} failed. Bars under tokens show the model's "
            f"top-1/top-2 margin at that step (amber: near tie); the divergent token is outlined; hover a "
            f"token for its logprob and the top 5.</p>"
            f"<table><tr><th>verdict</th><th>checks</th></tr>{rows}</table>{_times(document)}"
            f"{filter_bar(filters, placeholder='search tests, goldens, prompts, outputs')}"
            f"{''.join(sections)}<script>{static('filters.js')}</script></body></html>\n")


def _risk(check: dict[str, Any]) -> tuple[bool, int, float]:
    """Riskiest first: failing checks, then the worse verdict, then the more confident divergence."""
    return check["passed"], Verdict.risk_of(check["verdict"]), -confidence(check)


def _lead(document: dict[str, Any]) -> str:
    """The run's header and the next steps (the commands the terminal gives)."""
    import html

    header = header_lines(document.get("header") or {})
    steps = document.get("next_steps") or []
    run = (f'<p class="run">{" · ".join(html.escape(line) for line in header)}</p>' if header else "")
    return run + (f'<h2>Next steps</h2><pre class="next">{html.escape(chr(10).join(steps))}</pre>'
                  if steps else "")


def _times(document: dict[str, Any]) -> str:
    """Time per test with golden checks, slowest first."""
    import html

    rows = times_per_test(document["checks"])
    if not rows:
        return ""
    body = "".join(f"<tr><td><code>{html.escape(test)}</code></td><td>{n}</td><td>{failed}</td>"
                   f"<td>{seconds:.1f}</td></tr>" for test, n, failed, seconds in rows)
    return (f"<h2>Time per test (slowest first; {sum(row[3] for row in rows):.1f} s in all)</h2>"
            f"<table><tr><th>test</th><th>checks</th><th>failed</th><th>seconds</th></tr>{body}</table>")


def _tokens(check: dict[str, Any]) -> str:
    """Both sides' tokens, each with its margin's bar and a tooltip: step, id, margin, logprob, top 5."""
    import html

    flipped = Verdict.is_flip(check["verdict"]) or check["verdict"] == Verdict.REGRESSION.value
    step = check["first_divergence"] if flipped else None
    new_from = check.get("judged_steps", 0) if check.get("new_steps") else None
    labels = {"expected": "recorded output", "actual": "new output"} if check.get("inputs") else {}
    tie_margin = check.get("tie_margin") or 0.0  # the comparator's near-tie margin for this check
    kind = kinds.KINDS.get(check.get("kind", kinds.GENERATION.name))
    where = kind.step_noun if kind is not None else "step"  # what one of its steps is called
    lines = []
    for side in ("expected", "actual"):
        tops = (check.get("top_steps") or {}).get(side, [])
        tokens = []
        for index, (piece, token, margin, logprob) in enumerate(check["steps"].get(side, [])):
            tie = margin is not None and margin < tie_margin
            fresh = side == "actual" and new_from is not None and index >= new_from
            classes = ("tok" + (" div" if index == step else "") + (" tie" if tie else "")
                       + (" new" if fresh else ""))
            top = tops[index] if index < len(tops) else []
            title = "\n".join([f"{where} {index}, id {token}, margin {number(margin)}",
                               *([f"logprob {number(logprob)}"] if logprob is not None else []),
                               *([f"top {len(top)}: " + ", ".join(f"{t} {number(lp)}" for t, lp in top)]
                                 if top else []),
                               *(["new: not judged"] if fresh else [])])
            tokens.append(f'<span class="{classes}" title="{html.escape(title)}">'
                          f'{html.escape(_visible(piece))}'
                          f'<span class="bar" style="width:{_bar_width(margin)}px"></span></span>')
        if tokens:
            label = labels.get(side, side)
            lines.append(f'<div class="tokens"><span class="label">{label}</span>{"".join(tokens)}</div>')
    return "".join(lines)


def _section(check: dict[str, Any]) -> str:
    """One check's card: verdict, test and golden, the numbers that decided it, its input, its tokens."""
    import html

    status = "passed" if check["passed"] else "failed"
    variant = (f"{check['run_variant']} run, compared with {check['variant']}" if check.get("run_variant")
               else check["variant"])
    prompt = (f'<div class="tokens"><span class="label">prompt</span><span class="prompt">'
              f'{html.escape(_visible(check["prompt"]))}</span></div>' if check.get("prompt") else "")
    if check.get("inputs"):
        prompt = _html_inputs(check)
    changed = "; ".join(f"{html.escape(k)}: {html.escape(str(v[0]))} → {html.escape(str(v[1]))}"
                        for k, v in check["changed_fingerprint"].items())
    drift = check["verdict"] == "LOGIT_DRIFT" or check["max_logprob_delta"]
    detail = [f"profile {html.escape(check['profile'])}" if check["profile"] else "",
              f"max |Δlogprob| in top-k {delta(check['max_logprob_delta'])}" if drift else "",
              (f"first divergence at step {check['first_divergence']}"
               if check["first_divergence"] is not None else ""),
              (f"golden margin {number(check['golden_margin'])}"
               if check["golden_margin"] is not None else ""),
              html.escape(sampling_lines(check)[0]) if check.get("sampling") else "",
              html.escape(budget_text(check)) if check.get("new_steps") else "",
              f"changed: {changed}" if changed else ""]
    # a score's evidence: one position per line
    score = "".join(f"<li>{html.escape(line)}</li>" for line in
                    (score_lines(check) if check.get("log_likelihood") else []))
    groups = [name for name, _, shows in _CHECK_FILTERS if shows(check["verdict"], check["passed"])]
    searched = (check["test"], check["name"], check["verdict"], check.get("prompt"),
                check.get("expected_text"), check.get("actual_text"))
    return (f'<section class="{status}" {filter_attributes(groups, searched)}>'
            f'<div><span class="verdict">{html.escape(check["verdict"])}</span> '
            f'<code>{html.escape(check["test"])}</code> — <code>{html.escape(check["name"])}</code> '
            f'[{html.escape(variant)}]</div><div class="label" style="width:auto">'
            f'{" · ".join(d for d in detail if d)}</div>'
            f'{f"<ul class=score>{score}</ul>" if score else ""}{prompt}{_tokens(check)}</section>')
