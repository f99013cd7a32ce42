"""The plugin as pytest loads it: registered, its marker documented in ``--markers``; and the pure
layers' unit tests run without importing torch."""

import subprocess
import sys

import pytest

from tests.helpers import ROOT


@pytest.mark.subprocess
def test_plugin_is_registered_and_marker_documented(pytester):
    result = pytester.runpytest_subprocess("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.deterministic(seed=None, max_new_tokens=None, "
                                 "batch_shape=None, tolerance=None, concurrency=None)*"])


@pytest.mark.fresh_python  # it tests what a new Python imports
@pytest.mark.subprocess
def test_the_unit_tests_load_no_model(tmp_path):
    """The comparator, tolerance, store, ledger and layering tests run without torch: only tests that
    run pytest in-process, or ask for a model, import it."""

    tests = ROOT / "tests" / "unit"
    files = [str(tests / name) for name in ("judge/test_compare.py", "goldens/test_store.py",
                                            "run/test_ledger.py", "test_layers.py")]
    code = ("import sys, pytest; "
            f"code = pytest.main([*{files!r}, '-q', '-p', 'no:cacheprovider', '-p', 'no:randomly']); "
            "print('RESULT', code, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                         cwd=tmp_path)
    assert "RESULT 0 False" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
