"""What the tests build pytester projects from and read them back with: the suites (the tiny model's
workflow suite, the SmolLM2 one), the project builder, the ``llm-golden`` runner and the golden reader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# Four tests, six checks on the tiny model: the user's workflow (tests/pytester/test_workflow.py).
SUITE = """
import pytest
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=6)
def test_capital(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Q: What is the capital of Japan? A:"))

@deterministic
@pytest.mark.parametrize("prompt", ["Count: one,", "The cat sat on the"])
def test_param(llm_model, golden_tokens, prompt):
    golden_tokens.check(llm_model.generate(prompt))

@deterministic
def test_two_checks(llm_model, golden_tokens):
    first, second = llm_model.generate(["The colour of the sky is", "Hello, world!"])
    golden_tokens.check(first)
    golden_tokens.check(second)
    golden_tokens.check(llm_model.generate("def add(a, b):"), name="code")
"""
GOLDEN = "__golden__/test_suite.json"

REAL_GOLDEN = "__golden__/test_real.json"

# Three tests on the real SmolLM2-135M-Instruct (tests/real_model, tests/engines).
REAL_SUITE = """
from pytest_llmdeterminism import deterministic

PROMPTS = ["The capital of France is", "def fibonacci(n):", "The three primary colours are"]

@deterministic(max_new_tokens=12)
def test_capital(llm_model, golden_tokens):
    result = llm_model.generate("The capital of France is")
    assert "Paris" in result.text
    golden_tokens.check(result)

@deterministic(max_new_tokens=8)
def test_batch_matches_alone(llm_model, golden_tokens):
    batched = llm_model.generate(PROMPTS)
    for prompt, result in zip(PROMPTS, batched):
        assert llm_model.generate(prompt) == result
        golden_tokens.check(result, name=prompt)

@deterministic(max_new_tokens=8, batch_shape="2x64")
def test_chat(llm_model, golden_tokens):
    result = llm_model.generate([{"role": "user", "content": "What is the capital of France?"}])
    assert result.prompt.endswith("<|im_start|>assistant\\n") and "Paris" in result.text
    golden_tokens.check(result)
"""


def suite_project(suite: pytest.Pytester, *, recorded: bool = False) -> pytest.Pytester:
    """The workflow ``SUITE`` written into a pytester project (the ``suite`` fixture's); with
    ``recorded``, its goldens recorded (4 passed)."""
    suite.makepyfile(test_suite=SUITE)
    if recorded:
        suite.runpytest("--llm-golden-update").assert_outcomes(passed=4)
    return suite


def read_goldens(project: pytest.Pytester | Path, path: str = GOLDEN) -> dict[str, Any]:
    """The ``goldens`` of the golden file at ``path`` in a pytester project (or a folder)."""
    root = project.path if isinstance(project, pytest.Pytester) else project
    return json.loads((root / path).read_text())["goldens"]


def golden_keys(project: pytest.Pytester | Path, path: str = GOLDEN) -> list[str]:
    """The test keys of a golden file, sorted."""
    return sorted(read_goldens(project, path))


def llm_golden(*args: object, cwd: Path | None = None, env: dict[str, str] | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``llm-golden ARGS`` as a command, run by this Python (the installed package); ``timeout`` only
    keeps a hung command from hanging the suite."""
    return subprocess.run([sys.executable, "-m", "pytest_llmdeterminism.cli", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, check=False, timeout=timeout)


def git_checkout(root: Path) -> str:
    """Make ``root`` a git checkout with one (empty) commit, as a CI job's project is (``llm-golden
    merge --prune`` prunes only on reports of the commit checked out); returns the commit."""
    settings = ["-c", "user.name=test", "-c", "user.email=test@example.com", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", *settings, "commit", "-q", "--allow-empty", "-m", "suite"], cwd=root, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, check=True, capture_output=True,
                          text=True).stdout.strip()


def usage_error(pytester, ini: str | None, *args: str):
    """Run pytest on a one-test project with ``ini`` and ``args``; it must stop with a usage error."""
    if ini is not None:
        pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    return result
