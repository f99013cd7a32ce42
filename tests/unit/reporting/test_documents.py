"""Report formats are one table (``reporting.documents.REPORT_FORMATS``): ``llm-golden merge``'s
check and writer take a format added there, and refuse a suffix no row has, naming the table's.
The run's side: tests/pytester/test_report_formats.py."""

from __future__ import annotations

from pathlib import Path

from pytest_llmdeterminism.reporting import documents
from pytest_llmdeterminism.run import merge_writer


def _plain_text() -> documents.ReportFormat:
    return documents.ReportFormat(".txt", "plain text",
                                  lambda document, _: f"{len(document['checks'])} checks\n")


def test_merge_checks_and_writes_the_formats_of_the_table(monkeypatch, tmp_path):
    assert merge_writer.report_problems([Path("merged.txt")]) == (
        "--report 'merged.txt': expected a path ending in .json, .md or .html")
    monkeypatch.setattr(documents, "REPORT_FORMATS", [*documents.REPORT_FORMATS, _plain_text()])
    assert merge_writer.report_problems([Path("merged.txt"), Path("merged.json")]) is None
    assert merge_writer.report_problems([Path("a.txt"), Path("b.txt")]) == (
        "two .txt reports; give one --report per format (.json, .md, .html, .txt)")
    chosen = documents.format_of(tmp_path / "merged.txt")
    assert chosen is not None and chosen.render({"checks": [{}, {}]}, "") == "2 checks\n"
