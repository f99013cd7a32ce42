"""One unpadded row's logits computed in pieces over a transformers model's own KV cache (the audit's
``chunked-prefill`` and ``prefix-reuse`` rows, ``model/decode_prefill.py``), on the kernels generation
runs on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.compute.determinism import deterministic_state

if TYPE_CHECKING:
    import torch

    from pytest_llmdeterminism.compute.kernels import Kernels


def cache_argument(model: Any) -> str:
    """The keyword a model's forward takes its KV cache by: ``cache`` from transformers 5.x on, before
    it ``past_key_values`` (an unknown keyword is swallowed there: every piece would start over)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def phase_logits(model: Any, kernels: Kernels, device: str, ids: list[int], pieces: list[int], seed: int, *,
                 reuse_from: list[int] | None = None) -> torch.Tensor:
    """``ids`` forwarded in consecutive pieces of ``pieces``' lengths over one KV cache: every
    position's float32 logits. ``reuse_from``: another sequence that shares ``ids``' first piece, whose
    prefill builds the cache (cut back to that piece) the other pieces continue, as a prefix cache
    reuses a prefix computed inside another request; the first piece's logits are that prefill's."""
    import torch
    from transformers import DynamicCache

    if sum(pieces) != len(ids) or min(pieces) < 1:
        raise ValueError(f"pieces {pieces} do not cover the {len(ids)} positions")
    if reuse_from is not None and reuse_from[:pieces[0]] != ids[:pieces[0]]:
        raise ValueError("reuse_from does not share the first piece")
    if model.training:
        model.eval()
    name, cache, found, start = cache_argument(model), DynamicCache(), [], 0

    def forward(piece: list[int]) -> torch.Tensor:
        inputs = torch.tensor([piece], device=device)
        logits: torch.Tensor = model(input_ids=inputs, use_cache=True, **{name: cache}).logits
        return logits[0].float().cpu()

    with deterministic_state(seed), torch.inference_mode(), kernels.routed(model):
        if reuse_from is not None:
            found.append(forward(reuse_from)[:pieces[0]])
            if len(reuse_from) > pieces[0]:  # a negative count removes that many (transformers 4 and 5)
                cache.crop(pieces[0] - len(reuse_from))
            start, pieces = pieces[0], pieces[1:]
        for length in pieces:
            found.append(forward(ids[start:start + length]))
            start += length
    return torch.cat(found)
