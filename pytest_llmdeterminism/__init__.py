"""pytest-llmdeterminism: trustworthy LLM output regression tests.

Importing this package is cheap: torch and transformers load only when a test asks for a model.
"""

from __future__ import annotations

import pytest

from pytest_llmdeterminism.errors import (
    ConfigurationError,
    GoldenFileError,
    GoldenMismatchError,
    LLMDeterminismError,
    ModelLoadError,
    PromptTooLongError,
    SamplingRefusedError,
)
from pytest_llmdeterminism.generation import Generation

__all__ = [
    "ConfigurationError",
    "Generation",
    "GoldenFileError",
    "GoldenMismatchError",
    "LLMDeterminismError",
    "ModelLoadError",
    "PromptTooLongError",
    "SamplingRefusedError",
    "deterministic",
]

__version__ = "0.1.0"

#: The ``deterministic`` marker, the same object as ``pytest.mark.deterministic``. Use it bare
#: (``@deterministic``) or with ``seed``, ``max_new_tokens`` and ``batch_shape``.
deterministic = pytest.mark.deterministic
