"""The ``--llm-report`` documents: the JSON report (the schema ``llm-golden merge`` reads back), a
Markdown pull-request comment and a self-contained HTML page, all built from the same document."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.compare import Verdict, within_drift
from pytest_llmdeterminism.reporting.text import (
    delta,
    differing_window,
    first_difference,
    form_label,
    number,
    short,
)
from pytest_llmdeterminism.sampling import settings_text

if TYPE_CHECKING:
    from pytest_llmdeterminism.reporting.records import CheckRecord, RunRecord


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
    decide the bits and differ: non-empty means compared across environments) and ``steps``
    (``expected`` / ``actual``: ``[piece, token id, margin, top-1 logprob]`` per step, at most 64),
    ``expected_text`` (None without a golden) and ``actual_text``; for a sampled generation
    ``sampling`` (sampler, temperature, top_k, top_p, min_p, seed; empty when greedy) and
    ``draw_margin`` (the golden's, where the tokens first differ);
    for INPUT_CHANGED ``inputs``
    (both sides' prompt and id window), ``first_input_difference`` and ``input_diff``; where the
    budgets differ ``max_new_tokens``, ``judged_steps``, ``new_steps`` and ``unchecked_steps``;
    ``kind`` (``"generation"`` or ``"score"``) and, for a score check (its texts are the
    continuation, its ``steps`` per position ``[piece, token id, rank margin, logprob]``),
    ``log_likelihood`` ([golden's, this run's]), ``moved_positions`` (the positions that moved most:
    position, token, piece, both logprobs and ranks, the golden's rank margin) and ``rank_changes``.
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
        lines.append(f"| {_md_code(verdict)} | {n} | {failed} |")
    failing = sorted((c for c in document["checks"] if not c["passed"]), key=lambda c: -_confidence(c))
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
                      *(f"  - {_md(line)}" for line in _sampling_lines(c)),
                      *(f"  - {line}" for line in _text_lines(c))]
    scored = [c for c in document["checks"] if c.get("kind") == "score" and c.get("log_likelihood")
              and (not c["passed"] or c["verdict"] != "IDENTICAL")][:50]
    if scored:
        lines += ["", "### Score checks that moved (log-likelihood of the continuation, golden → now)", ""]
        for c in scored:
            passed = " (passed)" if c["passed"] else ""
            lines += [f"- {_md_code(c['test'])} {_md_code(c['name'])}: {_md_code(c['verdict'])}{passed}",
                      *(f"  - {_md(line)}" for line in score_lines(c))]
    incomplete = [c for c in document["checks"] if c.get("new_steps")]
    if incomplete:
        lines += ["", "### Goldens shorter than this run (re-record with `--llm-golden-update`)", ""]
        lines += [f"- {_md_code(c['test'])} {_md_code(c['name'])}: {_md(_budget_text(c))}"
                  for c in incomplete[:50]]
    return "\n".join(lines) + "\n"


def score_lines(check: dict[str, Any]) -> list[str]:
    """A score check's evidence as report lines: the log-likelihood before and after, the positions
    that moved most (token, old and new logprob), the rank changes."""
    old, new = check["log_likelihood"]
    lines = [f"log-likelihood {old:.6f} → {new:.6f} (Δ {new - old:+.3g})"]
    for p in check.get("moved_positions") or []:
        rank = (f", rank {p['expected_rank']} → {p['actual_rank']}"
                if p["expected_rank"] != p["actual_rank"] else "")
        lines.append(f"position {p['position']} {p['piece']!r} (id {p['token']}): "
                     f"{p['expected_logprob']:.6f} → {p['actual_logprob']:.6f}{rank}")
    ranks = check.get("rank_changes") or []
    if ranks:
        lines.append(f"rank changed at {len(ranks)} position(s): " + ", ".join(
            f"{p['position']} ({p['expected_rank']} → {p['actual_rank']})" for p in ranks[:8]))
    return lines


def _draw(check: dict[str, Any]) -> tuple[float, float] | None:
    """A sampled check's draw margin where the tokens parted, and its temperature; None otherwise."""
    temperature = (check.get("sampling") or {}).get("temperature")
    margin = check.get("draw_margin")
    if margin is None or not isinstance(temperature, (int, float)) or temperature <= 0:
        return None
    return margin, float(temperature)


def _confidence(check: dict[str, Any]) -> float:
    """How far from a near tie the golden was where the tokens parted, as a multiple of the bound
    that decided the verdict: the tie margin (or the drift before it, where larger) for a greedy
    check, that over T for the draw margin of a sampled one, so both kinds rank on one scale (the
    raw margin where the report has no tie margin; 0 without a divergence, or where the golden had
    stopped: JSON null)."""
    tie = max(check.get("tie_margin") or 0.0, check.get("max_logprob_delta") or 0.0)
    draw = _draw(check)
    if draw is not None:
        margin, temperature = draw
        return margin / (tie / temperature) if tie else margin
    golden = check.get("golden_margin")
    if golden is None:
        return 0.0
    return float(golden) / tie if tie else float(golden)


def margin_text(check: dict[str, Any]) -> str:
    """The margin that decided a divergence: a sampled check's draw margin (and T), else the golden's;
    a near tie only by the drift before it says so."""
    draw = _draw(check)
    if draw is not None:
        return f"draw {number(draw[0])} (T {draw[1]:g})"
    golden, drift = check["golden_margin"], check.get("max_logprob_delta") or 0.0
    if golden is None:
        return ""
    within = Verdict.is_flip(check["verdict"]) and within_drift(golden, check.get("tie_margin") or 0.0, drift)
    return f"{number(golden)} (within this run's drift {number(drift)})" if within else number(golden)


def drift_text(check: dict[str, Any]) -> str:
    """max |Δlogprob| in top-k before any divergence, where the logits moved; "" where they did not."""
    drift = check["max_logprob_delta"]
    if check["verdict"] != "LOGIT_DRIFT" and not drift:
        return ""
    return delta(drift)


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


def _sampling_lines(check: dict[str, Any]) -> list[str]:
    """A sampled check's settings and, where the tokens parted, the golden's draw margin there."""
    if not check.get("sampling"):
        return []
    margin = check.get("draw_margin")
    return [settings_text(check["sampling"])
            + (f"; the golden's draw margin there {number(margin)}" if margin is not None else "")]


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


def _budget_text(check: dict[str, Any]) -> str:
    old, new = check["max_new_tokens"]
    return (f"max_new_tokens {old} → {new}: judged on the golden's {check['judged_steps']} step(s); "
            f"{check['new_steps']} new step(s) from step {check['judged_steps']} not judged")


HTML_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#222}h1{font-size:20px}
section{border:1px solid #ddd;border-radius:6px;margin:1em 0;padding:.6em 1em}
section.failed{border-color:#d33}.verdict{font-weight:600}
.passed .verdict{color:#1a7f37}.failed .verdict{color:#d33}
.tokens{display:flex;flex-wrap:wrap;gap:2px;margin:.3em 0;align-items:flex-end}
.tok{font-family:ui-monospace,monospace;background:#f3f3f3;padding:1px 3px;border-radius:3px;white-space:pre;
display:flex;flex-direction:column;align-items:center}
.tok.div{background:#ffd7d5;outline:2px solid #d33}.tok .bar{height:4px;background:#4a7bd0;margin-top:2px}
.tok.tie .bar{background:#e8a317}.tok.new{outline:1px dashed #888;background:#fff}
.input{font-family:ui-monospace,monospace;white-space:pre-wrap}mark{background:#ffd7d5}.label{color:#666;font-size:12px;width:5.5em;flex:none}
table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:left}
[hidden]{display:none!important}.filters{margin:1em 0;display:flex;flex-wrap:wrap;gap:6px;align-items:center}
.filters button{font:inherit;padding:2px 10px;border:1px solid #bbb;border-radius:12px;background:#fff;
cursor:pointer}
.filters button[aria-pressed=true]{background:#222;color:#fff;border-color:#222}
.filters input{font:inherit;padding:2px 8px;min-width:16em}.filters .label{width:auto}
"""

# The page's only script: shows the rows (elements with data-groups) of the pressed filter whose
# data-search holds the search box's text. Which filter a row belongs to is decided in Python.
FILTER_SCRIPT = """(function () {
  var active = "all", search = document.getElementById("search");
  var buttons = Array.prototype.slice.call(document.querySelectorAll(".filters button"));
  var rows = Array.prototype.slice.call(document.querySelectorAll("[data-groups]"));
  function apply() {
    var text = search.value.trim().toLowerCase(), shown = 0;
    rows.forEach(function (row) {
      var visible = row.getAttribute("data-groups").split(" ").indexOf(active) >= 0 &&
        (!text || row.getAttribute("data-search").toLowerCase().indexOf(text) >= 0);
      row.hidden = !visible;
      if (visible) { shown += 1; }
    });
    buttons.forEach(function (button) {
      button.setAttribute("aria-pressed", String(button.getAttribute("data-filter") === active));
    });
    document.getElementById("shown").textContent = shown + " of " + rows.length + " shown";
  }
  buttons.forEach(function (button) {
    button.addEventListener("click", function () { active = button.getAttribute("data-filter"); apply(); });
  });
  search.addEventListener("input", apply);
  apply();
})();"""

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
    """Filter buttons (name, label, rows it shows) and a search box, for :data:`FILTER_SCRIPT`."""
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
    """A self-contained page: per check, both continuations token by token, the divergent token
    highlighted, and a bar under each token for the model's margin at that step."""
    import html

    summary = document["summary"]
    rows = "".join(f"<tr><td>{html.escape(v)}</td><td>{n}</td></tr>"
                   for v, n in summary["by_verdict"].items())
    filters = [(name, label, sum(shows(c["verdict"], c["passed"]) for c in document["checks"]))
               for name, label, shows in _CHECK_FILTERS]
    sections = []
    for check in document["checks"]:
        status = "passed" if check["passed"] else "failed"
        flipped = Verdict.is_flip(check["verdict"]) or check["verdict"] == Verdict.REGRESSION.value
        step = check["first_divergence"] if flipped else None
        lines = []
        inputs = check.get("inputs") or {}
        new_from = check.get("judged_steps", 0) if check.get("new_steps") else None
        labels = {"expected": "recorded output", "actual": "new output"} if inputs else {}
        for side in ("expected", "actual"):
            tokens = []
            for index, (piece, token, margin, _) in enumerate(check["steps"].get(side, [])):
                tie_margin = check.get("tie_margin") or 0.0  # the comparator's near-tie margin for this check
                tie = margin is not None and margin < tie_margin
                fresh = side == "actual" and new_from is not None and index >= new_from
                classes = ("tok" + (" div" if index == step else "") + (" tie" if tie else "")
                           + (" new" if fresh else ""))
                title = (f"step {index}, id {token}, margin {number(margin)}"
                         + (", new: not judged" if fresh else ""))
                tokens.append(f'<span class="{classes}" title="{title}">'
                              f'{html.escape(_visible(piece))}'
                              f'<span class="bar" style="width:{_bar_width(margin)}px"></span></span>')
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
                  f"max |Δlogprob| in top-k {delta(check['max_logprob_delta'])}" if drift else "",
                  (f"first divergence at step {check['first_divergence']}"
                   if check["first_divergence"] is not None else ""),
                  (f"golden margin {number(check['golden_margin'])}"
                   if check["golden_margin"] is not None else ""),
                  html.escape(_sampling_lines(check)[0]) if check.get("sampling") else "",
                  html.escape(_budget_text(check)) if check.get("new_steps") else "",
                  f"changed: {changed}" if changed else "",
                  *(html.escape(f"score: {line}") for line in
                    (score_lines(check) if check.get("log_likelihood") else []))]
        groups = [name for name, _, shows in _CHECK_FILTERS if shows(check["verdict"], check["passed"])]
        searched = (check["test"], check["name"], check["verdict"], check.get("prompt"),
                    check.get("expected_text"), check.get("actual_text"))
        sections.append(
            f'<section class="{status}" {filter_attributes(groups, searched)}>'
            f'<div><span class="verdict">{html.escape(check["verdict"])}</span> '
            f'<code>{html.escape(check["test"])}</code> — <code>{html.escape(check["name"])}</code> '
            f'[{html.escape(variant)}]</div><div class="label" style="width:auto">'
            f'{" · ".join(d for d in detail if d)}</div>{prompt}{"".join(lines)}</section>')
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>LLM golden checks</title>'
            f"<style>{HTML_STYLE}</style></head><body><h1>LLM golden checks</h1>"
            f"<p>{summary['checks']} checks, {summary['failed']} failed. Bars under tokens show the model's "
            f"top-1/top-2 margin at that step (amber: near tie); the divergent token is outlined.</p>"
            f"<table><tr><th>verdict</th><th>checks</th></tr>{rows}</table>"
            f"{filter_bar(filters, placeholder='search tests, goldens, prompts, outputs')}"
            f"{''.join(sections)}<script>{FILTER_SCRIPT}</script></body></html>\n")
