"""Eval goldens end to end: ``golden_tokens.check(llm_model.evaluate(items))`` recorded, re-read
IDENTICAL at another batch shape, and a planted label swap failing as a REGRESSION that names its
item, with the accuracy, the flips and the gate first, in the terminal and in the JSON and Markdown
reports."""

from __future__ import annotations

import json

from tests.helpers.projects import llm_golden

GOLDEN = "__golden__/test_e.json"


def write_suite(suite, swapped=()):
    suite.makepyfile(test_e=f"""
from pytest_llmdeterminism import deterministic

SWAPPED = {set(swapped)!r}


def items():
    found = []
    for i in range(12):
        # the tiny model answers " green" (1) to every question: item i is right where its label is 1
        label = 1 if i % 2 else 0
        if f"q{{i}}" in SWAPPED:
            label = 1 - label
        found.append({{"id": f"q{{i}}", "prompt": f"Question {{i}}: which colour is the sky? Answer:",
                       "choices": [" blue", " green", " red"], "label": label}})
    return [*found, {{"id": "capital", "prompt": "The capital of France is", "answer": "Paris"}}]


@deterministic
def test_eval(llm_model, golden_tokens):
    golden_tokens.check(llm_model.evaluate(items()))
""")


def test_an_eval_golden_is_recorded_reread_at_another_shape_and_a_label_swap_is_a_regression(suite):
    write_suite(suite)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    entry = json.loads((suite.path / GOLDEN).read_text())["goldens"]["test_eval"]["cpu/float32"]
    assert entry["kind"] == "eval" and len(entry["items"]) == 13
    assert [item["choice"] for item in entry["items"][:12]] == [1] * 12  # what the comment above says
    before = (suite.path / GOLDEN).read_bytes()
    again = suite.runpytest("--llm-batch-shape=2x64", "--llm-report=report.json")
    again.assert_outcomes(passed=1)
    assert (suite.path / GOLDEN).read_bytes() == before
    report = json.loads((suite.path / "report.json").read_text())
    assert [(check["kind"], check["verdict"]) for check in report["checks"]] == [("eval", "IDENTICAL")]
    write_suite(suite, swapped=["q3"])  # q3 was right: its answer key now says another choice
    failed = suite.runpytest("--llm-report=failed.json", "--llm-report=failed.md",
                             "--llm-golden-artifacts=cands")
    failed.assert_outcomes(failed=1)
    (check,) = json.loads((suite.path / "failed.json").read_text())["checks"]
    assert check["kind"] == "eval" and check["finding"].startswith("accuracy 46.15 % -> 38.46 %")
    assert any(line.startswith("  q3: REGRESSION") for line in check["evidence"])
    markdown = (suite.path / "failed.md").read_text()
    assert "### What the checks' own rules found" in markdown and "q3: REGRESSION" in markdown
    out = failed.stdout.str()
    assert "REGRESSION at item 3 — accuracy 46.15 % -> 38.46 %: 1 right->wrong, 0 wrong->right, " \
           "1 decision(s) changed; gate INCONCLUSIVE" in out
    assert "q3: REGRESSION, choice 1 -> 1 (right -> wrong; its label changed: 1 -> 0)" in out
    diff = llm_golden("diff", "__golden__", "cands/__golden__", cwd=suite.path)  # review carries evals too
    assert diff.returncode == 1
    assert "test_e.json ['test_eval']['cpu/float32']  accuracy 46.15 % -> 38.46 %" in diff.stdout
    assert diff.stdout.startswith("REGRESSION ")
    gated = suite.runpytest("-o", "llm_tolerance=gate")  # one confident loss: INCONCLUSIVE fails the gate
    gated.assert_outcomes(failed=1)
    assert "gate INCONCLUSIVE — fails under 'gate(margin=0.05, atol=0.001)'" in gated.stdout.str()
    assert (suite.path / GOLDEN).read_bytes() == before
