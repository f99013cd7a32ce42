"""One-row matrix products on every CPU thread, with the bits MKL's reproducible branch gives.

A decode step at batch 1 multiplies one row by each weight matrix. Under ``MKL_CBWR=COMPATIBLE``
MKL runs such a one-row GEMM on one thread (measured on Intel and AMD; natively too on AMD), so a
2-core machine decodes on one core. Split the weight's output features into ``n`` equal blocks and
compute them as one ``torch.bmm`` of ``n`` matrices: ATen runs the blocks of a batch on its
threads, and every output is the same dot product over the same inputs as before, so the bits do
not change. Measured with torch 2.13 (MKL 2024.2) under portable numerics, at 1, 2 and 4 threads,
natively (AMD EPYC) and under ``qemu-x86_64 -cpu`` Haswell, Nehalem and EPYC: the split equals
``F.linear`` bit for bit, with and without a bias, for SmolLM2-135M's shapes and smaller ones;
SmolLM2's one-row products per decode step took 32-40 ms as ``F.linear`` and 23 ms split in two
(2-core AMD EPYC).

Rows > 1 (prefill, a batch of several prompts) are left to ``F.linear``: MKL already spreads them
over its threads, and a split there gained nothing measurable. The split applies only where the
reproducible branch is in force (see ``numerics.py``): that is where its bits were proven across
CPUs, and native goldens keep the kernels they were recorded with.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# Below about a megabyte of weights a bmm's dispatch costs more than the second thread saves
# (SmolLM2's 192x576 key projection: 0.017 ms as F.linear, 0.024 ms split).
MIN_WEIGHT_ELEMENTS = 1 << 18


def blocks_for(weight: Any, threads: int) -> int:
    """How many blocks to split ``weight``'s output features into: 0 where the split does not apply
    (one thread, a weight that is not a contiguous float32 matrix on the CPU, too small, or not
    divisible)."""
    import torch

    out_features = weight.shape[0]
    if (threads < 2 or weight.dtype != torch.float32 or weight.device.type != "cpu"
            or weight.dim() != 2 or not weight.is_contiguous() or weight.numel() < MIN_WEIGHT_ELEMENTS
            or out_features % threads):
        return 0
    return threads


def split_linear(x: Any, weight: Any, bias: Any, blocks: int) -> Any:
    """``F.linear(x, weight, bias)`` for a single row ``x``, its output features computed as
    ``blocks`` matrices of one ``torch.bmm``. Same bits (see the module's note)."""
    import torch

    out_features, in_features = weight.shape
    stacked = weight.view(blocks, out_features // blocks, in_features).transpose(1, 2)
    row = x.reshape(1, 1, in_features).expand(blocks, 1, in_features)
    y = torch.bmm(row, stacked).reshape(*x.shape[:-1], out_features)
    return y if bias is None else y + bias


@contextmanager
def one_row_products_split(model: Any) -> Iterator[int]:
    """Within the block, the model's float32 ``nn.Linear`` layers compute single rows with
    :func:`split_linear` over torch's threads; their own ``forward`` is put back afterwards.
    Yields how many layers were split."""
    import torch

    threads = torch.get_num_threads()
    split = []
    for module in model.modules():
        if type(module) is torch.nn.Linear and "forward" not in vars(module):
            blocks = blocks_for(module.weight, threads)
            if blocks:
                module.forward = _one_row_forward(module, blocks)  # type: ignore[method-assign]
                split.append(module)
    try:
        yield len(split)
    finally:
        for module in split:
            del module.forward


def _one_row_forward(module: Any, blocks: int) -> Any:
    import torch

    linear = torch.nn.functional.linear

    def forward(x: Any) -> Any:
        if x.numel() != x.shape[-1] or x.dtype != torch.float32:
            return linear(x, module.weight, module.bias)
        return split_linear(x, module.weight, module.bias, blocks)

    return forward
