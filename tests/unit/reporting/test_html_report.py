"""The HTML report's lines and variants, built without a run (reporting/documents.py; the user's
journey through pytest itself: tests/pytester/test_workflow.py)."""


def test_html_report_shows_new_lines_and_the_variant_actually_compared():
    from pytest_llmdeterminism.reporting import documents
    from pytest_llmdeterminism.reporting.records import CheckRecord

    check = CheckRecord(test="t.py::test_x", name="test_x", variant="cpu/float32", run_variant="cpu/bfloat16",
                        verdict="LOGIT_DRIFT", passed=True, prompt="def f():\n", max_logprob_delta=0.02,
                        steps={"actual": [("\n", 13, 2.0, -0.1), ("    ", 220, 3.0, -0.05)]})
    page = documents.run_report_html(documents.run_report([check], []))
    assert "def·f():↵" in page and ">↵<" in page and ">····<" in page
    assert "cpu/bfloat16 run, compared with cpu/float32" in page
