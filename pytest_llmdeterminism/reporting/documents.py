"""The ``--llm-report`` documents: the JSON report (the schema ``llm-golden merge`` reads back), and
the Markdown pull-request comment (``markdown_report``) and self-contained HTML page
(``html_report``) built from it. :data:`REPORT_FORMATS` is the one table of formats: the run's
writer, ``llm-golden merge``'s writer and both option checks read it (a new format is one row and
its module)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.reporting.html_report import run_report_html
from pytest_llmdeterminism.reporting.markdown_report import run_report_markdown, shards_markdown

if TYPE_CHECKING:
    from pytest_llmdeterminism.reporting.records import CheckRecord, RunRecord

__all__ = ["REPORT_FORMATS", "REPORT_SCHEMA", "REPORT_VERSION", "ReportFormat", "format_of", "json_text",
           "repeated_format", "run_report", "run_report_html", "run_report_markdown", "shards_markdown",
           "suffixes"]


REPORT_SCHEMA = "pytest-llmdeterminism/report"
REPORT_VERSION = 1


def run_report(checks: Sequence[CheckRecord], audits: Sequence[tuple[str, dict[str, Any]]], *,
               run: RunRecord | None = None, lead: dict[str, Any] | None = None) -> dict[str, Any]:
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

    ``lead``, what the reports lead with: ``header`` (field -> the values the checks ran: model,
    model_commit, commit (the code's), torch, transformers, batch_shape, ...) and ``next_steps``
    (the commands the terminal gives).
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
                         **({"run": msgspec.to_builtins(run)} if run is not None else {}),
                         **(lead or {})})


@dataclass(frozen=True)
class ReportFormat:
    """One report format: the path suffix that picks it, what it is for (the options' help), and how
    a report document and its Markdown (the run's, or a merge's with its shards section) become the
    file's text."""

    suffix: str
    purpose: str
    render: Callable[[dict[str, Any], str], str]
    # its document also says what the run checked (``run``: what ``llm-golden merge`` reads back)
    records_the_run: bool = False


REPORT_FORMATS: list[ReportFormat] = [
    ReportFormat(".json", "machine-readable", lambda document, _: json_text(document), records_the_run=True),
    ReportFormat(".md", "pull-request comment", lambda _, markdown: markdown),
    ReportFormat(".html", "for reviewers", lambda document, _: run_report_html(document)),
]


def format_of(path: PurePath | str) -> ReportFormat | None:
    """The format a report path's suffix picks, or None."""
    suffix = PurePath(path).suffix
    return next((found for found in REPORT_FORMATS if found.suffix == suffix), None)


def suffixes(last: str | None = "or", *, purposes: bool = False) -> str:
    """The suffixes as a sentence lists them: ``.json, .md or .html`` (``last=None``: ``.json, .md,
    .html``; ``purposes``: ``.json (machine-readable), ...``)."""
    words = [f"{found.suffix} ({found.purpose})" if purposes else found.suffix for found in REPORT_FORMATS]
    if last is None or len(words) < 2:
        return ", ".join(words)
    return f"{', '.join(words[:-1])} {last} {words[-1]}"


def repeated_format(paths: Sequence[PurePath]) -> str | None:
    """The first suffix (in sorted order) that two report paths share: one report per format."""
    given = [path.suffix for path in paths]
    return next(iter(sorted({suffix for suffix in given if given.count(suffix) > 1})), None)


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
