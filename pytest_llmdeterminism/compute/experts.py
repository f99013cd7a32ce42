"""A mixture of experts on the batch-invariant kernels: the experts and the router that hold their weights
as parameters of their own (transformers 5's fused ``gate_up_proj`` / ``down_proj`` and a router's
``weight``) and multiply by them with ``F.linear`` in their forward.

An expert multiplies the tokens routed to it, as many rows as its companions sent it: on the stock
``F.linear`` a token's bits then depend on its batch. Within :meth:`Kernels.routed` a torch function
mode makes ``F.linear``, for those weights alone (found by their storage), the kernels'
row-invariant product, so a token's expert output has the same bits whatever else was routed there;
the experts run transformers' eager implementation (``config._experts_implementation``), whose loop
over the experts and ``index_add_`` sum each token's experts in expert order. Which modules qualify
is read from their forward's code (:func:`linear_modules`); any other product (``@``, ``matmul``,
``bmm``, ``einsum``) keeps the model on the previous kernels.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

Kernel = Callable[["torch.Tensor", "torch.Tensor", "torch.Tensor | None"], "torch.Tensor"]

_LINEAR = re.compile(r"\b(?:F|functional|nn\.functional)\.linear\(")
# Any other product: the matrix operator (not a decorator), matmul, bmm, einsum, mm, addmm, a convolution.
_OTHER_PRODUCT = re.compile(r"(?<![@\w])@(?![@\w])|\b(?:matmul|bmm|einsum|addmm|conv\w*)\(|\.mm\(")


def linear_modules(modules: Iterable[Any]) -> list[Any]:
    """Of a model's ``modules``, those (other than ``nn.Linear``) holding a weight matrix of their own
    that their forward multiplies by with ``F.linear`` alone: a mixture of experts' fused experts and
    router."""
    import torch

    return [module for module in modules
            if type(module) is not torch.nn.Linear and not isinstance(module, torch.nn.Embedding)
            and any(p.dim() >= 2 for p in module.parameters(recurse=False)) and _by_linear(type(module))]


def _by_linear(cls: type) -> bool:
    """Whether ``cls``'s own forward (transformers' experts wrapper unwrapped) multiplies by
    ``F.linear`` and by nothing else."""
    forward = getattr(cls, "forward", None)
    return _code_by_linear(getattr(forward, "__wrapped__", forward))


@functools.cache
def _code_by_linear(forward: Any) -> bool:
    try:
        source = inspect.getsource(forward)
    except (OSError, TypeError):
        return False
    code = "\n".join(line.split("#", 1)[0] for line in source.splitlines()[1:])  # no signature, no comments
    return bool(_LINEAR.search(code)) and not _OTHER_PRODUCT.search(code)


@contextmanager
def routed(modules: list[Any], configs: list[Any], kernel: Callable[[], Kernel]) -> Iterator[None]:
    """Within the block, on this thread, ``F.linear`` by a weight of ``modules`` (a view of one of their
    parameters: an expert's slice) runs ``kernel()`` (the phase's row-invariant product); every other
    call is untouched. The experts run transformers' eager implementation. A torch function mode:
    per thread and stacked, so another thread's calls and an exception leave nothing behind."""
    if not modules:
        yield
        return
    implementations = [(config, config._experts_implementation) for config in configs
                       if hasattr(config, "_experts_implementation")]
    try:
        for config, _ in implementations:
            config._experts_implementation = "eager"
        with _mode_class()(modules, kernel):
            yield
    finally:
        for config, implementation in implementations:
            config._experts_implementation = implementation


@functools.cache
def _mode_class() -> type:
    """The torch function mode that routes the experts' products, made once: torch is imported only
    when a model runs. Inside its handler the mode is off, so the kernel's own products are stock."""
    import torch
    from torch.overrides import TorchFunctionMode

    linear = torch.nn.functional.linear

    class _Experts(TorchFunctionMode):
        def __init__(self, modules: list[Any], kernel: Callable[[], Kernel]) -> None:
            super().__init__()
            self._kernel = kernel
            self._storages = {parameter.untyped_storage().data_ptr() for module in modules
                              for parameter in module.parameters(recurse=False)}

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is linear:
                x, weight = args[0], args[1] if len(args) > 1 else kwargs["weight"]
                if x.dtype == torch.float32 and weight.untyped_storage().data_ptr() in self._storages:
                    bias = args[2] if len(args) > 2 else kwargs.get("bias")
                    return self._kernel()(x, weight, bias)
            return func(*args, **kwargs)

    return _Experts
