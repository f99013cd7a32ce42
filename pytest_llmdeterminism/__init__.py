"""pytest-llmdeterminism: trustworthy LLM output regression tests.

Importing this package is cheap: torch and transformers load only when a test asks for a model.
Every type a user annotates or matches on, and every error the plugin raises, is importable from
here; every error derives from :class:`LLMDeterminismError`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import pytest

from pytest_llmdeterminism.compute.numerics import CPUNumericsError
from pytest_llmdeterminism.compute.private_folder import CacheFolderError
from pytest_llmdeterminism.engines.server.server_client import HTTPStatusError
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
from pytest_llmdeterminism.generation import EvalItem, Evaluation, Generation, Score, Speculated
from pytest_llmdeterminism.goldens.atomic import LinkOutError
from pytest_llmdeterminism.goldens.store import UnreadableFileError
from pytest_llmdeterminism.judge.compare import Comparison, GoldenMismatchError, Verdict
from pytest_llmdeterminism.judge.eval_gate import EvalMismatch
from pytest_llmdeterminism.model.audit import NondeterminismError, audit
from pytest_llmdeterminism.model.concurrency import ConcurrencyError
from pytest_llmdeterminism.model.decode_prefill import (
    DecodePrefillMismatchError,
    assert_decode_matches_prefill,
)
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.reporting.audit import AuditReport
from pytest_llmdeterminism.run.golden_tokens import GoldenTokens, assert_tokens_match
from pytest_llmdeterminism.run.shards import ShardError

if TYPE_CHECKING:
    from pytest_llmdeterminism.cli.eval_diff import SamplesError
    from pytest_llmdeterminism.cli.fetch import FetchError
    from pytest_llmdeterminism.cli.perturb import PerturbError
    from pytest_llmdeterminism.cli.project import ProjectConfigError
    from pytest_llmdeterminism.strategies import BatchInvarianceError

__all__ = [
    "AuditReport",
    "BatchInvarianceError",
    "BatchInvarianceProbeError",
    "CPUNumericsError",
    "CacheFolderError",
    "Comparison",
    "ConcurrencyError",
    "ConfigurationError",
    "DecodePrefillMismatchError",
    "EngineError",
    "EvalItem",
    "EvalMismatch",
    "Evaluation",
    "FetchError",
    "Generation",
    "GoldenFileError",
    "GoldenMismatchError",
    "GoldenTokens",
    "HTTPStatusError",
    "LLMDeterminismError",
    "LLMModel",
    "LinkOutError",
    "ModelLoadError",
    "NonFiniteLogitsError",
    "NondeterminismError",
    "PerturbError",
    "ProjectConfigError",
    "PromptTooLongError",
    "SamplesError",
    "SamplingRefusedError",
    "Score",
    "ShardError",
    "Speculated",
    "UnreadableFileError",
    "Verdict",
    "assert_decode_matches_prefill",
    "assert_tokens_match",
    "audit",
    "deterministic",
]

__version__ = "0.1.0"

# Public names whose modules import what a pytest run never needs (hypothesis; the llm-golden
# command's modules): each loads on first use, so loading the plugin stays free.
_LAZY = {
    "BatchInvarianceError": "pytest_llmdeterminism.strategies",
    "FetchError": "pytest_llmdeterminism.cli.fetch",
    "SamplesError": "pytest_llmdeterminism.cli.eval_diff",
    "PerturbError": "pytest_llmdeterminism.cli.perturb",
    "ProjectConfigError": "pytest_llmdeterminism.cli.project",
}

# Failures and fixture values name their types by their public home
# (`pytest_llmdeterminism.GoldenMismatchError`), not by the module that happens to define them. The
# data classes (Comparison, Generation, AuditReport) keep theirs: their annotations resolve there.
for _public in (BatchInvarianceProbeError, CPUNumericsError, CacheFolderError, ConcurrencyError,
                ConfigurationError, DecodePrefillMismatchError, EngineError, EvalMismatch, GoldenFileError,
                GoldenMismatchError, GoldenTokens, HTTPStatusError, LLMDeterminismError, LLMModel,
                LinkOutError,
                ModelLoadError, NonFiniteLogitsError, NondeterminismError, PromptTooLongError,
                SamplingRefusedError, ShardError, UnreadableFileError, Verdict):
    _public.__module__ = __name__


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    value.__module__ = __name__
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


#: The ``deterministic`` marker, the same object as ``pytest.mark.deterministic``. Use it bare
#: (``@deterministic``) or with ``seed``, ``max_new_tokens``, ``batch_shape`` and ``tolerance``.
deterministic = pytest.mark.deterministic
