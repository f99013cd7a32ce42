"""The environment variables a configured project gets pinned (tests/unit/compute/test_environment.py,
tests/pytester/test_inert.py)."""

from __future__ import annotations

from pytest_llmdeterminism.compute import numerics

PINNED = (*numerics.PINNED_VARIABLES, "CUBLAS_WORKSPACE_CONFIG", "HF_HUB_OFFLINE")

