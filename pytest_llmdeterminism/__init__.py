"""pytest-llmdeterminism: trustworthy LLM output regression tests.

Importing this package is cheap: torch and transformers load only when a test asks for a model.
"""

from __future__ import annotations

import pytest

from pytest_llmdeterminism.compare import GoldenMismatchError
from pytest_llmdeterminism.engines.audit import AuditReport, NondeterminismError, audit
from pytest_llmdeterminism.errors import (
    BatchInvarianceProbeError,
    ConfigurationError,
    EngineError,
    GoldenFileError,
    LLMDeterminismError,
    ModelLoadError,
    NonFiniteLogitsError,
    PromptTooLongError,
    SamplingRefusedError,
)
from pytest_llmdeterminism.generation import Generation
from pytest_llmdeterminism.run.golden_tokens import assert_tokens_match

__all__ = [
    "AuditReport",
    "BatchInvarianceProbeError",
    "ConfigurationError",
    "EngineError",
    "Generation",
    "GoldenFileError",
    "GoldenMismatchError",
    "LLMDeterminismError",
    "ModelLoadError",
    "NonFiniteLogitsError",
    "NondeterminismError",
    "PromptTooLongError",
    "SamplingRefusedError",
    "assert_tokens_match",
    "audit",
    "deterministic",
]

__version__ = "0.1.0"

# Failures name errors by their public home (`pytest_llmdeterminism.GoldenMismatchError`), not by
# the module that happens to define them.
for _error in (BatchInvarianceProbeError, ConfigurationError, EngineError, GoldenFileError,
               GoldenMismatchError, LLMDeterminismError, ModelLoadError, NonFiniteLogitsError,
               NondeterminismError, PromptTooLongError, SamplingRefusedError):
    _error.__module__ = __name__

#: The ``deterministic`` marker, the same object as ``pytest.mark.deterministic``. Use it bare
#: (``@deterministic``) or with ``seed``, ``max_new_tokens``, ``batch_shape`` and ``tolerance``.
deterministic = pytest.mark.deterministic
