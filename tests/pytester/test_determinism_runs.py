"""Determinism settings in pytest runs: the plugin sets cuBLAS's workspace before conftests and warns on
a bad value; deterministic kernels do not import inductor, and mirror it once it is loaded."""


import pytest


@pytest.mark.subprocess
def test_plugin_sets_cublas_workspace_before_conftests_and_warns_on_a_bad_value(pytester, monkeypatch):
    pytester.makeini("[pytest]\nllm_model = builtin:tiny\n")  # a project that configures the plugin
    pytester.makeconftest("import os\nSEEN = os.environ.get('CUBLAS_WORKSPACE_CONFIG')\n")
    pytester.makepyfile(
        """
        import conftest
        def test_seen_by_conftest():
            assert conftest.SEEN in (":4096:8", ":0:0")
            print("SEEN", conftest.SEEN)
        """
    )
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    result = pytester.runpytest_subprocess("-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*SEEN :4096:8*"])
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    result = pytester.runpytest_subprocess("-s")
    result.stdout.fnmatch_lines(["*PytestConfigWarning*':0:0' is set, which cuBLAS does not treat as "
                                 "deterministic*"])


INDUCTOR_PROBE = """
import sys, torch
from pytest_llmdeterminism.compute import determinism
with determinism.deterministic_state(0):
    inside = torch.are_deterministic_algorithms_enabled()
print("alone", inside, torch.are_deterministic_algorithms_enabled(), "torch._inductor" in sys.modules)
import torch._inductor.config as inductor
torch.use_deterministic_algorithms(False)
with determinism.deterministic_state(0):
    inside = inductor.deterministic, torch.are_deterministic_algorithms_enabled()
print("loaded", *inside, inductor.deterministic, torch.are_deterministic_algorithms_enabled())
"""


@pytest.mark.fresh_python  # it tests what a new Python imports
@pytest.mark.subprocess
def test_deterministic_kernels_do_not_import_inductor_and_mirror_it_once_loaded():
    """torch.use_deterministic_algorithms imports TorchInductor (about 1 s natively, 6 s under qemu) to
    mirror the flag: a process that never loaded it (llama.cpp, a server) gets the flag without it."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", INDUCTOR_PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["alone True False False", "loaded True True False False"]
