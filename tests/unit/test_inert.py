"""Installed is not used: a run that does not use the plugin sees exactly what it sees without it;
a project that configures it gets its numerics pinned before conftests, and everything back after."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from pytest_llmdeterminism import engines as backends
from pytest_llmdeterminism.compute import numerics
from pytest_llmdeterminism.compute.environment import PinnedEnvironment, configures_plugin
from pytest_llmdeterminism.engines import ModelCache

PINNED = (*numerics.PINNED_VARIABLES, "CUBLAS_WORKSPACE_CONFIG", "HF_HUB_OFFLINE")

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


@pytest.mark.parametrize(("ini_keys", "args", "configured"), [
    ([], [], False),
    (["testpaths", "addopts"], ["-q", "tests", "-o", "xfail_strict=true", "-k", "llm"], False),
    (["llm_model"], [], True),
    (["llm_batch_shape"], [], True),  # any llm_* key, even one with a typo (reported later)
    ([], ["--llm-model=builtin:tiny"], True),
    ([], ["--llm-golden-update"], True),
    ([], ["-o", "llm_model=builtin:tiny"], True),
    ([], ["-ollm_model=builtin:tiny"], True),
    ([], ["--override-ini=llm_seed=3"], True),
])
def test_what_counts_as_configuring_the_plugin(ini_keys, args, configured):
    assert configures_plugin(ini_keys, args) is configured


def test_the_first_model_load_pins_what_nobody_pinned_and_the_run_restores_everything(monkeypatch):
    """A model configured where the early hook cannot see it (a conftest setting the option):
    the load pins, and whatever the load set (vLLM's HF_HUB_OFFLINE) is put back at the end."""
    for name in PINNED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    seen: dict[str, object] = {}

    def fake_load(spec: str, **how: object) -> SimpleNamespace:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # as vllm.load does
        seen.update(how, mkl=os.environ.get("MKL_CBWR"), aten=os.environ.get("ATEN_CPU_CAPABILITY"))
        return SimpleNamespace(device="cuda:0", hub_commit=None, origin="", slower="")

    monkeypatch.setattr(backends, "load", fake_load)
    environment = PinnedEnvironment(numerics.PORTABLE)
    cache = ModelCache("vllm:models/x", dtype="float32", device="auto", cpu_numerics=numerics.PORTABLE,
                       environment=environment)
    assert cache.get().device == "cuda:0"
    assert seen == {"dtype": "float32", "device": "auto", "cpu_numerics": "portable", "pinned_late": True,
                    "batch_invariant": False, "recording": False, "mkl": "COMPATIBLE", "aten": "avx2"}
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    environment.restore()
    assert {name: os.environ.get(name) for name in PINNED} == {
        "MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": None, "ONEDNN_MAX_CPU_ISA": None,
        "CUBLAS_WORKSPACE_CONFIG": None, "HF_HUB_OFFLINE": None}


def test_a_model_load_after_an_early_pin_is_not_late(monkeypatch):
    for name in PINNED:
        monkeypatch.delenv(name, raising=False)
    environment = PinnedEnvironment(numerics.NATIVE)
    assert environment.pin(early=True) is None
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and "MKL_CBWR" not in os.environ  # native
    monkeypatch.setattr(backends, "load", lambda spec, **how: SimpleNamespace(
        device=f"late={how['pinned_late']}", hub_commit=None, origin="", slower=""))
    assert ModelCache("x", dtype="float32", device="cpu", cpu_numerics=numerics.NATIVE,
                      environment=environment).get().device == "late=False"
    environment.restore()
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


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
