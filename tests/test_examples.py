"""The example suite a new user copies must pass as shipped, and its negative control must fail."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "examples" / "__golden__" / "test_tiny_model.json"


def run_examples(**env):
    return subprocess.run(
        [sys.executable, "-m", "pytest", "examples", "-p", "no:cacheprovider", "-p", "no:randomly"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False, env={**os.environ, **env},
    )


def test_example_suite_passes_against_committed_goldens():
    before = GOLDEN.read_bytes()
    result = run_examples()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "golden checks: 8 IDENTICAL" in result.stdout
    assert "7 passed" in result.stdout
    assert GOLDEN.read_bytes() == before


def test_negative_control_is_caught():
    before = GOLDEN.read_bytes()
    result = run_examples(LLMDET_PLANT_DEFECT="1")
    assert result.returncode == 1, result.stdout[-3000:]
    assert "REGRESSION" in result.stdout
    assert "golden mismatch" in result.stdout
    assert GOLDEN.read_bytes() == before
