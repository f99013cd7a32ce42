"""The tensor functions the plugin's kernels are made of: pure functions of tensors, no patching.

``F.linear``'s replacements (oneDNN capped at AVX2, one-row products split over the threads, rows each
their own one-row product on MKL, rows in fixed tiles), the fixed-order kernel's call in oneDNN's place,
and attention row by row, each position computed the same way in every phase. Each gives stated bits;
``kernels.py`` decides which runs where, and ``docs/design/kernels.md`` holds the measurements behind
each.
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
                      sliding_window: int | None = None, softcap: float | None = None,
                      s_aux: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: each row attends over its own keys, as if it ran alone, and
    each position as :func:`canonical_attention` computes it, whatever the phase; a layer's sliding
    window, logit soft-capping and attention sinks (``s_aux``) included.

    With left padding a row's real keys are the last ones; the first key the mask lets the last query
    see is where they start (position 0). Under a sliding window the mask shows the window, and the
    layer's cache may hold its last keys only: there a row's key positions come from its
    ``position_ids`` (the last query's position is the last key's). The row's real queries (the last
    ones) attend to them; padded queries get zeros (nothing reads them)."""
    if dropout:
        raise NotImplementedError("batch-invariant attention does not handle dropout")
    batch, heads, queries, _ = query.shape
    keys = key.shape[2]
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    positions = kwargs.get("position_ids") if sliding_window is not None else None
    if sliding_window is not None and (positions is None or positions.dim() != 2
                                       or positions.shape[0] != batch):
        raise NotImplementedError("batch-invariant attention under a sliding window needs one row of "
                                  "position_ids per row")
    if batch == 1 and attention_mask is None and positions is None:  # a lone, unpadded row, without a copy
        alone = canonical_attention(query[0], key[0], value[0], scaling, window=sliding_window,
                                    softcap=softcap, sinks=s_aux)
        return alone.transpose(0, 1).unsqueeze(0).contiguous(), None
    output = query.new_zeros(batch, heads, queries, value.shape[-1])
    for row in range(batch):
        if positions is not None:  # key 0's position: below 0 where the row is padded, above where cut
            start = int(positions[row, -1]) - keys + 1
            first, start = max(0, -start), max(0, start)
        else:
            first = 0 if attention_mask is None else _first_key(attention_mask[row, 0, -1])
            start = 0
        first_query = max(0, first - (keys - queries))
        output[row, :, first_query:] = canonical_attention(
            query[row, :, first_query:], key[row, :, first:], value[row, :, first:], scaling, start=start,
            window=sliding_window, softcap=softcap, sinks=s_aux)
    return output.transpose(1, 2).contiguous(), None


# Position-canonical attention: keys in blocks of KEY_BLOCK positions and queries in tiles of QUERY_TILE
# positions, both aligned to position 0, every product one fixed-shape item of a batched matmul.
KEY_BLOCK = 32
QUERY_TILE = 4


def canonical_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float, *,
                        start: int = 0, window: int | None = None, softcap: float | None = None,
                        sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One row's causal attention, each query position's bits a function of its own query and the keys and
    values it sees alone: not of how many positions the call holds, nor of the phase (a one-row
    decode step, a prefill, a chunk of one, a prefill continuing a cache) nor of the threads.
    ``query`` (heads, queries, dim) holds the last positions of ``key`` (key heads, keys, dim;
    grouped-query attention where fewer) and ``value`` (key heads, keys, width: another head size
    under multi-head latent attention); returns (heads, queries, width). ``start``: key 0's position
    (above 0 where a sliding window's cache dropped the keys before it); ``window``: a query sees the
    keys less than ``window`` positions back (transformers' ``sliding_window``); ``softcap``: scores
    become ``softcap * tanh(score / softcap)``; ``sinks`` (heads,): each head's extra logit in the
    softmax's sum (gpt-oss).

    A position ``p`` is row ``p % QUERY_TILE`` of its query tile and a key ``j`` column
    ``j % KEY_BLOCK`` of its key block, both aligned to position 0, so every product a position takes
    part in has the same shape and the same place in it whatever else runs: scores are
    (tile x dim) @ (dim x block) products, the probabilities times the values and a column of ones
    (the softmax's sum) are (tile x block) @ (block x dim + 1) products, and the blocks' partial sums
    are added in block order by a sequential scan over the blocks up to the tile's own. A key a
    position does not see (past it, out of its window, before ``start``) has weight exactly 0, so a
    block of such keys adds exact zeros: a cache that dropped them gives the bits of one that holds
    them. The row's maximum is exact in any order."""
    import torch

    heads, queries, dim = query.shape
    width = value.shape[-1]  # the values' head size (multi-head latent attention: not the keys')
    # index i holds position start - lead + i: the first block starts at a multiple of KEY_BLOCK (the
    # blocks' alignment to position 0 holds), its `lead` slots before key 0 empty and hidden
    lead = start % KEY_BLOCK
    total = lead + key.shape[1]
    blocks, key_blocks, value_blocks = _key_value_blocks(key, value, heads, lead)
    first = total - queries  # the first query's index
    first_tile, tiles = first // QUERY_TILE, -(-total // QUERY_TILE) - first // QUERY_TILE
    offset = first - first_tile * QUERY_TILE
    tiled = query.new_zeros(tiles * QUERY_TILE, heads, dim)
    tiled[offset:offset + queries] = query.transpose(0, 1) * scaling
    tiled = tiled.view(tiles, QUERY_TILE, heads, dim).transpose(1, 2)  # (tiles, heads, QUERY_TILE, dim)
    # which keys of its block a tile's rows do not see, by the tile's place in the block
    row_positions = torch.arange(KEY_BLOCK).view(KEY_BLOCK // QUERY_TILE, QUERY_TILE, 1)
    hidden = torch.arange(KEY_BLOCK).view(1, 1, KEY_BLOCK) > row_positions
    columns = torch.arange(blocks * KEY_BLOCK).view(blocks, 1, 1, KEY_BLOCK)
    sink = None if sinks is None else \
        sinks.to(query.dtype).view(1, heads, 1, 1).expand(1, heads, QUERY_TILE, 1)
    out = query.new_empty(tiles, heads, QUERY_TILE, width)
    for tile in range(tiles):
        at = (first_tile + tile) * QUERY_TILE  # the tile's first index
        seen = at // KEY_BLOCK + 1  # the blocks up to the tile's positions (a tile lies in one block)
        rows = tiled[tile].expand(seen, heads, QUERY_TILE, dim).reshape(seen * heads, QUERY_TILE, dim)
        rows = rows.contiguous()
        scores = torch.bmm(rows, key_blocks[:seen * heads]).view(seen, heads, QUERY_TILE, KEY_BLOCK)
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        scores[-1].masked_fill_(hidden[at % KEY_BLOCK // QUERY_TILE], float("-inf"))
        if lead:
            scores[0, :, :, :lead] = float("-inf")
        if window is not None:  # index k is out of the window of the row at index q where k <= q - window
            reach = torch.arange(at, at + QUERY_TILE).view(1, 1, QUERY_TILE, 1) - window
            scores.masked_fill_(columns[:seen] <= reach, float("-inf"))
        peak = scores.amax(dim=(0, 3), keepdim=True)
        if sink is not None:
            peak = torch.maximum(peak, sink)
        weights = torch.exp(scores - peak)
        partial = torch.bmm(weights.view(seen * heads, QUERY_TILE, KEY_BLOCK), value_blocks[:seen * heads])
        sums = partial.view(seen, heads, QUERY_TILE, width + 1).cumsum(dim=0)[-1]  # in block order (float64)
        total_weight = sums[..., width:] if sink is None else sums[..., width:] + torch.exp(sink - peak)[0]
        torch.div(sums[..., :width], total_weight, out=out[tile])
    found = out.transpose(1, 2).reshape(tiles * QUERY_TILE, heads, width)
    return found[offset:offset + queries].transpose(0, 1)


def _key_value_blocks(key: torch.Tensor, value: torch.Tensor, heads: int,
                      lead: int) -> tuple[int, torch.Tensor, torch.Tensor]:
    """The keys and values in blocks of KEY_BLOCK positions after ``lead`` empty slots, block-major and
    contiguous (a product's bits depend on its operands' layout, and MKL takes another path for a
    transposed key block): how many blocks, the keys as (blocks x heads, dim, KEY_BLOCK) and the
    values with a column of ones as (blocks x heads, KEY_BLOCK, width + 1), each key head repeated for
    its group of query heads; the first blocks' products read the first rows."""
    key_heads, keys, dim = key.shape
    width, group, total = value.shape[-1], heads // key_heads, lead + keys
    blocks = -(-total // KEY_BLOCK)
    padded_keys = key.new_zeros(key_heads, blocks * KEY_BLOCK, dim)
    padded_keys[:, lead:total] = key
    padded_values = value.new_zeros(key_heads, blocks * KEY_BLOCK, width + 1)
    padded_values[:, lead:total, :width], padded_values[:, lead:total, width] = value, 1.0
    key_blocks = padded_keys.view(key_heads, blocks, 1, KEY_BLOCK, dim).transpose(0, 1)
    key_blocks = key_blocks.expand(blocks, key_heads, group, KEY_BLOCK, dim).transpose(3, 4)
    value_blocks = padded_values.view(key_heads, blocks, 1, KEY_BLOCK, width + 1).transpose(0, 1)
    value_blocks = value_blocks.expand(blocks, key_heads, group, KEY_BLOCK, width + 1)
    return (blocks, key_blocks.reshape(blocks * heads, dim, KEY_BLOCK).contiguous(),
            value_blocks.reshape(blocks * heads, KEY_BLOCK, width + 1).contiguous())


def _first_key(allowed: torch.Tensor) -> int:
    """The first key position a mask row lets through (bool: True; additive float: 0)."""
    import torch

    visible = allowed if allowed.dtype == torch.bool else allowed == 0
    return int(torch.nonzero(visible)[0])
