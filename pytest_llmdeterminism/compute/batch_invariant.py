"""Kernels under which a prompt's logits do not depend on its batch: the same bits alone or batched.

Under pinned numerics a row's bits already do not depend on *what* its companions hold at a fixed
batch shape; they still depend on the *shape*. Two things vary with it, measured with torch 2.13 and
transformers 5.25 on the tiny model and SmolLM2-135M (portable numerics, 2-core Intel Xeon):

- **Linears.** oneDNN's AVX2 GEMM gives a row the same bits at every number of rows from 2 to 300
  (SmolLM2's shapes and the tiny model's, 1 and 2 threads), but other bits at one row; MKL's
  reproducible branch, which portable numerics use for small products, gives other bits from 8
  rows on. So the prefill's linears (the whole prompt, every position a row) run on oneDNN, a lone
  row as two identical rows. A decode step has one row per prompt, and there two identical rows
  on oneDNN cost 2-3x one row (SmolLM2's gate projection: 144 vs 47 us; a lone decode-heavy call
  1.39x today's). So in decode each row is its own one-row product on MKL's reproducible branch:
  one row through :func:`~pytest_llmdeterminism.compute.linears.split_linear` (its output features
  over the threads, the bits of ``F.linear`` at one row), several as one ``torch.bmm`` whose items
  are the rows, each over the whole weight (the weight expanded, not copied: the same one-row
  kernel on the same layout). The bits do not depend on the rows beside it by construction, and
  were measured equal to ``F.linear`` at one row for 1 to 64 rows, 1, 2 and 4 threads. The output
  embedding (the vocabulary matrix, 113 MB for SmolLM2) stays on oneDNN in decode too: row by row
  it would be read once per row, and a batch of 8 would lose most of what batching saves (0.53x
  8 lone calls instead of 0.44x, measured). Which phase runs is read from the forward's input: the
  block's first forward is the prefill, later ones with one position per row are decode steps
  (without a cache every forward holds every position, and is a prefill).
- **Attention.** Left padding moves a prompt's keys to other positions of the kernel's vectors and
  blocks, so its sums run in another order. :func:`rowwise_attention` runs each row's attention
  over its own keys only, as that prompt run alone and unpadded would: the same ``scaled_dot_product
  _attention`` call on the same tensors.

Norms, rotary embeddings, activations and the residual stream are per row already. With both
(:func:`batch_invariant`), the same prompts gave the same token ids and logit hashes at ``1x32``
(alone, unpadded), ``4x32``, ``2x48`` and ``8x64``, at 1, 2 and 4 threads, for the tiny model and
SmolLM2 (``tests/test_batch_invariant.py``); without them every shape gave other hashes.

These are not the default portable kernels (one row and small products take other kernels there,
faster on some shapes), so they are a setting, ``llm_batch_invariant = true``: a golden computed with
them records ``batch_invariant`` (:data:`GENERATION`) in its fingerprint, and where the golden and the
run both carry the same value the batch shape is informational (``compare.input_changes``). Goldens
recorded without them keep their kernels and their shape.

**Compatible numerics** (CPUs without AVX2) cannot use oneDNN, whose kernels are not capped there, so
their bits would not travel between CPUs; and MKL's generic path gives a row the same bits at 2 to 4
rows only. So there the prefill runs in tiles (:func:`tiled_linear`): the rows padded to a multiple
of :data:`TILE_ROWS` with copies of the last row, every tile the same ``TILE_ROWS``-row MKL product,
an item of one ``torch.bmm`` over the weight expanded. A row's bits then depend on its tile's size
alone, which is fixed: measured equal for 1 to 264 rows, 1, 2 and 4 threads, SmolLM2's shapes. 32
rows costs 1.4x ``F.linear`` on a 264-row prefill (4 rows: 3x; 8: 2x; 64: 1.5x). Decode steps run
row by row as under portable numerics, and so does the output embedding (no oneDNN there).

**arm64** (torch's wheels run float32 linears on OpenBLAS, pinned to its ARMV8 kernels) takes the
compatible construction: tiles for the prefill, rows for decode and the output embedding. Measured
under ``qemu-aarch64`` (neoverse-n1 and cortex-a57, 1 and 2 threads, SmolLM2's shapes): a row's bits
the same alone and among 1 to 63 companions, at every thread count (``tests/test_cross_arch.py``).
Its goldens record :data:`GENERATION_OPENBLAS`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pytest_llmdeterminism.compute import linears
from pytest_llmdeterminism.compute.chain import ChainKernel
from pytest_llmdeterminism.compute.linears import LinearKernels

# The name under which transformers' attention and mask registries know the row-wise attention.
ATTENTION = "pytest_llmdeterminism_rowwise"
# What a golden's fingerprint records as ``batch_invariant`` when these kernels computed it. Another
# value (kernels that give other bits) is another environment: change it with the kernels.
GENERATION = {LinearKernels.BATCH_INVARIANT: "cpu-onednn-avx2-rowwise-2",
              LinearKernels.BATCH_INVARIANT_TILES: "cpu-mkl-compatible-tiles32-rowwise-1"}
# The tiles and rows on OpenBLAS (arm64 under pinned numerics): the same construction, other bits.
GENERATION_OPENBLAS = "cpu-openblas-armv8-tiles32-rowwise-1"


def generation(kernels: LinearKernels | None, blas: str | None) -> str | None:
    """What a golden computed on ``kernels`` with torch's BLAS ``blas`` records as ``batch_invariant``;
    None for kernels that are not batch-invariant."""
    if kernels is LinearKernels.BATCH_INVARIANT_TILES and blas == "openblas":
        return GENERATION_OPENBLAS
    return GENERATION.get(kernels) if kernels is not None else None


# Under compatible numerics the prefill's rows go through MKL in tiles of this many rows.
TILE_ROWS = 32


def invariant_linear(x: Any, weight: Any, bias: Any, chain: ChainKernel | None = None) -> Any:
    """``F.linear`` on oneDNN with at least two rows, so that a row's bits do not depend on how many
    rows the call holds (a lone row is computed as two identical rows): the prefill's kernel. With
    ``chain``, on the plugin's kernel where it gives oneDNN's bits (``chain.py``)."""
    def onednn(x: Any, weight: Any, bias: Any) -> Any:
        if chain is None:
            return linears.onednn_linear(x, weight, bias)
        return chain.linear(x, weight, bias, linears.onednn_linear)

    rows = x.numel() // x.shape[-1]
    if rows != 1:
        return onednn(x, weight, bias)
    pair = x.reshape(1, x.shape[-1]).expand(2, x.shape[-1])
    return onednn(pair, weight, bias)[:1].reshape(*x.shape[:-1], weight.shape[0])


def rows_linear(x: Any, weight: Any, bias: Any, blocks: int = 0) -> Any:
    """``F.linear`` with every row its own one-row product on MKL's reproducible branch, whatever the
    number of rows: the decode steps' kernel. One row is split into ``blocks`` blocks of output
    features over the threads (0: not split, see ``linears.blocks_for``); several rows are the items
    of one ``torch.bmm``, each over the whole weight."""
    import torch

    in_features, out_features = x.shape[-1], weight.shape[0]
    rows = x.numel() // in_features
    if rows == 1:
        if blocks:
            return linears.split_linear(x, weight, bias, blocks)
        return torch.nn.functional.linear(x, weight, bias)
    products = torch.bmm(x.reshape(rows, 1, in_features), weight.t().expand(rows, in_features, out_features))
    y = products.reshape(*x.shape[:-1], out_features)
    return y if bias is None else y + bias


def tiled_linear(x: Any, weight: Any, bias: Any) -> Any:
    """``F.linear`` with the rows in tiles of :data:`TILE_ROWS` (the last one filled with copies of the
    last row), each tile an item of one ``torch.bmm`` on MKL: every row is computed by the same
    ``TILE_ROWS``-row product, whatever the number of rows: the prefill's kernel under compatible
    numerics."""
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


def rowwise_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                      dropout: float = 0.0, scaling: float | None = None, **kwargs: Any) -> tuple[Any, None]:
    """transformers' attention interface: each row attends over its own keys, as if it ran alone.

    With left padding a row's real keys are the last ones; the first key the mask lets the last query
    see is where they start. The row's real queries (the last ones) attend to them causally, with the
    same call a lone, unpadded prompt makes; padded queries get zeros (nothing reads them)."""
    import torch
    from transformers.integrations.sdpa_attention import repeat_kv

    unsupported = sorted(name for name in ("sliding_window", "softcap", "s_aux")
                         if kwargs.get(name) is not None)
    if unsupported or dropout:
        raise NotImplementedError(f"batch-invariant attention does not handle {unsupported or ['dropout']}")
    batch, heads, queries, _ = query.shape
    keys = key.shape[2]
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    output = query.new_zeros(batch, heads, queries, value.shape[-1])
    for row in range(batch):
        first = 0 if attention_mask is None else _first_key(attention_mask[row, 0, -1])
        first_query = max(0, first - (keys - queries))
        q = query[row:row + 1, :, first_query:]
        k, v = key[row:row + 1, :, first:], value[row:row + 1, :, first:]
        if 1 < q.shape[2] != k.shape[2]:
            # a prefill continuing a cache: causal alignment to the bottom right, spelled out
            offset = k.shape[2] - q.shape[2]
            allowed = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril(offset)
            result = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed,
                                                                      scale=scaling)
        else:
            result = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scaling,
                                                                      is_causal=q.shape[2] > 1)
        output[row:row + 1, :, first_query:] = result
    return output.transpose(1, 2).contiguous(), None


def _first_key(allowed: Any) -> int:
    """The first key position a mask row lets through (bool: True; additive float: 0)."""
    import torch

    visible = allowed if allowed.dtype == torch.bool else allowed == 0
    return int(torch.nonzero(visible)[0])


def register() -> str:
    """Make :func:`rowwise_attention` known to transformers (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, rowwise_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # the boolean masks rowwise_attention reads
    return ATTENTION


@contextmanager
def batch_invariant(model: Any, *, tiles: bool = False, chain: ChainKernel | None = None) -> Iterator[int]:
    """Within the block, ``model`` computes each prompt's logits independently of its batch: float32
    linears on the CPU through :func:`invariant_linear` (``tiles``, under compatible numerics:
    :func:`tiled_linear`) and in decode steps :func:`rows_linear`, attention through
    :func:`rowwise_attention`. Everything is put back afterwards. Yields how many linear layers were
    routed. ``chain``: oneDNN's products on the plugin's kernel, the same bits (``chain.py``)."""
    import torch

    name = register()
    configs = {id(config): config for config in _configs(model)}
    attention = {key: config._attn_implementation for key, config in configs.items()}
    layers = [module for module in model.modules()
              if type(module) is torch.nn.Linear and "forward" not in vars(module)
              and module.weight.dtype == torch.float32 and module.weight.device.type == "cpu"]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    phase = _Phase()
    hook = model.register_forward_pre_hook(phase.see, with_kwargs=True)
    threads = torch.get_num_threads()
    try:
        for config in configs.values():
            config._attn_implementation = name
        for module in layers:
            blocks = linears.blocks_for(module.weight, threads)
            invariant: Callable[[Any, Any, Any], Any] = functools.partial(invariant_linear, chain=chain)
            kernels: tuple[Callable[[Any, Any, Any], Any], Callable[[Any, Any, Any], Any]]
            if module is head:  # see the module's note: row by row under compatible, else oneDNN
                rows = functools.partial(rows_linear, blocks=blocks)
                kernels = (rows, rows) if tiles else (invariant, invariant)
            else:
                kernels = (tiled_linear if tiles else invariant,
                           functools.partial(rows_linear, blocks=blocks))
            module.forward = _forward(module, phase, *kernels)  # type: ignore[method-assign]
        yield len(layers)
    finally:
        hook.remove()
        for key, config in configs.items():
            config._attn_implementation = attention[key]
        for module in layers:
            vars(module).pop("forward", None)


class _Phase:
    """Whether the model's forward now running is a decode step: not the block's first forward, and
    one position per row (a model's forward pre-hook)."""

    def __init__(self) -> None:
        self.forwards = 0
        self.decode = False

    def see(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.forwards += 1
        inputs = kwargs.get("input_ids", args[0] if args else None)
        if inputs is None:
            inputs = kwargs.get("inputs_embeds")
        self.decode = self.forwards > 1 and inputs is not None and inputs.shape[1] == 1


def _configs(model: Any) -> list[Any]:
    """The model's configuration objects its attention layers read the implementation from."""
    found = [model.config]
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            found.append(config)
    return found


Kernel = Callable[[Any, Any, Any], Any]


def _forward(module: Any, phase: _Phase, prefill: Kernel, decode: Kernel) -> Any:
    """``module``'s forward in the block: ``decode`` in a decode step, ``prefill`` otherwise."""
    import torch

    linear = torch.nn.functional.linear

    def forward(x: Any) -> Any:
        if x.dtype != torch.float32:
            return linear(x, module.weight, module.bias)
        return (decode if phase.decode else prefill)(x, module.weight, module.bias)

    return forward
