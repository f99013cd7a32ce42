"""How ``nn.Linear`` layers run under pinned CPU numerics: the bulk of a model's arithmetic.

**Portable (x86-64-v3): oneDNN's AVX2 GEMM.** Under ``MKL_CBWR=COMPATIBLE`` MKL runs its generic
code path, about twice as slow as native on a prefill (SmolLM2-135M, 128 tokens), and MKL's own
AVX2 branch is not portable (it is ignored on AMD, see ``numerics.py``). oneDNN's instruction-set
cap is honoured on every vendor: with ``ONEDNN_MAX_CPU_ISA=AVX2`` a float32 linear through
``torch.ops.mkldnn._linear_pointwise`` gave the same bits natively on an AMD EPYC with AVX-512, and
under ``qemu-x86_64 -cpu`` Haswell, EPYC and Skylake-Client, at 1 and 2 threads, for SmolLM2's
shapes, 1 to 300 rows; a row's bits did not depend on its companions at a fixed number of rows, and
identical rows gave identical bits. Products below ``ONEDNN_MIN_PRODUCT`` multiply-adds stay on MKL's
reproducible branch, which is faster there and portable too. It needs AVX2 and FMA: on an older CPU
oneDNN falls back to SSE4.1 and other bits, so portable numerics refuse such a CPU (``numerics.check``).

**One row: split over the threads.** A decode step at batch 1 multiplies one row by each weight
matrix. Under ``MKL_CBWR=COMPATIBLE`` MKL runs such a one-row GEMM on one thread (measured on Intel
and AMD; natively too on AMD), so a 2-core machine decodes on one core. Split the weight's output
features into ``n`` equal blocks and compute them as one ``torch.bmm`` of ``n`` matrices: ATen runs
the blocks of a batch on its threads, and every output is the same dot product over the same inputs
as before, so the bits do not change. Measured with torch 2.13 (MKL 2024.2) under the compatible
pin, at 1, 2 and 4 threads, natively (AMD EPYC) and under ``qemu-x86_64 -cpu`` Haswell, Nehalem and
EPYC: the split equals ``F.linear`` bit for bit, with and without a bias, for SmolLM2-135M's shapes
and smaller ones; SmolLM2's one-row products per decode step took 32-40 ms as ``F.linear`` and 23 ms
split in two (2-core AMD EPYC). Compatible numerics split one-row products and leave the rest to
``F.linear``; portable numerics split the one-row products that stay on MKL (below
``ONEDNN_MIN_PRODUCT``: SmolLM2's query and output projections at one row), which on an Intel Xeon with
AVX-512 (2 threads) took 154 us as ``F.linear`` on MKL's reproducible branch and 55 us split in two
(native MKL: 38 us), the same bits (``benchmarks/linear_kernels.py``).

oneDNN's one-row kernel runs some shapes on one thread (SmolLM2's down projection, 576x1536: 373 us
at one thread, 344 at two, on that Intel Xeon; native MKL 124 us at two). Its output features split
in halves give the same bits, but two oneDNN calls on two Python threads, or ``torch.jit.fork``, were
slower than one call (the threads oversubscribe the cores), so that product is left as it is.

Where a C compiler is at hand, the products sent to oneDNN run on the plugin's own kernel instead,
which computes oneDNN's exact order and is checked against it shape by shape (``chain.py``): the
same bits, at about native MKL's speed on a decode step on an Intel Xeon with AVX-512.

Native numerics keep ``F.linear``: native goldens keep the kernels they were recorded with.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from pytest_llmdeterminism.compute import numerics
from pytest_llmdeterminism.compute.chain import ChainKernel


class LinearKernels(str, enum.Enum):
    """Where a float32 ``nn.Linear`` on the CPU runs (a str enum: it is shown in reports)."""

    LINEAR = "F.linear"  # torch's own dispatch: native numerics, GPUs, other dtypes
    SPLIT_ONE_ROW = "one-row split"  # compatible: MKL's generic path, one-row products over the threads
    ONEDNN_AVX2 = "oneDNN AVX2"  # portable on x86-64: oneDNN capped at AVX2; smaller one-row products split
    # llm_batch_invariant (batch_invariant.py, which the transformers engine runs instead of routed()):
    # under portable numerics the prefill on oneDNN AVX2 with at least two rows, under compatible in
    # tiles of rows on MKL's generic path; decode steps row by row; attention row by row
    BATCH_INVARIANT = "batch-invariant"
    BATCH_INVARIANT_TILES = "batch-invariant, MKL tiles"

    @property
    def batch_invariant(self) -> bool:
        return self in (LinearKernels.BATCH_INVARIANT, LinearKernels.BATCH_INVARIANT_TILES)


def kernels_for(mode: str, in_force: Mapping[str, Any]) -> LinearKernels:
    """The kernels a model loaded under CPU numerics ``mode`` runs, given the numerics in force."""
    if in_force.get("mkl_cbwr") != numerics.MKL_REPRODUCIBLE_BRANCH:
        return LinearKernels.LINEAR  # native, or a torch without MKL (arm64: OpenBLAS's kernels)
    return LinearKernels.ONEDNN_AVX2 if mode == numerics.PORTABLE else LinearKernels.SPLIT_ONE_ROW


def onednn_linear(x: Any, weight: Any, bias: Any) -> Any:
    """``F.linear`` through oneDNN's matmul (``ONEDNN_MAX_CPU_ISA`` decides its kernels)."""
    import torch

    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


# oneDNN costs ~30 us a call before it multiplies anything: a product of fewer multiply-adds (rows x
# in x out features) runs faster on MKL's reproducible branch, whose bits travel too. Measured on a
# 2-core AMD EPYC, 2 threads: 576x576 at one row 48 us on MKL, 64 us on oneDNN; 1024x512 at one row
# 76 vs 66 us; 192x576 at 16 rows 132 vs 92 us; 576x576 at 128 rows 2100 vs 748 us. The choice
# depends on the shape alone, so it is the same on every CPU and for every row of a batch.
ONEDNN_MIN_PRODUCT = 1 << 19

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
def routed(model: Any, kernels: LinearKernels, chain: ChainKernel | None = None) -> Iterator[int]:
    """Within the block, the model's float32 ``nn.Linear`` layers on the CPU run on ``kernels``; their
    own ``forward`` is put back afterwards. Yields how many layers were routed. ``chain``: the products
    oneDNN would compute at two or more rows run on the plugin's kernel with its bits (``chain.py``)."""
    import torch

    threads = torch.get_num_threads()
    routed = []
    if kernels is not LinearKernels.LINEAR:
        for module in model.modules():
            if (type(module) is torch.nn.Linear and "forward" not in vars(module)
                    and module.weight.dtype == torch.float32 and module.weight.device.type == "cpu"):
                module.forward = _forward(module, kernels, blocks_for(module.weight, threads), chain)  # type: ignore[method-assign]
                routed.append(module)
    try:
        yield len(routed)
    finally:
        for module in routed:
            del module.forward


def _forward(module: Any, kernels: LinearKernels, blocks: int, chain: ChainKernel | None) -> Any:
    import torch

    linear = torch.nn.functional.linear
    out_features = module.weight.shape[0]

    def forward(x: Any) -> Any:
        if x.dtype != torch.float32:
            return linear(x, module.weight, module.bias)
        if kernels is LinearKernels.ONEDNN_AVX2 and x.numel() * out_features >= ONEDNN_MIN_PRODUCT:
            if chain is not None:
                return chain.linear(x, module.weight, module.bias, onednn_linear)
            return onednn_linear(x, module.weight, module.bias)
        if blocks and x.numel() == x.shape[-1]:  # one row on MKL's reproducible branch
            return split_linear(x, module.weight, module.bias, blocks)
        return linear(x, module.weight, module.bias)

    return forward
