"""Seeds and torch/CUDA determinism flags as a context manager that sets *and restores* them.

Everything set here is put back when the block ends, RNG states included, so a deterministic test
leaves the process exactly as it found it and test order cannot matter.
"""

from __future__ import annotations

import functools
import os
import random
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CUBLAS_WORKSPACE_CONFIG = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_DETERMINISTIC_VALUES = (":4096:8", ":16:8")


def ensure_cublas_workspace_config() -> str | None:
    """Set ``CUBLAS_WORKSPACE_CONFIG`` before CUDA starts. Returns the value it replaced.

    cuBLAS reads the variable once, when CUDA initialises, so this must run before any test
    touches the GPU. Returns a warning text when CUDA already started with another value.
    """
    current = os.environ.get(CUBLAS_WORKSPACE_CONFIG)
    if current is None:
        os.environ[CUBLAS_WORKSPACE_CONFIG] = CUBLAS_DETERMINISTIC_VALUES[0]
        return None
    if current not in CUBLAS_DETERMINISTIC_VALUES:
        return (
            f"{CUBLAS_WORKSPACE_CONFIG}={current!r} is set, which cuBLAS does not treat as "
            f"deterministic: GPU matmuls may differ between runs. Unset it or set it to "
            f"{CUBLAS_DETERMINISTIC_VALUES[0]!r} before running pytest."
        )
    return None


def cuda_started_without_workspace_config() -> str | None:
    """Warn when CUDA initialised before the plugin could set the cuBLAS workspace."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    if os.environ.get(CUBLAS_WORKSPACE_CONFIG) in CUBLAS_DETERMINISTIC_VALUES:
        return None
    return (
        "CUDA was initialised before pytest-llmdeterminism could set "
        f"{CUBLAS_WORKSPACE_CONFIG}; cuBLAS results may vary between runs. Set "
        f"{CUBLAS_WORKSPACE_CONFIG}={CUBLAS_DETERMINISTIC_VALUES[0]} in the environment."
    )


@contextmanager
def deterministic_state(seed: int) -> Iterator[None]:
    """Seed python/numpy/torch/CUDA and switch torch to deterministic kernels for the block."""
    import torch

    saved = _capture(torch)
    try:
        _apply(torch, seed)
        yield
    finally:
        _restore(torch, saved)


# torch >= 2.9 sets fp32 precision per backend and operator; mixing that API with the legacy
# allow_tf32 / set_float32_matmul_precision is an error there, so with it we touch only these.
_FP32_PRECISION_KNOBS = (
    "backends", "backends.cuda.matmul", "backends.cudnn", "backends.cudnn.conv", "backends.cudnn.rnn",
    "backends.mkldnn", "backends.mkldnn.matmul", "backends.mkldnn.conv", "backends.mkldnn.rnn",
)


@functools.cache
def _precision_knobs(torch: Any) -> dict[str, Any]:
    """name -> object holding ``fp32_precision``, for every knob this torch has (looked up once: every
    generation reads them three times). Callers do not mutate the dict."""
    knobs = {}
    for path in _FP32_PRECISION_KNOBS:
        holder = torch
        for part in path.split("."):
            holder = getattr(holder, part, None)
        if holder is not None and hasattr(holder, "fp32_precision"):
            knobs[path.removeprefix("backends").lstrip(".") or "global"] = holder
    return knobs


def flags() -> dict[str, Any]:
    """The determinism-relevant torch settings now in force (recorded in each golden)."""
    import torch

    state: dict[str, Any] = {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }
    if _has_fp32_precision_api(torch):
        knobs = _precision_knobs(torch)
        state["fp32_precision"] = {name: knob.fp32_precision for name, knob in knobs.items()}
    else:
        state["float32_matmul_precision"] = torch.get_float32_matmul_precision()
        state["cuda_matmul_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        state["cudnn_allow_tf32"] = torch.backends.cudnn.allow_tf32
    return state


def _has_fp32_precision_api(torch: Any) -> bool:
    return hasattr(torch.backends.cuda.matmul, "fp32_precision")


def _capture(torch: Any) -> dict[str, Any]:
    """Everything :func:`_apply` changes: the flags as :func:`flags` reports them, and the RNG states."""
    saved: dict[str, Any] = {
        **flags(),
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "threads": torch.get_num_threads(),
    }
    numpy = _numpy()
    if numpy is not None:
        saved["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        saved["cuda"] = torch.cuda.get_rng_state_all()
    return saved


def seed_all(seed: int) -> None:
    """Seed python's, numpy's and torch's (every CUDA device's) global generators."""
    import torch

    _seed_host(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def _seed_host(seed: int) -> None:
    """Python's and numpy's global generators."""
    random.seed(seed)
    numpy = _numpy()
    if numpy is not None:
        numpy.random.seed(seed % 2**32)


def _seed_started_devices(torch: Any, seed: int) -> None:
    """:func:`seed_all` for a block that restores the generators: only devices already started.
    ``torch.manual_seed`` queues a seeding for every device that has not started (CUDA, XPU, MTIA,
    each with a captured stack: about 1 ms a call, a tenth of a tiny model's generation), which
    would run when that device starts, after the block has put everything back."""
    _seed_host(seed)
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)
    if torch.backends.mps.is_available():
        torch.mps.manual_seed(seed)


def _apply(torch: Any, seed: int) -> None:
    _seed_started_devices(torch, seed)
    if not torch.are_deterministic_algorithms_enabled() or \
            torch.is_deterministic_algorithms_warn_only_enabled():
        _use_deterministic_algorithms(torch, True, warn_only=False)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    if _has_fp32_precision_api(torch):
        for knob in _precision_knobs(torch).values():
            knob.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")


def _use_deterministic_algorithms(torch: Any, mode: bool, *, warn_only: bool) -> None:
    """``torch.use_deterministic_algorithms`` without importing TorchInductor. The public function
    imports ``torch._inductor.config`` to mirror the flag there (torch 2.13: about 1 s after torch
    natively, 6 s under qemu; transformers' model classes import it anyway, the llama.cpp and server
    engines do not). Inductor's copy is mirrored when it is loaded; one loaded later reads its own
    default, and Inductor's lowering also reads torch's flag."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:  # a torch without the private setter: the public one, import and all
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
        return
    inductor: Any = sys.modules.get("torch._inductor.config")
    if inductor is not None and hasattr(inductor, "deterministic"):  # torch 2.9 has no such copy
        inductor.deterministic = mode
    setter(mode, warn_only=warn_only)


def _restore(torch: Any, saved: dict[str, Any]) -> None:
    random.setstate(saved["python"])
    torch.set_rng_state(saved["torch"])
    if "numpy" in saved:
        _numpy().random.set_state(saved["numpy"])
    if "cuda" in saved:
        torch.cuda.set_rng_state_all(saved["cuda"])
    _use_deterministic_algorithms(torch, saved["deterministic_algorithms"], warn_only=saved["warn_only"])
    torch.backends.cudnn.deterministic = saved["cudnn_deterministic"]
    torch.backends.cudnn.benchmark = saved["cudnn_benchmark"]
    if torch.get_num_threads() != saved["threads"]:
        torch.set_num_threads(saved["threads"])
    if "fp32_precision" in saved:
        knobs = _precision_knobs(torch)
        for name, value in saved["fp32_precision"].items():  # parents first, as captured
            knobs[name].fp32_precision = value
    else:
        torch.backends.cuda.matmul.allow_tf32 = saved["cuda_matmul_allow_tf32"]
        torch.backends.cudnn.allow_tf32 = saved["cudnn_allow_tf32"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.set_float32_matmul_precision(saved["float32_matmul_precision"])


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:  # numpy is optional for the plugin itself
        return None
    return numpy
