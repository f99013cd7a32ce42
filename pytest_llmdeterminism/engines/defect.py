"""The planted defect (``--llm-plant-defect``), the negative control of a suite: seeded noise added to a
loaded transformers model's weights, so that its goldens must fail."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DEFECT_SCALE = 0.5  # relative noise of the planted defect: changes tokens, as llm-golden perturb's 0.5 does
DEFECT_SEED = 0


def plant_defect(model: torch.nn.Module) -> int:
    """Add ``DEFECT_SCALE * std(w) * N(0, 1)`` to every weight matrix of a loaded model, in place, from
    one generator seeded with ``DEFECT_SEED`` (the same noise in every process): the negative
    control of ``--llm-plant-defect``. Returns how many tensors changed."""
    import torch

    generator = torch.Generator().manual_seed(DEFECT_SEED)
    changed = 0
    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() > 1:
                noise = torch.randn(weight.shape, generator=generator)  # on the CPU: the same on any device
                scaled = DEFECT_SCALE * weight.float().std().cpu() * noise
                weight.add_(scaled.to(weight.device, weight.dtype))
                changed += 1
    return changed
