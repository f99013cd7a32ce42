"""Decode against prefill: a generation's steps against the teacher-forced score of its own tokens
(:func:`decode_vs_prefill`, the audit's ``decode-vs-prefill`` row where the engine can score), and
:func:`assert_decode_matches_prefill`, its opt-in check in a test."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_llmdeterminism.errors import ConfigurationError, LLMDeterminismError
from pytest_llmdeterminism.reporting.audit import DecodeVsPrefill

if TYPE_CHECKING:
    from pytest_llmdeterminism.generation import Generation
    from pytest_llmdeterminism.model.llm_model import LLMModel

__all__ = ["DecodePrefillMismatchError", "assert_decode_matches_prefill", "decode_vs_prefill"]


class DecodePrefillMismatchError(LLMDeterminismError, AssertionError):
    """A generation's steps and the score of its own tokens differ beyond the tolerance
    (:func:`assert_decode_matches_prefill`). ``found`` holds the comparison."""

    def __init__(self, found: DecodeVsPrefill) -> None:
        self.found = found
        super().__init__("\n".join(found.lines()))


def decode_vs_prefill(llm_model: LLMModel, generation: Generation, *,
                      tolerance: float | None = None) -> DecodeVsPrefill:
    """Score ``generation``'s prompt and generated tokens (teacher-forced, one forward) and compare each
    generated step with the score's position: the logit hashes (bitwise is asked under phase-invariant
    kernels: ``kernels.PHASE_INVARIANT``) and the generated token's logprob and the top-k logprobs both
    name (within ``tolerance`` otherwise: the dtype's default ``atol``). A sampled generation's token
    may be outside its step's top-k: there only the shared top-k are compared."""
    from pytest_llmdeterminism.compute.kernels import PHASE_INVARIANT
    from pytest_llmdeterminism.judge.tolerance import DEFAULT_ATOL

    if not generation.token_ids:
        raise ConfigurationError("decode_vs_prefill(generation)", generation.text,
                                 "the generation has no tokens to score; generate at least one")
    score = llm_model.score(list(generation.prompt_token_ids), list(generation.token_ids))
    identical = sum(a == b for a, b in zip(generation.step_hashes, score.step_hashes, strict=True))
    first = next((t for t, (a, b) in enumerate(zip(generation.step_hashes, score.step_hashes, strict=True))
                  if a != b), None)
    delta = 0.0
    for step, token in enumerate(generation.token_ids):
        decoded, prefilled = dict(generation.top_logprobs[step]), dict(score.top_logprobs[step])
        if token in decoded:
            delta = max(delta, abs(decoded[token] - score.logprobs[step]))
        delta = max([delta, *(abs(decoded[i] - prefilled[i]) for i in decoded.keys() & prefilled.keys())])
    fingerprint = llm_model.fingerprint
    atol = tolerance if tolerance is not None else DEFAULT_ATOL.get(fingerprint.get("dtype", "float32"),
                                                                    DEFAULT_ATOL["float32"])
    return DecodeVsPrefill(generation.prompt, len(generation.token_ids), identical, first, delta,
                           bitwise=fingerprint.get("batch_invariant") in PHASE_INVARIANT, tolerance=atol)


def assert_decode_matches_prefill(llm_model: LLMModel, generation: Generation, *,
                                  tolerance: float | None = None) -> DecodeVsPrefill:
    """The opt-in decode-equals-prefill check: score ``generation``'s own tokens (teacher-forced, one
    forward) and raise :class:`DecodePrefillMismatchError` unless every step's logits are the score's
    position's, bit for bit, under phase-invariant kernels (the default batch-invariant kernels of
    portable numerics on x86-64: the same linears in both phases and position-canonical attention);
    under other kernels, where a step's generated-token logprob or a shared top-k logprob differs by
    more than ``tolerance`` (the dtype's default ``atol``; decode runs other linear kernels than
    prefill there, or attention reduced over another length: measured 4e-6 on the tiny model, 2e-5 on
    SmolLM2). Returns the comparison (``lines()`` says how many steps were bitwise identical)."""
    __tracebackhide__ = True
    found = decode_vs_prefill(llm_model, generation, tolerance=tolerance)
    if not found.ok:
        raise DecodePrefillMismatchError(found)
    return found
