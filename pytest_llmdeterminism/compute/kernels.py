"""The kernels a loaded model's float32 linears and attention run on, chosen once per load.

:meth:`Kernels.choose` decides from the numerics profile, dtype, device and settings, like a
transport fixed when a client is built; the engine then runs each generation inside
``with kernels.routed(model)``, the one patcher of ``nn.Linear`` and attention. The chosen kernels
name the generation a golden's fingerprint records (``batch_invariant``) and describe themselves
for the header. The tensor functions are in ``tensor_ops.py``; measurements in
``docs/design/kernels.md``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import platform
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.compute import experts, fixed_order, profiles, tensor_ops
from pytest_llmdeterminism.errors import ConfigurationError, pasteable

if TYPE_CHECKING:
    import torch

    from pytest_llmdeterminism.compute.fixed_order import FixedOrderKernel
    from pytest_llmdeterminism.compute.profiles import NumericsProfile

# A linear's kernel: F.linear's arguments (input, weight, bias), its result.
Kernel = Callable[["torch.Tensor", "torch.Tensor", "torch.Tensor | None"], "torch.Tensor"]

# The name under which transformers' attention and mask registries know the row-wise attention.
ATTENTION = "pytest_llmdeterminism_rowwise"


class Policy(str, enum.Enum):
    """Which kernel a float32 ``nn.Linear`` on the CPU gets (a str enum: the value describes it)."""

    LINEAR = "F.linear"  # torch's own dispatch: native numerics, GPUs, other dtypes
    SPLIT_ONE_ROW = "one-row split"  # compatible: MKL's generic path, one-row products over the threads
    ONEDNN_AVX2 = "oneDNN AVX2"  # portable on x86-64: oneDNN capped at AVX2; smaller one-row products split
    # Batch-invariant: oneDNN AVX2 with at least two rows in both phases (portable), or the prefill in
    # tiles of rows and decode steps row by row, each a one-row product (compatible, arm64); attention
    # row by row, each position computed the same way in every phase (position-canonical).
    BATCH_INVARIANT = "batch-invariant"
    BATCH_INVARIANT_TILES = "batch-invariant, MKL tiles"


# What a golden's fingerprint records as ``batch_invariant`` when these kernels computed it. Another
# value (kernels that give other bits) is another environment: change it with the kernels. "canonical":
# position-canonical attention (tensor_ops.canonical_attention).
GENERATIONS = {Policy.BATCH_INVARIANT: "cpu-onednn-avx2-canonical-4",
               Policy.BATCH_INVARIANT_TILES: "cpu-mkl-compatible-tiles32-canonical-2"}
# The tiles and rows on OpenBLAS (arm64 under pinned numerics): the same construction, other bits.
GENERATION_OPENBLAS = "cpu-openblas-armv8-tiles32-canonical-2"
# The generations whose decode steps compute a position as the prefill does, bit for bit (the same
# linears in both phases and position-canonical attention): the tiles keep one-row decode products.
PHASE_INVARIANT = frozenset({GENERATIONS[Policy.BATCH_INVARIANT]})
# The policies whose larger products are oneDNN's: the fixed-order kernel may compute them.
_ON_ONEDNN = (Policy.ONEDNN_AVX2, Policy.BATCH_INVARIANT)


@dataclasses.dataclass(frozen=True)
class Kernels:
    """The kernels one loaded model runs on: a :class:`Policy`, the fixed-order kernel for oneDNN's
    products where it runs, and why it does not where it could (``slower``)."""

    policy: Policy = Policy.LINEAR
    fixed_order: FixedOrderKernel | None = None
    openblas: bool = False  # the tiles run on OpenBLAS (arm64): other bits, another generation
    slower: str = ""  # why the fixed-order kernel does not run where it could, if so
    not_invariant: str = ""  # why the batch-invariant kernels, which the profile has, cannot run the model
    unrouted: tuple[str, ...] = ()  # the classes of the model's layers they do not route, if that is why

    @classmethod
    def choose(cls, profile: NumericsProfile, *, in_force: Mapping[str, Any], dtype: str, device: str,
               batch_invariant: bool | None = False, recording: bool = False,
               folder: Path | None = None, model: Any = None) -> Kernels:
        """The kernels of a model loaded under ``profile`` with the numerics ``in_force`` (``numerics
        .check``'s; empty off the CPU). ``batch_invariant``: True requires the batch-invariant kernels
        (a :class:`ConfigurationError` saying why not where the profile, dtype or device has none),
        None takes them wherever they exist, False keeps the previous kernels. ``recording``: goldens
        are recorded from oneDNN's own products, so no golden is made of a product of the fixed-order
        kernel that its sampled re-check did not cover. ``folder``: where the fixed-order kernel is
        built (None: it is not). ``model``: the loaded model, whose layers the batch-invariant kernels
        must all be able to route (:func:`not_routable`)."""
        __tracebackhide__ = True
        previous = _previous(profile, in_force, device)
        invariant = _invariant(profile, previous, dtype, device)
        if batch_invariant and invariant is None:
            raise _unavailable(profile, dtype, device)
        why_not_model = not_routable(model) if invariant is not None and model is not None else ""
        if why_not_model:
            if batch_invariant:
                raise ConfigurationError(
                    "llm_batch_invariant", "true",
                    f"batch-invariant kernels cannot run this model: {why_not_model}. Remove the setting "
                    "(the previous kernels then run it, and goldens keep the batch shape)")
            invariant = None
        policy = invariant if invariant is not None and batch_invariant is not False else previous
        openblas = policy is Policy.BATCH_INVARIANT_TILES and in_force.get("blas") == "openblas"
        built, why_not = None, ""
        if policy in _ON_ONEDNN:
            if recording:
                why_not = ("goldens are recorded with PyTorch's own kernel, the reference the faster copy is "
                           "checked against (--llm-golden-update)")
            elif folder is not None:
                built, why_not = fixed_order.build(folder)  # oneDNN's products on it, same bits
        slower = (f"matrix multiplications run on PyTorch's own kernel (oneDNN), not the plugin's faster "
                  f"copy of it: the same results to the bit, only slower, because {why_not}"
                  if built is None and why_not else "")
        unrouted = tuple(unrouted_layers(model)) if why_not_model and model is not None else ()
        return cls(policy, built, openblas, slower, why_not_model, unrouted)

    @property
    def batch_invariant(self) -> bool:
        """Whether a prompt's logits do not depend on its batch under these kernels."""
        return self.policy in GENERATIONS

    @property
    def generation(self) -> str | None:
        """What a golden computed on these kernels records as ``batch_invariant``; None for kernels
        that are not batch-invariant."""
        return GENERATION_OPENBLAS if self.openblas else GENERATIONS.get(self.policy)

    @property
    def phase_invariant(self) -> bool:
        """Whether a position's logits are the same bits in a decode step as in a prefill."""
        return self.generation in PHASE_INVARIANT

    def describe(self) -> str:
        """Which kernels run, and whether goldens depend on the batch shape (the load's line)."""
        if self.batch_invariant:
            return (f"kernels {self.policy.value}: a prompt gives the same bits alone or in any batch; "
                    "goldens do not depend on the batch shape")
        why = f"; {self.not_invariant}" if self.not_invariant else ""
        return (f"kernels {self.policy.value} (not batch-invariant{why}): the batch shape is part of every "
                "golden")

    @contextmanager
    def routed(self, model: Any) -> Iterator[int]:
        """Within the block, ``model``'s float32 ``nn.Linear`` layers on the CPU run on these kernels
        (under batch-invariant ones, its attention row by row too); everything is put back afterwards.
        Yields how many linear layers were routed."""
        import torch

        if self.policy is Policy.LINEAR:
            yield 0
            return
        modules = list(model.modules())  # walked once: a walk costs about 1 us a module, every call
        layers = [module for module in modules
                  if type(module) is torch.nn.Linear and "forward" not in vars(module)
                  and module.weight.dtype == torch.float32 and module.weight.device.type == "cpu"]
        threads = torch.get_num_threads()
        if not self.batch_invariant:
            try:
                for module in layers:
                    kernel = self._previous_kernel(module, tensor_ops.blocks_for(module.weight, threads))
                    module.forward = _forward(module, kernel)  # type: ignore[method-assign, assignment]
                yield len(layers)
            finally:
                for module in layers:
                    vars(module).pop("forward", None)
            return
        name = _register()
        configs = {id(config): config for config in _configs(model, modules)}
        attention = {key: config._attn_implementation for key, config in configs.items()}
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        phase = _Phase()
        hook = model.register_forward_pre_hook(phase.see, with_kwargs=True)
        products = self._invariant_kernels(False, 0)  # a mixture of experts' (prefill, decode)
        try:
            for config in configs.values():
                config._attn_implementation = name
            for module in layers:
                prefill, decode = self._invariant_kernels(module is head,
                                                          tensor_ops.blocks_for(module.weight, threads))
                module.forward = _phased_forward(module, phase, prefill, decode)  # type: ignore[method-assign, assignment]
            with experts.routed(experts.linear_modules(modules), list(configs.values()),
                                lambda: products[1] if phase.decode else products[0]):
                yield len(layers)
        finally:
            hook.remove()
            for key, config in configs.items():
                config._attn_implementation = attention[key]
            for module in layers:
                vars(module).pop("forward", None)

    def _previous_kernel(self, module: torch.nn.Linear, blocks: int) -> Kernel:
        """A linear's kernel under the previous (not batch-invariant) policies: larger products on
        oneDNN (portable), one-row products split over the threads, the rest ``F.linear``."""
        import torch

        linear = torch.nn.functional.linear
        out_features = module.weight.shape[0]
        onednn = self.policy is Policy.ONEDNN_AVX2
        fixed = self.fixed_order

        def kernel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            if onednn and x.numel() * out_features >= tensor_ops.ONEDNN_MIN_PRODUCT:
                return tensor_ops.onednn_product(x, weight, bias, fixed)
            if blocks and x.numel() == x.shape[-1]:  # one row on MKL's reproducible branch
                return tensor_ops.split_linear(x, weight, bias, blocks)
            return linear(x, weight, bias)

        return kernel

    def _invariant_kernels(self, head: bool, blocks: int) -> tuple[Kernel, Kernel]:
        """A linear's (prefill, decode) kernels under the batch-invariant policies. Portable: oneDNN with
        at least two rows in both phases, so a position's bits do not depend on the phase either (with
        position-canonical attention, decode equals prefill bit for bit). Tiles: the prefill in tiles of
        rows, a decode step's rows each a one-row product on the BLAS (a tile of 32 rows per decode row
        would cost 32 times the products), the output embedding (``head``) row by row in both phases
        (in tiles the vocabulary matrix would be read once per tile)."""
        if self.policy is Policy.BATCH_INVARIANT_TILES:
            rows: Kernel = functools.partial(tensor_ops.rows_linear, blocks=blocks)
            if blocks == 0:  # a lone row is F.linear's (rows_linear's first case), without the calls between
                rows = _lone_row_linear(rows)
            return (rows, rows) if head else (tensor_ops.tiled_linear, rows)
        invariant: Kernel = functools.partial(tensor_ops.invariant_linear, fixed_order=self.fixed_order)
        return invariant, invariant


def _lone_row_linear(rows: Kernel) -> Kernel:
    """``rows``, a :func:`tensor_ops.rows_linear` over unsplit weights, with a lone row sent to
    ``F.linear`` directly: the same call it makes there."""
    import torch

    linear = torch.nn.functional.linear

    def kernel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return linear(x, weight, bias) if x.numel() == x.shape[-1] else rows(x, weight, bias)

    return kernel


def _previous(profile: NumericsProfile, in_force: Mapping[str, Any], device: str) -> Policy:
    """The kernels before batch invariance: routed only where MKL's reproducible branch is in force."""
    if device != "cpu" or in_force.get("mkl_cbwr") != profiles.MKL_REPRODUCIBLE_BRANCH:
        return Policy.LINEAR  # native, a GPU, or a torch without MKL (arm64: OpenBLAS's kernels)
    return Policy.ONEDNN_AVX2 if profile.onednn_isa else Policy.SPLIT_ONE_ROW


def _invariant(profile: NumericsProfile, previous: Policy, dtype: str, device: str) -> Policy | None:
    """The batch-invariant kernels the profile supports here, or None: float32 on the CPU, under
    portable or compatible numerics on x86-64 (MKL's branch in force) or Linux arm64."""
    if why_not_batch_invariant(profile, dtype, device):
        return None
    if profile.pins_mkl and previous is Policy.LINEAR:  # a torch without MKL's reproducible branch
        return None
    return Policy.BATCH_INVARIANT if profile.batch_invariant == profiles.ONEDNN_ROWS \
        else Policy.BATCH_INVARIANT_TILES


def not_routable(model: Any) -> str:
    """Why the batch-invariant kernels cannot run ``model`` ("" where they can): every product must be
    an ``nn.Linear`` they route (a module holding a weight matrix of its own is anything else: GPT-2's
    Conv1D, an ``nn.Linear`` subclass with its own forward, a mixture of experts' fused experts and
    router, a state-space model's convolution), and its attention one that row-wise attention
    replaces (through transformers' attention interface; sliding windows, logit soft-capping and
    attention sinks included)."""
    unrouted = unrouted_layers(model)
    if unrouted:
        named = [f"{name} layers ({paths[0]}{f' and {len(paths) - 1} more' if len(paths) > 1 else ''})"
                 for name, paths in sorted(unrouted.items())]
        return f"its {' and '.join(named)} hold weights the batch-invariant kernels do not route"
    if not _attention_interface(model):
        return (f"its attention ({type(model).__name__}'s own) does not go through transformers' attention "
                "interface, which row-wise attention takes the place of")
    return ""


def unrouted_layers(model: Any) -> dict[str, list[str]]:
    """The model's layers holding a weight matrix of their own that the kernels do not route (anything
    but a plain ``nn.Linear``, and ``nn.Embedding``'s lookups), by class name: their paths."""
    import torch

    unrouted: dict[str, list[str]] = {}
    routed_by_linear = {id(module) for module in experts.linear_modules(list(model.modules()))}
    for path, module in model.named_modules():
        if type(module) is torch.nn.Linear or isinstance(module, torch.nn.Embedding) \
                or id(module) in routed_by_linear:
            continue  # routed (an expert's or router's F.linear too), or a lookup of one row
        if any(parameter.dim() >= 2 for parameter in module.parameters(recurse=False)):
            unrouted.setdefault(type(module).__name__, []).append(path)
    return unrouted


def _attention_interface(model: Any) -> bool:
    """Whether ``model``'s attention goes through transformers' attention interface (which row-wise
    attention takes the place of): its class says so, or its modeling module calls the interface's
    functions (StableLM's does without saying; BLOOM's, XGLM's and MPT's compute their own)."""
    import sys

    module = sys.modules.get(type(model).__module__)
    return getattr(model, "_supports_attention_backend", False) is True \
        or hasattr(module, "ALL_ATTENTION_FUNCTIONS")


def why_not_batch_invariant(profile: NumericsProfile, dtype: str, device: str) -> str:
    """Why batch-invariant kernels do not run a model loaded so ("" where they do, as far as the
    settings tell: float32 on the CPU under portable or compatible numerics, x86-64 or Linux arm64)."""
    return (f"the model runs on {device}, where the CPU's kernels do not compute it" if device != "cpu" else
            f"they run float32, not {dtype}" if dtype != "float32" else
            "" if profile.batch_invariant is not None else _where_they_run(profile))


def _where_they_run(profile: NumericsProfile) -> str:
    return (f"they run under portable or compatible numerics on x86-64 or arm64; this run has cpu numerics "
            f"{profile.mode!r} on {platform.machine()}")


def _unavailable(profile: NumericsProfile, dtype: str, device: str) -> ConfigurationError:
    why = why_not_batch_invariant(profile, dtype, device) or _where_they_run(profile)
    return ConfigurationError("llm_batch_invariant", "true",
                              f"batch-invariant kernels are not available here: {why}. Remove the setting "
                              "(the previous kernels then run here, and goldens keep the batch shape), or "
                              "run float32 on an x86-64 CPU with "
                              f"{pasteable('llm_cpu_numerics', 'portable')}")


def _forward(module: torch.nn.Linear, kernel: Kernel) -> Callable[[torch.Tensor], torch.Tensor]:
    """``module``'s forward in the block: ``kernel`` for float32 inputs, ``F.linear`` otherwise."""
    import torch

    linear, float32 = torch.nn.functional.linear, torch.float32

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != float32:
            return linear(x, module.weight, module.bias)
        return kernel(x, module.weight, module.bias)

    return forward


def _phased_forward(module: torch.nn.Linear, phase: _Phase, prefill: Kernel,
                    decode: Kernel) -> Callable[[torch.Tensor], torch.Tensor]:
    """``module``'s forward in the block: ``decode`` in a decode step, ``prefill`` otherwise."""
    import torch

    linear, float32 = torch.nn.functional.linear, torch.float32

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != float32:
            return linear(x, module.weight, module.bias)
        return (decode if phase.decode else prefill)(x, module.weight, module.bias)

    return forward


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


def _configs(model: Any, modules: list[Any] | None = None) -> list[Any]:
    """The model's configuration objects its attention layers read the implementation from
    (``modules``: the model's, where already listed)."""
    found = [model.config]
    for module in model.modules() if modules is None else modules:
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            found.append(config)
    return found


def _register() -> str:
    """Make the row-wise attention known to transformers (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, tensor_ops.rowwise_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # the boolean masks rowwise_attention reads
    return ATTENTION
