"""The needle runner's documented import path, kept: it lives in ``engines/server/companions.py``
with the other server modules."""

from __future__ import annotations

from pytest_llmdeterminism.engines.server.companions import (
    CompanionRound,
    alone,
    companion_prompts,
    run_among,
)

__all__ = ["CompanionRound", "alone", "companion_prompts", "run_among"]
