"""Installed is not used: a run that does not use the plugin sees exactly what it sees without it;
a project that configures it gets its numerics pinned before conftests, and everything back after."""

from __future__ import annotations

import json

import pytest

from pytest_llmdeterminism.compute import numerics
from tests.helpers.inert import PINNED

# What a torch test can see of the process: the environment, which modules the conftest found
# loaded, the CPU kernels ATen picked, the deterministic flags.
SEEN_BY_A_TORCH_TEST = """
import json, os, sys

def test_what_torch_sees():
    import torch

    seen = {
        "environment": {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"},
        "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    print("SEEN " + json.dumps(seen, sort_keys=True))
"""


def _seen(result: pytest.RunResult) -> dict[str, object]:
    (line,) = [line for line in result.outlines if "SEEN {" in line]
    seen: dict[str, object] = json.loads(line.split("SEEN ", 1)[1])
    return seen


@pytest.mark.fresh_python  # it tests what a new Python imports
@pytest.mark.subprocess
def test_an_unconfigured_run_changes_nothing_a_torch_test_sees(pytester, monkeypatch):
    for name in PINNED:
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest("import sys\nTORCH_BEFORE_TESTS = 'torch' in sys.modules\n")
    pytester.makepyfile(test_torch=SEEN_BY_A_TORCH_TEST + "\n\ndef test_no_torch_before_tests():\n"
                        "    import conftest\n    assert not conftest.TORCH_BEFORE_TESTS\n")
    installed = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")
    disabled = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", "-p", "no:llmdeterminism")
    assert installed.ret == disabled.ret == pytest.ExitCode.OK
    assert _seen(installed) == _seen(disabled)
    assert not {name for name in PINNED if name in _seen(installed)["environment"]}  # type: ignore[operator]
    ours = [line for line in installed.outlines if line.startswith("llm") or "llm goldens" in line]
    assert ours == []


@pytest.mark.subprocess
def test_a_configured_project_is_pinned_before_its_conftest_imports_torch(pytester, monkeypatch):
    for name in PINNED:
        monkeypatch.delenv(name, raising=False)
    pytester.makeini("[pytest]\nllm_model = builtin:tiny\n")
    pytester.makeconftest("import os\nSEEN = {k: os.environ.get(k) for k in ('MKL_CBWR', "
                          "'ATEN_CPU_CAPABILITY', 'ONEDNN_MAX_CPU_ISA', 'CUBLAS_WORKSPACE_CONFIG')}\n")
    pytester.makepyfile("""
        import conftest

        def test_pinned():
            print("PINNED", " ".join(f"{k}={v}" for k, v in sorted(conftest.SEEN.items())))
        """)
    result = pytester.runpytest_subprocess("-s")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["llm: model=builtin:tiny *", (
        "*PINNED ATEN_CPU_CAPABILITY=avx2 CUBLAS_WORKSPACE_CONFIG=:4096:8 MKL_CBWR=COMPATIBLE "
        "ONEDNN_MAX_CPU_ISA=AVX2")])


COMPUTES_AT_IMPORT = """
import torch
torch.ones(8, 8) @ torch.ones(8, 8)  # CPU kernels picked while conftests load

def pytest_configure(config):
    config.option.llm_model = "builtin:tiny"  # configured where the plugin's early hook cannot see it
"""


@pytest.mark.skipif(numerics.effective()["mkl_cbwr"] is None, reason="this torch runs without MKL")
@pytest.mark.subprocess
def test_torch_that_computed_before_a_late_pin_is_refused_naming_the_ini_setting(pytester, monkeypatch):
    for name in PINNED:
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest(COMPUTES_AT_IMPORT)
    pytester.makepyfile("""
        def test_one(llm_model):
            llm_model.generate("The sky is", max_new_tokens=1)
        """)
    result = pytester.runpytest_subprocess("-q")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        ("*llm_cpu_numerics = 'portable' is not in force: *the first model load, where pytest-llmdeterminism "
        "pinned them: this project does not configure the plugin*Set llm_model in the ini file "
        "(pytest.ini: llm_model = builtin:tiny; *"),
    ])
