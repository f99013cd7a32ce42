"""Per-step capture of what the model computed: logit hash, top-k logprobs, margin.

A forward hook hashes the model's own logits (before any logits processor: the hash identifies the
numerics); a logits processor placed last records the top-k logprobs and margin of the scores
greedy decoding picks from. Both reduce their steps in blocks of :data:`BLOCK_BYTES`. Why, and what
it costs: ``docs/design/engines.md``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.errors import NonFiniteLogitsError
from pytest_llmdeterminism.generation import LOGPROB_DECIMALS, LOGPROB_FLOOR, TOP_K

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import torch
    from torch.utils.hooks import RemovableHandle

    from pytest_llmdeterminism.generation import Speculated

    Logits = npt.NDArray[np.float32]  # one step's raw float32 logits of one row (or rows x vocab)

# Steps' rows a tap holds before it reduces them: a block of steps at a time, memory bounded.
BLOCK_BYTES = 16 << 20


@dataclass
class RowSteps:
    """One row's steps as every engine records them: hash, top-k ``(token id, logprob)``, margin."""

    hashes: list[str] = field(default_factory=list)
    top: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)

    def append(self, step_hash: str, ids: list[int], logprobs: list[float]) -> None:
        """One step: ``ids`` and ``logprobs`` best first. Rounded, floored and margined here, once for
        every engine, so that goldens of different engines hold the same kind of numbers."""
        finite = [max(v, LOGPROB_FLOOR) for v in logprobs]
        self.hashes.append(step_hash)
        self.top.append(tuple(zip(ids, (round(v, LOGPROB_DECIMALS) for v in finite), strict=True)))
        margin = finite[0] - finite[1] if len(finite) > 1 else math.inf
        self.margins.append(round(min(margin, -LOGPROB_FLOOR), LOGPROB_DECIMALS))


@dataclass
class Chunk:
    """What an engine computed for the prompts of one call, row by row (filler rows excluded)."""

    tokens: list[list[int]]  # the generated ids, up to the engine's stop (an EOS included)
    steps: list[RowSteps]
    flags: dict[str, Any] = field(default_factory=dict)  # determinism settings in force for the call
    logits: list[list[Logits]] = field(default_factory=list)  # per row, per step: raw logits (keep_logits)
    draw_margins: list[list[float]] = field(default_factory=list)  # per row, per step: do_sample=True only
    # Where the engine decodes and stops by itself (a server): its text, pieces and finish reasons.
    texts: list[str] | None = None
    pieces: list[list[str]] | None = None
    finish_reasons: list[str] | None = None
    # Where the call speculated (engines/hf_speculative.py): per row, its verify passes' acceptance.
    speculated: list[Speculated] | None = None


def logits_step(raw: Logits, step: int, top_k: int = TOP_K) -> tuple[str, list[int], list[float]]:
    """Hash, top-k ids and logprobs of one float32 logits row (numpy), for engines that hand over raw
    logits one row at a time (llama.cpp). The hash is :data:`LOGIT_HASH_DEFINITION`'s."""
    import numpy as np
    import xxhash

    row = np.ascontiguousarray(raw, dtype="<f4")
    if not np.isfinite(row).all():
        raise NonFiniteLogitsError(step, 0)
    # k argmax passes, not np.argpartition: its SIMD selection (x86-simd-sort, picked per CPU) returned
    # another top-5 for 50 of 300 random rows under an emulated Haswell, and with it another greedy
    # token; argmax agreed with a stable sort natively and there (300 of 300), at 28 us per step.
    # Ties go to the lowest id, as with torch.argmax.
    work, best = row.copy(), []
    for _ in range(min(top_k, row.size)):
        best.append(int(np.argmax(work)))
        work[best[-1]] = -np.inf
    shift = row.max()
    log_total = np.float32(np.log(np.exp(row - shift, dtype=np.float32).sum(dtype=np.float32)))
    return xxhash.xxh3_64_hexdigest(row.tobytes()), best, [float(row[i] - shift - log_total) for i in best]


class StepCapture:
    """Context manager: records every step of ``model.generate`` for the first ``rows`` rows.

    Pass :meth:`logits_processor` to ``generate``. Per step it keeps one hash per row (an integer)
    and a ``rows x k`` top-k tensor; hex digests, Python lists and the per-row records are built
    once, when the block ends. Without a model (``None``) nothing is hooked: :meth:`add` hands over
    each step's raw logits and scores (``generate``'s ``output_logits`` and ``output_scores``).
    """

    def __init__(self, model: torch.nn.Module | None, rows: int, top_k: int = TOP_K, *,
                 keep_logits: bool = False, processed: bool = True) -> None:
        import numpy
        import torch
        import xxhash

        self._model = model
        self._keep_logits = keep_logits
        self._processed = processed  # logits processors change the scores: record them apart
        self.logits: list[Logits] = []  # per step, rows x vocab float32 (only with keep_logits, for audits)
        self._top_k = top_k
        self._n_rows = rows
        self._hashes: list[list[int]] = []  # per step, per row: xxh3_64 as an integer
        self._top_values: list[torch.Tensor] = []  # per block of steps: steps x rows x k
        self._top_ids: list[torch.Tensor] = []
        self._raw: list[torch.Tensor] = []  # steps not reduced yet: rows x vocab float32 copies
        self._scores: list[torch.Tensor] = []
        self._non_finite: tuple[int, int] | None = None
        self._handle: RemovableHandle | None = None
        self.rows: list[RowSteps] = []
        # Bound once: the hook and the processor run at every step of every call.
        self._numpy, self._torch, self._digest = numpy, torch, xxhash.xxh3_64_intdigest

    def __enter__(self) -> StepCapture:  # noqa: PYI034
        if self._model is not None:
            self._handle = self._model.register_forward_hook(self._on_forward)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.remove()
        if exc[0] is None:
            self._reduce_raw()
            self._reduce_scores()
            self._raise_if_non_finite()
            self.rows = self._per_row()

    def logits_processor(self) -> Any:
        """A transformers ``LogitsProcessorList`` whose one processor records the final scores (none
        without processors: the hook's raw logits are those scores)."""
        from transformers import LogitsProcessorList

        return LogitsProcessorList([_record_scores_class()(self._on_scores)] if self._processed else [])

    def _on_forward(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        logits = output.logits if hasattr(output, "logits") else output[0]
        self._on_raw(logits[: self._n_rows, -1, :].to(self._torch.float32, copy=True))

    def add(self, raw: torch.Tensor, scores: torch.Tensor) -> None:
        """One step's raw logits and the scores greedy picked from (``rows x vocab`` each)."""
        self._on_raw(raw.to(self._torch.float32, copy=True))
        if self._processed:
            self._on_scores(scores)

    def _on_raw(self, raw: torch.Tensor) -> None:
        self._raw.append(raw)
        if not self._processed:
            self._scores.append(raw)  # the scores greedy picks from: the same numbers
        if len(self._raw) * self._raw[0].numel() * 4 >= BLOCK_BYTES:
            self._reduce_raw()
            self._reduce_scores()

    def _on_scores(self, scores: torch.Tensor) -> None:
        self._scores.append(scores[: self._n_rows].to(self._torch.float32, copy=True))
        if len(self._scores) * self._scores[0].numel() * 4 >= BLOCK_BYTES:
            self._reduce_scores()

    def _reduce_raw(self) -> None:
        """Hash the held steps' raw logits: one contiguous steps x rows x vocab buffer, row by row."""
        if not self._raw:
            return
        np = self._numpy
        raw = np.ascontiguousarray(self._torch.stack(self._raw).cpu().numpy(), dtype="<f4")
        self._raw = []
        if self._non_finite is None and not np.isfinite(raw).all():
            step, row = np.argwhere(~np.isfinite(raw).all(axis=2))[0]
            self._non_finite = (len(self._hashes) + int(step), int(row))
        # Over one contiguous buffer: memoryview slices copy nothing.
        steps, rows, vocab = raw.shape
        buffer, width, digest = memoryview(raw).cast("B"), vocab * 4, self._digest
        for step in range(steps):
            start = step * rows
            self._hashes.append([digest(buffer[(start + row) * width:(start + row + 1) * width])
                                 for row in range(rows)])
        if self._keep_logits:
            self.logits += list(raw.copy())

    def _reduce_scores(self) -> None:
        """Top-k logprobs of the held steps' scores, all steps at once (softmax is row by row)."""
        if not self._scores:
            return
        torch = self._torch
        scores = torch.stack(self._scores)
        self._scores = []
        top = torch.topk(torch.log_softmax(scores, dim=-1), k=min(self._top_k, scores.shape[-1]), dim=-1)
        self._top_values.append(top.values)
        self._top_ids.append(top.indices)

    def _raise_if_non_finite(self) -> None:
        __tracebackhide__ = True
        if self._non_finite is not None:
            step, row = self._non_finite
            raise NonFiniteLogitsError(step, row)

    def _per_row(self) -> list[RowSteps]:
        torch = self._torch
        if not self._hashes:
            return [RowSteps() for _ in range(self._n_rows)]
        values = torch.cat(self._top_values).transpose(0, 1).cpu().tolist()  # rows x steps x k
        ids = torch.cat(self._top_ids).transpose(0, 1).cpu().tolist()
        rows = []
        for row in range(self._n_rows):
            steps = RowSteps()
            # The hex digest xxhash.xxh3_64_hexdigest gives: 16 lowercase digits, zero-padded.
            hashes = (f"{h[row]:016x}" for h in self._hashes)
            for step_hash, step_ids, step_values in zip(hashes, ids[row], values[row], strict=True):
                steps.append(step_hash, step_ids, step_values)
            rows.append(steps)
        return rows


@functools.cache
def _record_scores_class() -> type:
    """The logits processor class, made once: transformers is imported only when a model runs.

    ``LogitsProcessorList`` asks ``inspect.signature`` of every processor at every step; a signature
    stored on ``__call__`` spares it rebuilding one from the code each time."""
    import inspect

    from transformers import LogitsProcessor

    class _RecordScores(LogitsProcessor):  # type: ignore[misc]
        def __init__(self, record: Callable[[torch.Tensor], None]) -> None:
            self._record = record

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            self._record(scores)
            return scores

    _RecordScores.__call__.__signature__ = inspect.signature(_RecordScores.__call__)  # type: ignore[attr-defined]
    return _RecordScores


@dataclass
class ScoredRow:
    """One (prompt, continuation) pair as every engine scores it, position by position: the hash of
    the logits row that predicts each continuation token (as a generation step's), the token's
    logprob, its rank (1 + how many vocabulary logprobs are strictly greater; ``None`` where an
    engine does not see the whole vocabulary and the token is outside its top-k), its rank margin
    (the logprob distance to the nearest other token, above or below; ``None`` where unknown), the
    top-k ``(token id, logprob)`` pairs; and the prompt tokens' logprobs when asked (the first
    ``None``)."""

    hashes: list[str] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ranks: list[int | None] = field(default_factory=list)
    rank_margins: list[float | None] = field(default_factory=list)
    top: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    prompt_logprobs: list[float | None] = field(default_factory=list)


@dataclass
class ScoreChunk:
    """What an engine computed for the pairs of one score call, row by row (filler rows excluded)."""

    rows: list[ScoredRow]
    flags: dict[str, Any] = field(default_factory=dict)  # determinism settings in force for the call
    # Where a server tokenised and decoded itself: each continuation token's text.
    pieces: list[list[str]] | None = None


def rounded(logprob: float) -> float:
    """A logprob as goldens hold it: floored (``-inf`` has no JSON) and rounded."""
    return round(max(logprob, LOGPROB_FLOOR), LOGPROB_DECIMALS)


def rank_and_margin(token: Hashable, own: float, ranked: list[tuple[Any, float]],
                    top_k: int) -> tuple[int | None, float | None]:
    """For engines that see a top-k only (servers, vLLM): the given token's rank where it is among
    ``ranked`` (the k best ``(token, logprob)``, best first): 1 + how many there have a greater
    logprob; its rank margin where both its neighbours are known (it is not the last of the k, or
    the engine had fewer than k to give); ``None`` for what the top-k does not say."""
    tokens = [t for t, _ in ranked]
    if token not in tokens:
        return None, None
    rank = 1 + sum(1 for _, lp in ranked if lp > own)
    others = [abs(lp - own) for t, lp in ranked if t != token]
    below_known = tokens.index(token) < len(ranked) - 1 or len(ranked) < top_k
    if not others or not below_known:
        return rank, None
    return rank, round(min(min(others), -LOGPROB_FLOOR), LOGPROB_DECIMALS)


def score_positions(raw: torch.Tensor, logprobs: torch.Tensor, targets: list[int],
                    top_k: int = TOP_K) -> ScoredRow:
    """Score ``targets`` from the float32 logits rows that predict them (``raw``: positions x vocab,
    on the CPU; row ``t`` predicts ``targets[t]``) and their log-softmax (``logprobs``, computed by
    the engine's own function, so that a position's numbers are a generation step's; overwritten
    here). Hashes as :data:`LOGIT_HASH_DEFINITION`; top-k by ``torch.topk``, as :class:`StepCapture`
    records a step's. In torch, over the threads: for a 512-token continuation (25 million logprobs,
    SmolLM2) about 0.15 s, a tenth of the forward that computed them (``benchmarks/score_cost.py``)."""
    import numpy as np
    import torch
    import xxhash

    # A row's sum is finite where all its values are (a sum of float32 logits does not overflow);
    # where it is not, the values say which row.
    if not bool(torch.isfinite(raw.sum(dim=1)).all()):
        broken = ~torch.isfinite(raw).all(dim=1)
        if bool(broken.any()):
            raise NonFiniteLogitsError(int(torch.nonzero(broken)[0, 0]), 0)
    rows = np.ascontiguousarray(raw.numpy(), dtype="<f4")
    index = torch.tensor(targets, dtype=torch.long)[:, None]
    given = logprobs.gather(1, index)
    top = torch.topk(logprobs, k=min(top_k, logprobs.shape[1]), dim=-1)
    # One difference for both, in place (the caller's logprobs are not read again): a - b > 0 exactly
    # where a > b (IEEE, no flush to zero). The count over bytes: the bool sum's fastest form.
    difference = logprobs.sub_(given)
    above = (difference > 0).view(torch.uint8).sum(dim=1, dtype=torch.int32).tolist()
    if logprobs.shape[1] > 1:
        nearest = difference.abs_().scatter_(1, index, torch.inf).amin(dim=1).tolist()
    else:
        nearest = [math.inf] * len(targets)
    del difference
    ids, values, chosen = top.indices.tolist(), top.values.tolist(), given[:, 0].tolist()
    scored = ScoredRow()
    for t in range(len(targets)):
        scored.hashes.append(xxhash.xxh3_64_hexdigest(memoryview(rows[t])))
        scored.logprobs.append(rounded(chosen[t]))
        scored.ranks.append(int(above[t]) + 1)
        scored.rank_margins.append(None if not math.isfinite(nearest[t]) else
                                   round(min(nearest[t], -LOGPROB_FLOOR), LOGPROB_DECIMALS))
        scored.top.append(tuple((int(i), rounded(v)) for i, v in zip(ids[t], values[t], strict=True)))
    return scored


def prompt_positions(logprobs: torch.Tensor, prompt: list[int]) -> list[float | None]:
    """The prompt tokens' logprobs from the log-softmax rows of the prompt's positions (row ``i``
    predicts ``prompt[i + 1]``; the first token has none)."""
    import torch

    if len(prompt) < 2:
        return [None]
    index = torch.tensor(prompt[1:], dtype=torch.long)[:, None]
    found: list[float] = logprobs.gather(1, index)[:, 0].tolist()
    return [None, *(rounded(v) for v in found)]
