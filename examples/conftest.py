"""Negative control: a planted defect the gate must catch. Try it first:

    LLMDET_PLANT_DEFECT=1 python -m pytest examples      # must FAIL with REGRESSION / LOGIT_DRIFT

It perturbs the loaded model's weights in memory, as a bad upgrade or a serving bug would. If this
run passes, the suite is not protecting you.
"""

import os

import pytest


@pytest.fixture(autouse=True)
def _planted_defect(request):
    if os.environ.get("LLMDET_PLANT_DEFECT") != "1" or "llm_model" not in request.fixturenames:
        return
    import torch

    model = request.getfixturevalue("llm_model").model
    if getattr(model, "_planted_defect", False):
        return
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() > 1:
                weight.add_(0.5 * weight.std() * torch.randn(weight.shape, generator=generator))
    model._planted_defect = True
