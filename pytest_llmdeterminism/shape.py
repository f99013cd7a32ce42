"""Small values every layer shares: the batch shape a generation runs in, and a test's settings.

Nothing here imports torch or another module of the package but ``errors``. (The ``llm_model``
spec has its own module, ``engines/spec.py``.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pytest_llmdeterminism.errors import ConfigurationError

MARKER = "deterministic"  # the marker's name: @pytest.mark.deterministic
DTYPES = ("float32", "bfloat16", "float16")

# Beyond these a shape is a typo, not a test: refused at start-up instead of deep inside torch.
MAX_ROWS = 4096
MAX_LENGTH = 131_072  # beyond the context of the models this runs on
MAX_TOKENS = 1 << 22


def _size(n_bytes: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB", "PB"):
        if n_bytes < 1000 or unit == "PB":
            return f"{n_bytes:,.0f} {unit}" if unit == "bytes" else f"{n_bytes:,.1f} {unit}"
        n_bytes /= 1000
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class BatchShape:
    """The one shape ``rows x length`` that every generation runs in."""

    rows: int
    length: int

    @classmethod
    def parse(cls, text: str, *, setting: str = "llm_batch_shape") -> BatchShape:
        match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", str(text))
        if not match or int(match[1]) < 1 or int(match[2]) < 1:
            raise ConfigurationError(
                setting, text, "expected 'BxL' (rows x padded prompt length), for example '4x64'"
            )
        rows, length = int(match[1]), int(match[2])
        if rows > MAX_ROWS or length > MAX_LENGTH or rows * length > MAX_TOKENS:
            limit = (f"B = {rows:,} is above {MAX_ROWS}; " if rows > MAX_ROWS else
                     f"L = {length:,} is above {MAX_LENGTH:,}; " if length > MAX_LENGTH else "")
            raise ConfigurationError(
                setting, text,
                f"{limit}{rows * length:,} tokens per batch: the input ids and attention mask alone would "
                f"take {_size(16 * rows * length)}, and attention needs about "
                f"{_size(4 * rows * length * length)} per layer and head for its fp32 scores. Expected "
                f"B <= {MAX_ROWS}, L <= {MAX_LENGTH:,} and B x L <= {MAX_TOKENS:,}, for example '4x64'",
            )
        return cls(rows, length)

    def running(self, prompt_tokens: int) -> BatchShape:
        """The shape a chunk whose longest prompt has ``prompt_tokens`` tokens really runs in: this one,
        except at one row, where a prompt has no companions to be invariant to, so it runs at its own
        length, unpadded, as a plain ``model.generate()`` of it would (bounded by the model's context
        only)."""
        return BatchShape(1, prompt_tokens) if self.rows == 1 else self

    def holding(self, n_tokens: int) -> BatchShape | None:
        """The shape to suggest for an ``n_tokens`` prompt: these rows (fewer if they must) and the
        next power of two above it (one position stays padding); None where no accepted shape holds it."""
        length = 1 << n_tokens.bit_length()
        rows = min(self.rows, MAX_TOKENS // length) if length <= MAX_LENGTH else 0
        return BatchShape(rows, length) if rows >= 1 else None

    def __str__(self) -> str:
        return f"{self.rows}x{self.length}"


@dataclass(frozen=True)
class GenerationSettings:
    """How one test generates: the options, overridden by its ``@deterministic(...)`` marker."""

    batch_shape: BatchShape
    max_new_tokens: int
    seed: int
    batch_shape_setting: str = "llm_batch_shape"  # where the shape came from, for error messages
    # @deterministic(concurrency=N): each request sent again among N concurrent ones (server engines)
    concurrency: int = 0
    # whether the kernels in use make the shape part of every golden, for error messages (the model's
    # object sets it: False on batch-invariant kernels or where each prompt runs alone)
    shape_in_goldens: bool = True
