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
    """Context manager: records every forward step of ``model`` for the first ``rows`` rows.

    Per step it keeps one hash per row and a ``rows x k`` top-k; the per-row records are built
    once, when the block ends, so the hot path is a few tensor ops and ``rows`` hash calls.
    """

    def __init__(self, model: torch.nn.Module, rows: int, top_k: int = TOP_K) -> None:
        self._model = model
        self._top_k = top_k
        self._n_rows = rows
        self._hashes: list[list[str]] = []
        self._top_values: list[torch.Tensor] = []
        self._top_ids: list[torch.Tensor] = []
        self._handle: Any = None
        self.rows: list[RowSteps] = []

    def __enter__(self) -> StepCapture:  # noqa: PYI034
        self._handle = self._model.register_forward_hook(self._on_forward)
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()
        self.rows = self._per_row()

    def _on_forward(self, module: Any, args: Any, output: Any) -> None:
        import numpy as np
        import torch
        import xxhash

        logits = output.logits if hasattr(output, "logits") else output[0]
        last = logits[: self._n_rows, -1, :].detach().to(torch.float32)
        raw = np.ascontiguousarray(last.cpu().numpy(), dtype="<f4")
        self._hashes.append([xxhash.xxh3_64_hexdigest(row) for row in raw])
        top = torch.topk(torch.log_softmax(last, dim=-1), k=min(self._top_k, last.shape[-1]), dim=-1)
        self._top_values.append(top.values)
        self._top_ids.append(top.indices)

    def _per_row(self) -> list[RowSteps]:
        import torch

        if not self._hashes:
            return [RowSteps() for _ in range(self._n_rows)]
        values = torch.stack(self._top_values, dim=1).cpu().tolist()  # rows x steps x k
        ids = torch.stack(self._top_ids, dim=1).cpu().tolist()
        rows = []
        for row in range(self._n_rows):
            steps = RowSteps(hashes=[h[row] for h in self._hashes])
            for step_ids, step_values in zip(ids[row], values[row]):
                rounded = [round(v, LOGPROB_DECIMALS) for v in step_values]
                steps.top.append(tuple(zip(step_ids, rounded)))
                margin = step_values[0] - step_values[1] if len(step_values) > 1 else float("inf")
                steps.margins.append(round(margin, LOGPROB_DECIMALS))
            rows.append(steps)
        return rows
