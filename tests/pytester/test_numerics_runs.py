"""``llm_cpu_numerics`` in pytest runs: a bad value is a usage error naming both modes, the header names
the numerics and goldens record them, the plugin restores the environment it pinned, torch started
before the plugin is refused (never recorded as portable), and machines other than x86-64 get
generic ATen kernels, not the AVX2 pin."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from pytest_llmdeterminism.compute import numerics
from tests.helpers.projects import usage_error


def test_bad_cpu_numerics_value_is_a_usage_error_naming_both_modes(pytester):
    result = usage_error(pytester, "llm_cpu_numerics = fast")
    result.stderr.fnmatch_lines(["ERROR: llm_cpu_numerics = 'fast': expected 'portable' (the "
                                 "default*'native'*"])


def test_header_names_the_numerics_and_goldens_record_them(suite):
    suite.makepyfile("""
        from pytest_llmdeterminism import deterministic

        @deterministic(max_new_tokens=2)
        def test_one(llm_model, golden_tokens):
            golden_tokens.check(llm_model.generate("The sky is"))
        """)
    result = suite.runpytest("--llm-golden-update")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "llm: model=builtin:tiny shape=4x32 dtype=float32 device=auto seed=0 *",
        "llm cpu numerics: portable (MKL_CBWR=COMPATIBLE, ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2; "
        f"{platform.machine()})*",
        # on the batch-invariant kernels, the default, the probe checks a second shape too
        "batch invariance: verified at 4x32 (row 0 vs row 3, and against 1x*, 3 steps)",
    ])
    path = suite.path / "__golden__" / "test_header_names_the_numerics_and_goldens_record_them.json"
    golden = json.loads(path.read_text())["goldens"]["test_one"]["cpu/float32"]["fingerprint"]
    assert golden["cpu_numerics"] == "portable" and golden["cpu_capability"] == "AVX2"


def test_plugin_restores_the_environment_it_pinned(pytester, monkeypatch):
    for name in numerics.PINNED_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    pytester.makeini("[pytest]\nllm_batch_shape = 2x16\n")  # configured: pinned before conftests
    pytester.makepyfile("""
        import os

        def test_pinned(request):
            assert os.environ["MKL_CBWR"] == "COMPATIBLE"
            mode = request.config.getoption("llm_cpu_numerics") or "portable"
            assert os.environ["ATEN_CPU_CAPABILITY"] == {"portable": "avx2", "compatible": "default"}[mode]
            assert os.environ.get("ONEDNN_MAX_CPU_ISA") == {"portable": "AVX2", "compatible": None}[mode]
        """)
    pytester.runpytest().assert_outcomes(passed=1)
    pytester.runpytest("--llm-cpu-numerics=compatible").assert_outcomes(passed=1)
    assert os.environ["MKL_CBWR"] == "AVX2"
    assert "ATEN_CPU_CAPABILITY" not in os.environ and "ONEDNN_MAX_CPU_ISA" not in os.environ
    pytester.runpytest("--llm-cpu-numerics=native").assert_outcomes(failed=1)  # native pins nothing


STARTED_EARLY = """
import sys
import torch
torch.ones(8, 8) @ torch.ones(8, 8)  # CPU kernels picked before pytest runs
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


@pytest.mark.skipif(numerics.effective()["mkl_cbwr"] is None, reason="this torch runs without MKL")
@pytest.mark.subprocess
def test_torch_started_before_the_plugin_is_refused_never_recorded_as_portable(pytester):
    pytester.makeini("[pytest]\nllm_model = builtin:tiny\nllm_batch_shape = 2x16\n")
    pytester.makepyfile(test_early="""
        from pytest_llmdeterminism import deterministic

        @deterministic(max_new_tokens=2)
        def test_one(llm_model, golden_tokens):
            golden_tokens.check(llm_model.generate("The sky is"))
        """)
    env = {k: v for k, v in os.environ.items() if k not in numerics.PINNED_VARIABLES and k != "CI"}

    def run(*args):
        return subprocess.run([sys.executable, "-c", STARTED_EARLY, "-p", "no:cacheprovider", *args],
                              cwd=pytester.path, env=env, capture_output=True, text=True, timeout=600,
                              check=False)

    refused = run("--llm-golden-update")
    assert refused.returncode == 1, refused.stdout[-2000:]
    assert "llm_cpu_numerics = 'portable' is not in force:" in refused.stdout
    pinned = " ".join(f"{k}={v}" for k, v in numerics.PORTABLE_ENVIRONMENT.items())
    assert f"{pinned} python -m pytest" in refused.stdout
    assert "--llm-cpu-numerics=native (pytest.ini: llm_cpu_numerics = native; " in refused.stdout
    assert not (pytester.path / "__golden__").exists()
    native = run("--llm-golden-update", "--llm-cpu-numerics=native")
    assert native.returncode == 0, native.stdout[-2000:]
    golden = json.loads((pytester.path / "__golden__" / "test_early.json").read_text())
    assert golden["goldens"]["test_one"]["cpu/float32"]["fingerprint"]["cpu_numerics"] == "native"


MACHINE_PROBE = """
import json, platform, sys
platform.machine = lambda: sys.argv[1]
from pytest_llmdeterminism.compute import numerics
numerics.pin("portable")
found = {"environment": dict(numerics.PORTABLE_ENVIRONMENT), "torch imported": "torch" in sys.modules}
import torch
torch.ones(4, 4) @ torch.ones(4, 4)
found["in force"] = numerics.check("portable")["aten_capability"]
print(json.dumps(found))
"""


@pytest.mark.fresh_python  # it tests what a new Python imports
@pytest.mark.subprocess
@pytest.mark.parametrize("machine", ["arm64", "ppc64le"])
def test_machines_other_than_x86_64_get_generic_aten_kernels_not_the_avx2_pin(machine):
    """macOS on Apple silicon reports arm64, other Linux machines their own name: ATen's AVX2 level
    does not exist there, so portable must pin its generic kernels and pass its own check."""
    env = {k: v for k, v in os.environ.items() if k not in numerics.PINNED_VARIABLES}
    out = subprocess.run([sys.executable, "-c", MACHINE_PROBE, machine], capture_output=True, text=True,
                         check=False, env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    found = json.loads(out.stdout.splitlines()[-1])
    assert found["environment"]["ATEN_CPU_CAPABILITY"] == "default"
    assert "ONEDNN_MAX_CPU_ISA" not in found["environment"]
    assert found["in force"] == "DEFAULT"
    assert not found["torch imported"]
