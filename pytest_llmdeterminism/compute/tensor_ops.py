"""The tensor functions the plugin's kernels are made of: pure functions of tensors, no patching.

``F.linear``'s replacements (oneDNN capped at AVX2, one-row products split over the threads, rows
each their own one-row product on MKL or oneDNN, rows in fixed tiles), the fixed-order kernel's call
in oneDNN's place, and attention row by row. Each gives stated bits; ``kernels.py`` decides which
runs where, and ``docs/design/kernels.md`` holds the measurements behind each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from pytest_llmdeterminism.compute.fixed_order import FixedOrderKernel

# oneDNN costs ~30 us a call before it multiplies anything: a product of fewer multiply-adds (rows x
# in x out features) runs faster on MKL's reproducible branch, whose bits travel too. The choice
# depends on the shape alone, so it is the same on every CPU and for every row of a batch.
ONEDNN_MIN_PRODUCT = 1 << 19

# Below about a megabyte of weights a bmm's dispatch costs more than the second thread saves.
MIN_WEIGHT_ELEMENTS = 1 << 18

# Under compatible numerics (and on arm64) the prefill's rows go through the BLAS in tiles of this many.
TILE_ROWS = 32


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` through oneDNN's matmul (``ONEDNN_MAX_CPU_ISA`` decides its kernels)."""
    import torch

    result: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return result


def onednn_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   fixed_order: FixedOrderKernel | None) -> torch.Tensor:
    """oneDNN's product: on the fixed-order kernel where there is one (the same bits, checked), else
    on oneDNN itself."""
    if fixed_order is None:
        return onednn_linear(x, weight, bias)
    return fixed_order.linear(x, weight, bias, onednn_linear)


def blocks_for(weight: torch.Tensor, threads: int) -> int:
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


def split_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 blocks: int) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for a single row ``x``, its output features computed as
    ``blocks`` matrices of one ``torch.bmm``: every output the same dot product, the same bits."""
    import torch

    out_features, in_features = weight.shape
    stacked = weight.view(blocks, out_features // blocks, in_features).transpose(1, 2)
    row = x.reshape(1, 1, in_features).expand(blocks, 1, in_features)
    y = torch.bmm(row, stacked).reshape(*x.shape[:-1], out_features)
    return y if bias is None else y + bias


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     fixed_order: FixedOrderKernel | None = None) -> torch.Tensor:
    """``F.linear`` on oneDNN with at least two rows, so that a row's bits do not depend on how many
    rows the call holds (a lone row is computed as two identical rows): the batch-invariant prefill.
    With ``fixed_order``, on the fixed-order kernel where it gives oneDNN's bits."""
    rows = x.numel() // x.shape[-1]
    if rows != 1:
        return onednn_product(x, weight, bias, fixed_order)
    pair = x.reshape(1, x.shape[-1]).expand(2, x.shape[-1])
    return onednn_product(pair, weight, bias, fixed_order)[:1].reshape(*x.shape[:-1], weight.shape[0])


def rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                blocks: int = 0) -> torch.Tensor:
    """``F.linear`` with every row its own one-row product on MKL's reproducible branch, whatever the
    number of rows: the batch-invariant decode step. One row is split into ``blocks`` blocks of output
    features over the threads (0: not split, see :func:`blocks_for`); several rows are the items of
    one ``torch.bmm``, each over the whole weight."""
    import torch

    in_features, out_features = x.shape[-1], weight.shape[0]
    rows = x.numel() // in_features
    if rows == 1:
        if blocks:
            return split_linear(x, weight, bias, blocks)
        return torch.nn.functional.linear(x, weight, bias)
    products = torch.bmm(x.reshape(rows, 1, in_features), weight.t().expand(rows, in_features, out_features))
    y = products.reshape(*x.shape[:-1], out_features)
    return y if bias is None else y + bias


def onednn_rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       fixed_order: FixedOrderKernel | None = None) -> torch.Tensor:
    """``F.linear`` with every row its own one-row product on oneDNN (its one-row kernel, whose bits
    depend on the row and the weight alone; on the fixed-order kernel where it gives them), whatever
    the number of rows: the batch-invariant decode step's larger products. A lone row is the previous
    kernels' product, bit for bit."""
    import torch

    in_features, out_features = x.shape[-1], weight.shape[0]
    rows = x.numel() // in_features
    if rows == 1:
        return onednn_product(x, weight, bias, fixed_order)
    flat = x.reshape(rows, in_features)
    products = [onednn_product(flat[row:row + 1], weight, bias, fixed_order) for row in range(rows)]
    return torch.cat(products).reshape(*x.shape[:-1], out_features)


def tiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` with the rows in tiles of :data:`TILE_ROWS` (the last one filled with copies of the
    last row), each tile an item of one ``torch.bmm``: every row is computed by the same
    ``TILE_ROWS``-row product, whatever the number of rows: the batch-invariant prefill without oneDNN."""
    import torch

    in_features, out_features = x.shape[-1], weight.shape[0]
    rows = x.numel() // in_features
    flat = x.reshape(rows, in_features)
    if rows % TILE_ROWS:
        flat = torch.cat([flat, flat[-1:].expand(TILE_ROWS - rows % TILE_ROWS, in_features)])
    tiles = flat.shape[0] // TILE_ROWS
    products = torch.bmm(flat.view(tiles, TILE_ROWS, in_features),
                         weight.t().expand(tiles, in_features, out_features))
    y = products.reshape(tiles * TILE_ROWS, out_features)[:rows].reshape(*x.shape[:-1], out_features)
    return y if bias is None else y + bias


def rowwise_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: each row attends over its own keys, as if it ran alone.

    With left padding a row's real keys are the last ones; the first key the mask lets the last query
    see is where they start. The row's real queries (the last ones) attend to them causally, with the
    same call a lone, unpadded prompt makes; padded queries get zeros (nothing reads them)."""
    if dropout or kwargs.get("sliding_window") is not None or kwargs.get("softcap") is not None \
            or kwargs.get("s_aux") is not None:  # spelled out: this runs in every layer at every step
        unsupported = sorted(name for name in ("sliding_window", "softcap", "s_aux")
                             if kwargs.get(name) is not None)
        raise NotImplementedError(f"batch-invariant attention does not handle {unsupported or ['dropout']}")
    batch, heads, queries, _ = query.shape
    keys = key.shape[2]
    # Grouped-query attention: SDPA's own enable_gqa, as transformers' SDPA path calls it; the same bits
    # as repeating the key and value heads first (measured equal), at a fraction of the cost in decode.
    gqa = getattr(module, "num_key_value_groups", 1) > 1
    if batch == 1 and attention_mask is None:  # a lone, unpadded row: the loop's one call, without its copy
        return _row_attention(query, key, value, scaling, gqa).transpose(1, 2).contiguous(), None
    output = query.new_zeros(batch, heads, queries, value.shape[-1])
    for row in range(batch):
        first = 0 if attention_mask is None else _first_key(attention_mask[row, 0, -1])
        first_query = max(0, first - (keys - queries))
        q = query[row:row + 1, :, first_query:]
        k, v = key[row:row + 1, :, first:], value[row:row + 1, :, first:]
        output[row:row + 1, :, first_query:] = _row_attention(q, k, v, scaling, gqa)
    return output.transpose(1, 2).contiguous(), None


def _row_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float | None,
                   gqa: bool) -> torch.Tensor:
    """One row's queries over its own keys, the causal mask aligned to the bottom right (the last query
    sees every key), as a lone prompt's attention computes it."""
    import torch

    if 1 < q.shape[2] != k.shape[2]:
        # a prefill continuing a cache: causal alignment to the bottom right, spelled out
        offset = k.shape[2] - q.shape[2]
        allowed = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril(offset)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scaling,
                                                                enable_gqa=gqa)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scaling, is_causal=q.shape[2] > 1,
                                                            enable_gqa=gqa)


def _first_key(allowed: torch.Tensor) -> int:
    """The first key position a mask row lets through (bool: True; additive float: 0)."""
    import torch

    visible = allowed if allowed.dtype == torch.bool else allowed == 0
    return int(torch.nonzero(visible)[0])
