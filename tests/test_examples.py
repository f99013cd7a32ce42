"""The example suite a new user copies must pass as shipped, against its committed goldens."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_example_suite_passes_against_committed_goldens():
    golden = ROOT / "examples" / "__golden__" / "test_tiny_model.json"
    before = golden.read_bytes()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "examples", "-p", "no:cacheprovider", "-p", "no:randomly"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "golden checks: 8 IDENTICAL" in result.stdout
    assert "7 passed" in result.stdout
    assert golden.read_bytes() == before


def test_negative_control_is_caught():
    golden = ROOT / "examples" / "__golden__" / "test_tiny_model.json"
    before = golden.read_bytes()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "examples", "-p", "no:cacheprovider", "-p", "no:randomly"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "LLMDET_PLANT_DEFECT": "1"},
    )
    assert result.returncode == 1, result.stdout[-3000:]
    assert "REGRESSION" in result.stdout
    assert "golden mismatch" in result.stdout
    assert golden.read_bytes() == before
