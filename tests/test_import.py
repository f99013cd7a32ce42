import subprocess
import sys


def test_import_does_not_load_torch_or_transformers():
    code = ("import sys, pytest_llmdeterminism, pytest_llmdeterminism.plugin; "
            "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_plugin_is_registered_and_marker_documented(pytester):
    result = pytester.runpytest_subprocess("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.deterministic(seed=None, max_new_tokens=None, batch_shape=None, tolerance=None)*"])


def test_public_marker_is_pytest_mark():
    import pytest

    from pytest_llmdeterminism import deterministic

    assert deterministic.name == "deterministic"
    assert deterministic.mark == pytest.mark.deterministic.mark
