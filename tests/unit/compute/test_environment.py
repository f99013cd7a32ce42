"""What counts as configuring the plugin, and the environment it pins (compute/environment.py): the
first model load pins what nobody pinned and the run restores everything; a load after an early pin
is not late (a run that does not configure it: tests/pytester/test_inert.py)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from pytest_llmdeterminism import engines as backends
from pytest_llmdeterminism.compute import numerics
from pytest_llmdeterminism.compute.environment import PinnedEnvironment, configures_plugin
from pytest_llmdeterminism.engines import ModelCache
from tests.helpers.inert import PINNED


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
                    "batch_invariant": None, "recording": False, "mkl": "COMPATIBLE", "aten": "avx2"}
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
