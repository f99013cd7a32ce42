"""Speculative decoding on the transformers backend: transformers' own assisted generation
(``prompt_lookup_num_tokens``, ``assistant_model``), one row at a time, recorded step by step.

A verify pass forwards the last token and k drafts at once; the tokens it accepts, and the next one,
are greedy decoding's only if that forward computes each position as a one-row decode step does.
On the phase-invariant kernels (``compute/kernels.py``: the same linears in both phases and
position-canonical attention) it does, bit for bit, so a speculated call is checked against the plain
call's golden and every step's hash must match. On other kernels the speculation is refused.

transformers runs assisted generation for one sequence at a time (``batch_size = 1``): each row runs
alone, unpadded, which the batch-invariant kernels make the same computation as its row of the fixed
shape. Each committed step's raw logits and scores come from ``generate``'s own ``output_logits`` and
``output_scores`` (one per committed token, verify passes and the draft's forwards apart); the verify
passes' drafts and acceptances from its candidate generator.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.compute.determinism import deterministic_state
from pytest_llmdeterminism.engines.capture import Chunk, StepCapture
from pytest_llmdeterminism.engines.checkpoint import clean_generation_config
from pytest_llmdeterminism.errors import ConfigurationError
from pytest_llmdeterminism.generation import Speculated

if TYPE_CHECKING:
    import torch

    from pytest_llmdeterminism.compute.kernels import Kernels
    from pytest_llmdeterminism.decoding import DecodingConfig, Speculation


def checked(kernels: Kernels, model: Any, asked: Speculation) -> Speculation:
    """``asked`` as the engine runs it: refused unless a verify pass computes what decode does (the
    phase-invariant kernels); an ``assistant_model`` is the model itself (the ``llm_model`` object,
    or its transformers ``.model``), which drafts as the model, another model refused."""
    __tracebackhide__ = True
    refuse_unless_lossless(kernels, asked)
    if asked.method != "assistant":
        return asked
    if asked.assistant is model or getattr(asked.assistant, "model", None) is model:
        return dataclasses.replace(asked, assistant=model)
    raise ConfigurationError(
        "llm_model.generate(assistant_model=...)", type(asked.assistant).__name__,
        "the draft model here is the model itself (assistant_model=llm_model): the golden's model is the "
        "one configured for the suite, and another draft model would need a second configured model. "
        "For drafts without a model, pass prompt_lookup_num_tokens=N")


def refuse_unless_lossless(kernels: Kernels, speculation: Speculation) -> None:
    """Speculation only where a verify pass computes what decode does: the phase-invariant kernels."""
    __tracebackhide__ = True
    if not kernels.phase_invariant:
        setting = ("prompt_lookup_num_tokens" if speculation.method == "prompt_lookup" else "assistant_model")
        raise ConfigurationError(
            f"llm_model.generate({setting}=...)", speculation.describe(),
            f"speculation is lossless only where a verify pass of k + 1 positions computes each position "
            f"as a one-token decode step does; the kernels here ({kernels.generation or 'the stock ones'}) "
            "do not (decode = prefill bitwise needs the batch-invariant kernels of portable CPU numerics "
            "on x86-64: llm_cpu_numerics = portable, llm_batch_invariant = true). Generate without "
            "speculation")


def speculate(model: Any, kernels: Kernels, device: str, rows: list[list[int]], config: DecodingConfig,
              arguments: dict[str, Any], seed: int, keep_logits: bool) -> Chunk:
    """Each row's greedy generation by transformers' assisted generation, alone and unpadded;
    ``arguments``: the call's ``GenerationConfig`` keywords (greedy, without the speculation)."""
    speculation = config.speculation
    assert speculation is not None  # checked() let it through: the engine's speculation()
    chunk = Chunk(tokens=[], steps=[], speculated=[])
    for ids in rows:
        drafts: list[tuple[int, list[int]]] = []  # per verify pass: where its drafts start, their ids
        found, chunk.flags = _one_row(model, kernels, device, ids, speculation, arguments, seed, drafts)
        chunk.tokens.append(found.sequences[0, len(ids):].tolist())
        # The committed steps, recorded as a plain generation's are (one step, one row at a time)
        with StepCapture(None, rows=1, keep_logits=keep_logits) as capture:
            for raw, scores in zip(found.logits, found.scores, strict=True):
                capture.add(raw[:1], scores[:1])
        chunk.steps.append(capture.rows[0])
        if keep_logits:  # per step one vocabulary row, as the plain path keeps them
            chunk.logits.append([step[0] for step in capture.logits])
        assert chunk.speculated is not None
        chunk.speculated.append(acceptance(speculation.method, len(ids), chunk.tokens[-1], drafts))
    return chunk


def _one_row(model: Any, kernels: Kernels, device: str, ids: list[int], speculation: Speculation,
             arguments: dict[str, Any], seed: int,
             drafts: list[tuple[int, list[int]]]) -> tuple[Any, dict[str, Any]]:
    """``generate``'s output for one row (with every committed step's raw logits and scores) and the
    determinism settings in force; each verify pass's drafts into ``drafts``."""
    import torch
    from transformers import GenerationConfig
    from transformers.utils import logging as hf_logging

    from pytest_llmdeterminism.compute.determinism import flags

    settings = {**arguments, "return_dict_in_generate": True, "output_logits": True, "output_scores": True}
    extra: dict[str, Any] = {}
    if speculation.method == "prompt_lookup":
        settings["prompt_lookup_num_tokens"] = speculation.tokens
    else:
        extra["assistant_model"] = speculation.assistant
    own = vars(model).get("_get_candidate_generator")  # an instance's own, put back afterwards
    model._get_candidate_generator = _counting(model._get_candidate_generator, drafts)
    # transformers' own draft loop passes a config and keywords together and warns about it: not the
    # user's doing, so not the user's output
    generation_log = hf_logging.get_logger("transformers.generation.utils")
    level = generation_log.level
    generation_log.setLevel(logging.ERROR)
    try:
        with clean_generation_config(model), deterministic_state(seed), torch.inference_mode(), \
                kernels.routed(model):
            found = model.generate(input_ids=torch.tensor([ids], device=device),
                                   attention_mask=torch.ones((1, len(ids)), dtype=torch.long, device=device),
                                   generation_config=GenerationConfig(**settings), **extra)
            return found, flags()
    finally:
        generation_log.setLevel(level)
        if own is None:
            del model._get_candidate_generator  # the class's method again
        else:
            model._get_candidate_generator = own


def _counting(make: Any, drafts: list[tuple[int, list[int]]]) -> Any:
    """``_get_candidate_generator`` whose generator records each verify pass's drafts: where they
    start (the sequence's length) and their ids."""

    def counted(*args: Any, **kwargs: Any) -> Any:
        return _CountedCandidates(make(*args, **kwargs), drafts)

    return counted


class _CountedCandidates:
    """A transformers candidate generator that records its drafts; every attribute is the wrapped one's."""

    def __init__(self, inner: Any, drafts: list[tuple[int, list[int]]]) -> None:
        self._inner, self._drafts = inner, drafts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def get_candidates(self, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        candidates, candidate_logits = self._inner.get_candidates(input_ids, *args, **kwargs)
        start = int(input_ids.shape[1])
        self._drafts.append((start, candidates[0, start:].tolist()))
        return candidates, candidate_logits


def acceptance(method: str, prompt_length: int, tokens: list[int],
               drafts: list[tuple[int, list[int]]]) -> Speculated:
    """The verify passes' acceptance, read against the generation itself: a pass accepted its drafts up
    to the first that is not the generated token at its position (transformers' own count leaves out
    a draft an EOS or the length limit cut the pass at). Drafts past the generation's end (beyond its
    EOS or its length limit) were never up for acceptance and are not counted as drafted."""
    drafted = accepted = 0
    for start, candidates in drafts:
        at = start - prompt_length
        within = candidates[:max(0, len(tokens) - at)]
        drafted += len(within)
        for offset, token in enumerate(within):
            if tokens[at + offset] != token:
                break
            accepted += 1
    return Speculated(method, len(drafts), drafted, accepted)
