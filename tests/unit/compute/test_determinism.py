"""The determinism block (compute/determinism.py): seeds and flags set inside and restored after, also
when it raises, no seeding queued for a device that has not started, the user's precision settings
overridden inside, the flags in force reported, cuBLAS's workspace set when absent and kept when valid."""

import os
import random

import numpy as np
import pytest
import torch

from pytest_llmdeterminism.compute import determinism


def snapshot():
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        determinism.flags(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.get_rng_state().tolist(),
        random.getstate(),
        str(np.random.get_state()),
    )


def test_state_is_set_inside_and_restored_after():
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(False)
    before = snapshot()
    with determinism.deterministic_state(7):
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
        assert torch.initial_seed() == 7
        first = (torch.rand(3).tolist(), random.random(), np.random.rand())
        torch.rand(100)
    assert snapshot() == before
    with determinism.deterministic_state(7):
        assert (torch.rand(3).tolist(), random.random(), np.random.rand()) == first


def test_the_block_leaves_no_seeding_queued_for_a_device_that_has_not_started():
    """torch.manual_seed queues a seeding for a CUDA that has not started, to run when it starts:
    a change that would outlive the block (and costs about 1 ms a call, capturing a stack)."""
    if torch.cuda.is_initialized():
        pytest.skip("CUDA has started here: its generator is seeded and restored directly")
    tracker = torch.cuda._lazy_seed_tracker  # where torch keeps the seeding to run at CUDA's start
    before = [call and call[0] for call in tracker.get_calls()]
    with determinism.deterministic_state(7):
        assert torch.initial_seed() == 7
    assert [call and call[0] for call in tracker.get_calls()] == before


def test_state_is_restored_when_the_block_raises():
    before = snapshot()
    try:
        with determinism.deterministic_state(0):
            torch.rand(5)
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert snapshot() == before


def test_flags_report_what_is_in_force():
    with determinism.deterministic_state(0):
        flags = determinism.flags()
    assert flags["deterministic_algorithms"] is True
    assert flags["cudnn_benchmark"] is False
    assert set(flags["fp32_precision"].values()) == {"ieee"}


def test_user_precision_settings_are_overridden_inside_and_restored_after(make_llm):
    # A user (or library) lowering fp32 matmul precision, with either API, must not leak into
    # deterministic generation, and must be handed back untouched.
    llm = make_llm(max_new_tokens=4)
    reference = llm.generate("The capital of France is")
    for lower in (lambda: setattr(torch.backends.mkldnn.matmul, "fp32_precision", "bf16"),
                  lambda: torch.set_float32_matmul_precision("medium")):
        knobs = determinism._precision_knobs(torch)
        saved = {name: knob.fp32_precision for name, knob in knobs.items()}
        try:
            lower()
            lowered = determinism.flags()
            assert llm.generate("The capital of France is") == reference
            assert determinism.flags() == lowered
        finally:
            for name, value in saved.items():
                knobs[name].fp32_precision = value


def test_cublas_workspace_is_set_when_absent_and_kept_when_valid(monkeypatch):
    monkeypatch.delenv(determinism.CUBLAS_WORKSPACE_CONFIG, raising=False)
    assert determinism.ensure_cublas_workspace_config() is None
    assert os.environ[determinism.CUBLAS_WORKSPACE_CONFIG] == ":4096:8"
    monkeypatch.setenv(determinism.CUBLAS_WORKSPACE_CONFIG, ":16:8")
    assert determinism.ensure_cublas_workspace_config() is None
    assert os.environ[determinism.CUBLAS_WORKSPACE_CONFIG] == ":16:8"
    monkeypatch.setenv(determinism.CUBLAS_WORKSPACE_CONFIG, ":0:0")
    warning = determinism.ensure_cublas_workspace_config()
    assert "':0:0' is set, which cuBLAS does not treat as deterministic" in warning
    assert "':4096:8'" in warning
