"""Report formats are one table (``reporting.documents.REPORT_FORMATS``): a format added there by a
plugin (``-p``) is accepted by ``--llm-report``'s check and written by the run's writer; every other
suffix is refused naming them all. ``llm-golden merge``'s side: tests/unit/reporting/test_documents.py."""

from __future__ import annotations

import pytest

PLUGIN = """
from pytest_llmdeterminism.reporting import documents

documents.REPORT_FORMATS.append(documents.ReportFormat(
    ".txt", "plain text", lambda document, markdown: f"{document['summary']['checks']} checks\\n"))
"""
SUITE = """
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=3)
def test_one(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Hello"))
"""


@pytest.mark.subprocess
def test_a_format_added_to_the_table_is_checked_and_written_by_the_run(pytester):
    pytester.makeini("[pytest]\nllm_model = builtin:tiny\nllm_batch_shape = 1x32\n")
    pytester.makepyfile(text_report=PLUGIN, test_suite=SUITE)
    pytester.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    # in a child: the plugin changes the table for the rest of its process
    result = pytester.runpytest_subprocess("-p", "text_report", "--llm-report=out.txt",
                                           "--llm-report=out.json", "-p", "no:randomly")
    result.assert_outcomes(passed=1)
    assert (pytester.path / "out.txt").read_text() == "1 checks\n"
    assert (pytester.path / "out.json").is_file()


def test_a_suffix_no_format_has_is_refused_naming_the_table(pytester):
    pytester.makeini("[pytest]\nllm_model = builtin:tiny\n")
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("--llm-report=out.txt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*expected a path ending in .json, .md or .html, got 'out.txt'*"])
