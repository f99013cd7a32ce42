"""The example suite a new user copies must pass as shipped, and its negative control must fail."""

import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import version

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.subprocess  # every test here runs pytest on examples/

GOLDEN = ROOT / "examples" / "__golden__" / "test_tiny_model.json"


def run_examples(*args, **env):
    # as shipped: with Hypothesis's pytest plugin (examples/test_batch_invariance.py), which the suite's
    # children otherwise go without (tests/conftest.py, CHILD_PYTEST_ADDOPTS)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "examples", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-p", "hypothesispytest", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False, env={**os.environ, **env},
    )


def test_example_suite_passes_against_committed_goldens():
    before = GOLDEN.read_bytes()
    result = run_examples()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    # 9 generations, 3 scores (test_score.py), an eval of 60 items (test_eval.py)
    assert "golden checks: 13 IDENTICAL" in result.stdout
    assert "11 passed" in result.stdout
    assert GOLDEN.read_bytes() == before


def test_negative_control_is_caught():
    """The CI page's first step, built in: no conftest of the examples' own perturbs the model."""
    assert not (ROOT / "examples" / "conftest.py").exists()
    before = GOLDEN.read_bytes()
    result = run_examples("--llm-plant-defect")
    assert result.returncode == 1, result.stdout[-3000:]
    assert "llm: PLANTED DEFECT on (--llm-plant-defect)" in result.stdout
    assert "REGRESSION" in result.stdout
    assert "golden mismatch" in result.stdout
    # (a test whose own assertion on the text fails first never reaches its golden check)
    assert re.search(r"planted defect caught: all \d+ golden check\(s\) failed, as they must", result.stdout)
    assert GOLDEN.read_bytes() == before


def example_project(tmp_path, golden, *pytest_args):
    """The example suite in ``tmp_path`` with ``tests/data/<golden>`` as its golden file; returns a
    function that runs pytest there (outside CI, so goldens may be judged across environments)."""
    for name in ("pytest.ini", "test_tiny_model.py"):
        shutil.copy(ROOT / "examples" / name, tmp_path / name)
    (tmp_path / "__golden__").mkdir()
    # The variable under test is the kernels those goldens were computed with. A transformers release
    # since they were recorded is another difference that changes the report's hint: the copy says
    # the installed transformers, so these tests do not depend on which release CI installs.
    text = (ROOT / "tests" / "data" / golden).read_text()
    text = text.replace('"transformers": "5.24.0"', f'"transformers": "{version("transformers")}"')
    (tmp_path / "__golden__" / "test_tiny_model.json").write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "CI"}

    def run(*args):
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *pytest_args, *args],
                              cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False, env=env)

    return run


def test_goldens_recorded_natively_by_0_1_0_on_intel_still_pass_across_environments(tmp_path):
    """Goldens from before portable numerics (Intel AVX512, native kernels) are another environment:
    judged by near-tie tolerance, never silently exact, and re-recordable on demand."""
    # the chat example came after 0.1.0: that file has no golden for it
    run = example_project(tmp_path, "test_tiny_model.intel-avx512-native-0.1.0.json", "-k", "not test_chat")

    across = run()
    assert across.returncode == 0, across.stdout[-3000:]
    assert "compared across environments: machine None → " in across.stdout
    assert "cpu_numerics None → 'portable'" in across.stdout
    assert "tolerance near_tie(margin=0.05, atol=0.001) by default" in across.stdout
    assert "6 passed" in across.stdout
    exact = run("--llm-tolerance=exact")
    assert exact.returncode == 1 and "LOGIT_DRIFT (failed)" in exact.stdout, exact.stdout[-3000:]


def test_goldens_recorded_as_portable_before_its_avx2_kernels_pass_and_say_how_to_compare_exactly(tmp_path):
    """The example goldens as recorded before portable numerics moved to AVX2 kernels (ATen's AVX2
    kernels, oneDNN's AVX2 GEMM): another environment under today's portable, judged by near-tie
    tolerance with the setting that compares them exactly, and IDENTICAL under compatible."""
    # those goldens ran the previous kernels, before batch-invariant ones became the default
    run = example_project(tmp_path, "test_tiny_model.portable-generic-0.2.json", "-p", "no:randomly",
                          "--llm-batch-invariant=false")

    across = run()
    assert across.returncode == 0, across.stdout[-3000:]
    # the line also names any library upgraded since the goldens were recorded (transformers, ...)
    changed = next((line for line in across.stdout.splitlines()
                    if "compared across environments:" in line), "")
    assert "cpu_numerics 'compatible' → 'portable'" in changed, across.stdout[-3000:]
    assert "cpu_capability 'DEFAULT' → 'AVX2'" in changed, across.stdout[-3000:]
    assert "compare exactly again with --llm-cpu-numerics=compatible" in across.stdout
    assert "IDENTICAL" not in across.stdout  # never silently exact
    compatible = run("--llm-cpu-numerics=compatible")
    assert compatible.returncode == 0, compatible.stdout[-3000:]
    assert "golden checks: 9 IDENTICAL" in compatible.stdout
    assert "compared across environments" not in compatible.stdout
