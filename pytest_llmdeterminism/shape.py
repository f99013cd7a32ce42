"""Small values every layer shares: the batch shape, per-test generation settings, names.

Nothing here imports torch or another module of the package but ``errors``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pytest_llmdeterminism.errors import ConfigurationError, pasteable

MARKER = "deterministic"
BUILTIN_PREFIX = "builtin:"
ENGINE_PREFIXES = ("llamacpp", "openai", "vllm")  # llm_model = "ENGINE:..." (backends/)


def engine_of(spec: str) -> str | None:
    """The engine a spec names (``llamacpp:model.gguf`` -> ``llamacpp``), None for transformers."""
    prefix, colon, _ = spec.partition(":")
    return prefix if colon and prefix in ENGINE_PREFIXES else None


def without_credentials(text: str) -> str:
    """``text`` (a spec or URL) with any ``USER:PASSWORD@`` after its ``://`` shown as ``***@``. The
    authority ends at the last ``@`` before the first ``#``, so a password holding ``/`` or ``?`` is
    hidden too."""
    scheme_end = text.find("://")
    if scheme_end < 0:
        return text
    start = scheme_end + 3
    end = text.find("#", start)
    at = text.rfind("@", start, len(text) if end < 0 else end)
    return text if at < 0 else f"{text[:start]}***{text[at:]}"


def refuse_credentials(spec: str) -> None:
    """A spec whose URL holds ``USER:PASSWORD@``: refused, shown without them. The header, the load
    line and every error print the spec, and such credentials would never be sent anyway."""
    __tracebackhide__ = True
    shown = without_credentials(spec)
    if shown != spec:
        raise ConfigurationError("llm_model", shown, "the URL holds credentials (USER:PASSWORD@), which "
                                 "would be printed with the spec and are never sent. Put the key in an "
                                 "environment variable and name it: "
                                 "openai:http://HOST:PORT/v1#api_key_env=NAME&tokenizer=PATH (sent as "
                                 "'Authorization: Bearer', to this server only)")


# Model files `llm-golden fetch NAME DIR` puts into DIR (fetch.MODELS holds what it downloads).
FETCHABLE_FILES = {"SmolLM2-135M-Instruct.Q4_1.gguf": "smollm2"}


def how_to_get(path: str, *, example: str = "models/NAME") -> str:
    """How to put the missing model ``path`` in place (``example``: a spec to set afterwards)."""
    name = path.replace("\\", "/").rpartition("/")[2]
    if name in FETCHABLE_FILES:
        folder = path[: len(path) - len(name)].rstrip("/\\") or "."
        return (f"fetch it (checked against its pinned SHA-256) with `llm-golden fetch {FETCHABLE_FILES[name]} "
                f"{folder}`")
    return ("download the model first (e.g. `hf download ORG/NAME --local-dir models/NAME`) and set "
            f"{pasteable('llm_model', example)}")


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
                f"{limit}{rows * length:,} tokens per batch: the input ids and attention mask alone would take "
                f"{_size(16 * rows * length)}, and attention needs about {_size(4 * rows * length * length)} "
                f"per layer and head for its fp32 scores. Expected B <= {MAX_ROWS}, L <= {MAX_LENGTH:,} and "
                f"B x L <= {MAX_TOKENS:,}, for example '4x64'",
            )
        return cls(rows, length)

    def running(self, prompt_tokens: int) -> BatchShape:
        """The shape a chunk whose longest prompt has ``prompt_tokens`` tokens really runs in: this one,
        except at one row, where a prompt has no companions to be invariant to, so it runs at its own
        length, unpadded, as a plain ``model.generate()`` of it would (bounded by the model's context only)."""
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


def flag(text: str) -> bool:
    """``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``."""
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def engine_params(spec: str, params: dict[str, str], accepted: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
    """An engine spec's ``#key=value`` options, each parsed by its type, with defaults filled in.

    ``accepted`` maps a key to ``(parse, default)``; an unknown key or a bad value names the fix.
    """
    __tracebackhide__ = True
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ConfigurationError("llm_model", spec, f"unknown option {unknown[0]!r} after '#'; this engine "
                                 f"takes: {', '.join(sorted(accepted))}")
    parsed = {key: default for key, (_, default) in accepted.items()}
    for key, text in params.items():
        parse = accepted[key][0]
        try:
            parsed[key] = parse(text)
        except ValueError:
            raise ConfigurationError("llm_model", spec, f"option {key}={text!r} is not a valid "
                                     f"{getattr(parse, '__name__', 'value')}") from None
        if parse is int and parsed[key] < 1:
            raise ConfigurationError("llm_model", spec, f"option {key}={text!r} must be at least 1")
    return parsed
