"""Prompt suites as data: test_*.llm.jsonl lines become golden-checked items, generated B at a time."""

import json

import pytest

PROMPTS = ["The capital of France is", "Count: one,", "The sky is", "Hello, world!", "The cat sat on the",
           "def add(a, b):", "Once upon a time", "Q: What is the capital of Peru? A:", "The weather today is",
           "My favourite colour is", "Count: three,", "The colour of the grass is", "Q: What is the capital of Kenya? A:",
           "def mul(a, b):", "The snow is", "Hello, model!"]

CHECK_ALONE = """
import json
from pathlib import Path
from pytest_llmdeterminism import assert_tokens_match

def test_each_prompt_alone_matches_the_batched_suite(llm_model):
    goldens = json.loads(Path("__golden__/test_prompts.llm.json").read_text())["goldens"]
    cases = [json.loads(line) for line in Path("test_prompts.llm.jsonl").read_text().splitlines()]
    assert len(goldens) == len(cases) == 16
    for case in cases:
        alone = llm_model.generate(case["prompt"], **({"max_new_tokens": case["max_new_tokens"]}
                                                      if "max_new_tokens" in case else {}))
        assert_tokens_match(alone, goldens[case["id"]]["cpu/float32"])
"""


def write_suite(pytester):
    lines = [json.dumps({"id": f"case-{i:02d}", "prompt": p, **({"max_new_tokens": 3} if i % 5 == 0 else {})})
             for i, p in enumerate(PROMPTS)]
    (pytester.path / "test_prompts.llm.jsonl").write_text("\n".join(lines) + "\n")


def test_jsonl_suite_of_16_prompts_records_checks_and_matches_one_at_a_time(suite):
    write_suite(suite)
    recorded = suite.runpytest("--llm-golden-update", "-v")
    recorded.assert_outcomes(passed=16)
    recorded.stdout.fnmatch_lines(["test_prompts.llm.jsonl::case-00 PASSED*", "*golden checks: 16 recorded"])
    suite.runpytest().assert_outcomes(passed=16)
    suite.makepyfile(test_alone=CHECK_ALONE)
    suite.runpytest("test_alone.py").assert_outcomes(passed=1)


def test_a_changed_model_fails_the_affected_lines_only(suite, tmp_path):
    from .conftest import perturbed_tiny_copy

    write_suite(suite)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=16)
    drifted = perturbed_tiny_copy(tmp_path / "drifted", scale=1e-4)
    result = suite.runpytest(f"--llm-model={drifted}", "--llm-tolerance=tokens")
    result.assert_outcomes(passed=16)
    result.stdout.fnmatch_lines(["golden checks: 16 LOGIT_DRIFT"])


@pytest.mark.parametrize(("line", "problem"), [
    ('{"id": "a"}', 'expected an object with string "id" and "prompt"'),
    ('{"id": "a", "prompt": "x", "temperature": 0.7}', "unknown field(s); accepted: id, max_new_tokens, prompt, tolerance"),
    ('{"id": "a", "prompt": "x", "max_new_tokens": 0}', "max_new_tokens must be an integer >= 1"),
    ("not json", "not valid JSON"),
])
def test_bad_lines_are_collection_errors_naming_file_and_line(suite, line, problem):
    (suite.path / "test_bad.llm.jsonl").write_text('{"id": "ok", "prompt": "x"}\n' + line + "\n")
    result = suite.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*test_bad.llm.jsonl:2*{problem}*"])
