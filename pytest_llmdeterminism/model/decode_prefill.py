"""Decode against prefill: a generation's steps against the teacher-forced score of its own tokens
(:func:`decode_vs_prefill`, the audit's ``decode-vs-prefill`` row where the engine can score), and
:func:`assert_decode_matches_prefill`, its opt-in check in a test; the phases of a prefill
(:func:`phase_rows`, the audit's ``chunked-prefill`` and ``prefix-reuse`` rows where the engine can
forward in pieces): the same tokens in chunks, or continuing a reused prefix's cache, against one
forward."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_llmdeterminism.engines.loaded import PhasedEngine
from pytest_llmdeterminism.errors import ConfigurationError, LLMDeterminismError
from pytest_llmdeterminism.reporting.audit import CHUNKED_PREFILL, PREFIX_REUSE, AuditRow, DecodeVsPrefill

if TYPE_CHECKING:
    import torch

    from pytest_llmdeterminism.generation import Generation
    from pytest_llmdeterminism.model.llm_model import LLMModel

__all__ = ["DecodePrefillMismatchError", "assert_decode_matches_prefill", "decode_vs_prefill", "phase_rows"]

# A decode step per position, odd and aligned chunks, and one longer than most prompts.
CHUNKS = (1, 2, 7, 64)


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


def phase_rows(llm_model: LLMModel, generation: Generation) -> list[AuditRow]:
    """The audit's ``chunked-prefill`` row (the generation's prompt and tokens forwarded in chunks of
    1, 2, 7 and 64 positions over one KV cache, each against one forward) and ``prefix-reuse`` row (its
    tokens continuing the prompt's cache cut from the prefill of another request that shares the
    prompt, against one forward): identical, or the first position that differs (the first whose
    greedy token differs, where one does), the top-2 margin of the one-forward logits there, and the
    largest difference of a logit; empty where the engine cannot forward in pieces."""
    import torch

    engine = llm_model.loaded.engine
    if not isinstance(engine, PhasedEngine):
        return []
    prompt, tokens = list(generation.prompt_token_ids), list(generation.token_ids)
    ids, seed = prompt + tokens, llm_model.settings.seed
    once = engine.phase_logits(ids, [len(ids)], seed)
    chunked = [(chunk, engine.phase_logits(ids, _pieces(len(ids), chunk), seed)) for chunk in CHUNKS]
    moved = next(((chunk, logits) for chunk, logits in chunked if not torch.equal(logits, once)), None)
    change = f"chunks {', '.join(map(str, CHUNKS))}" + (f": {moved[0]} first" if moved else "")
    rows = [_phase_row(CHUNKED_PREFILL, change, once, moved[1] if moved else once, len(prompt) - 1)]
    if tokens:
        # another request sharing the prompt (its tokens reversed after it) builds the prompt's cache
        donor = prompt + tokens[::-1] + [tokens[0]]
        reused = engine.phase_logits(ids, [len(prompt), len(tokens)], seed, reuse_from=donor)
        rows.append(_phase_row(PREFIX_REUSE, f"the prompt's {len(prompt)}-token cache from another request",
                               once, reused, len(prompt) - 1))
    else:
        rows.append(AuditRow(PREFIX_REUSE, "the generation has no tokens to continue the prompt with", False,
                             None, 0.0, ran=False))
    return rows


def _pieces(length: int, chunk: int) -> list[int]:
    return [min(chunk, length - start) for start in range(0, length, chunk)]


def _phase_row(source: str, change: str, once: torch.Tensor, other: torch.Tensor,
               first_step: int) -> AuditRow:
    """One forward's logits against another phase's: the first position that differs, or the first
    from ``first_step`` on (the positions that predict the generated tokens) whose greedy token
    (argmax) differs where one does, the top-2 logprob margin there and the largest difference of a
    logit."""
    import torch

    differs = (once != other).any(dim=-1)
    if not bool(differs.any()):
        return AuditRow(source, change, False, None, 0.0)
    flipped = torch.nonzero(once[first_step:].argmax(dim=-1) != other[first_step:].argmax(dim=-1))
    at = first_step + int(flipped[0]) if len(flipped) else int(torch.nonzero(differs)[0])
    top = torch.log_softmax(once[at], dim=-1).topk(2).values
    return AuditRow(source, change, bool(len(flipped)), at, float((once - other).abs().max()),
                    draw_margin=float(top[0] - top[1]))
