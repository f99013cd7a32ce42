"""Per-step streaming capture of what the model computed: logit hash, top-k logprobs, margin.

The capture is a forward hook on the model itself, so it sees the model's own output logits
before any logits processor (repetition penalty, suppressed tokens, ...) touched them. Each step
is reduced to a hash and k numbers per row at once: memory does not grow with
``max_new_tokens x vocab``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

LOGIT_HASH_DEFINITION = (
    "xxh3_64 hex digest of the model forward's output logits at the last position of each row, "
    "before any logits processor, cast to float32, as little-endian bytes"
)
TOP_K = 5
LOGPROB_DECIMALS = 6


@dataclass
class RowSteps:
    hashes: list[str] = field(default_factory=list)
    top: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)


class StepCapture:
    """Context manager: records every forward step of ``model`` for the first ``rows`` rows."""

    def __init__(self, model: torch.nn.Module, rows: int, top_k: int = TOP_K) -> None:
        self._model = model
        self._top_k = top_k
        self.rows = [RowSteps() for _ in range(rows)]
        self._handle: Any = None

    def __enter__(self) -> StepCapture:
        self._handle = self._model.register_forward_hook(self._on_forward)
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()

    def _on_forward(self, module: Any, args: Any, output: Any) -> None:
        import numpy as np
        import torch
        import xxhash

        logits = output.logits if hasattr(output, "logits") else output[0]
        last = logits[: len(self.rows), -1, :].detach().to(torch.float32)
        logprobs = torch.log_softmax(last, dim=-1)
        top = torch.topk(logprobs, k=min(self._top_k, logprobs.shape[-1]), dim=-1)
        raw = np.ascontiguousarray(last.cpu().numpy(), dtype="<f4")
        top_ids = top.indices.cpu().tolist()
        top_values = top.values.cpu().tolist()
        for row, steps in enumerate(self.rows):
            steps.hashes.append(xxhash.xxh3_64_hexdigest(raw[row]))
            values = [round(v, LOGPROB_DECIMALS) for v in top_values[row]]
            steps.top.append(tuple(zip(top_ids[row], values)))
            margin = top_values[row][0] - top_values[row][1] if len(values) > 1 else float("inf")
            steps.margins.append(round(margin, LOGPROB_DECIMALS))
