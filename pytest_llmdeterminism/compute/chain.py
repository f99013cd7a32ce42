"""oneDNN's AVX2 GEMM bits at native speed: a kernel of the plugin's own, in one fixed order.

Portable numerics run a model's larger float32 linears on oneDNN capped at AVX2 (``linears.py``):
the same bits on every x86-64 CPU, but on an Intel Xeon with AVX-512 about 1.5x the plain test's
time per call, almost all of it in those products. oneDNN's order is simple (torch 2.13, oneDNN
3.12, measured for 7 shapes from 50x7 to 2048x2048 with ragged and several blocks of input features,
1 to 265 rows, 1 to 3 threads, with and without a bias):

- the input features are cut into blocks of 1024, whose sums are added left to right, then the bias;
- at two or more rows each output's block is one chain of fused multiply-adds over its features;
- at one row (its one-row kernel) 8 lanes each chain every 8th feature of the block, reduced as
  ``((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))``.

``chain_linear.c`` computes exactly those orders, reading the weight in place (nothing packed or
copied): the same bits, at native MKL's speed or better on a decode step.

It is an accelerator, never a new definition of the bits. The kernel is compiled once with the
machine's C compiler into the plugin's cache folder; where there is none, or it fails, the products
stay on oneDNN. And before a shape (output and input features, rows, bias, threads) runs on it, its
first product is computed both ways in the process and compared bit for bit; a shape where they
differ stays on oneDNN for the rest of the process. So a torch whose oneDNN changed its order costs
the speed, not the goldens.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("chain_linear.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared")
# oneDNN's block of input features at two or more rows (see the module's note).
ONEDNN_KBLOCK = 1024
# LLMDET_OWN_KERNELS=0 keeps every product on oneDNN (the same bits: for comparisons and benchmarks).
SWITCH = "LLMDET_OWN_KERNELS"


def build(folder: Path) -> tuple[ChainKernel | None, str]:
    """The kernel, compiled into ``folder`` unless a build of this source with these flags is there;
    or ``None`` and why not (no compiler, not x86-64, switched off)."""
    import platform

    if os.environ.get(SWITCH, "1") == "0":
        return None, f"{SWITCH}=0"
    if platform.machine() not in ("x86_64", "AMD64") or sys.platform != "linux":
        return None, f"built for Linux x86-64 only, not {sys.platform} {platform.machine()}"
    import xxhash

    digest = xxhash.xxh3_64_hexdigest(SOURCE.read_bytes() + " ".join(FLAGS).encode())
    library = folder / f"chain_linear-{digest}.so"
    if not library.is_file():
        why = _compile(library)
        if why:
            return None, why
    if why := _untrusted(library):
        return None, why
    try:
        return ChainKernel(ctypes.CDLL(str(library))), f"built in {library.parent}"
    except OSError as error:
        return None, f"{library} did not load: {error}"


def _untrusted(library: Path) -> str:
    """Why ``library`` must not be loaded (code others could have written), or ''."""
    for path in (library, library.parent):
        status = path.stat()
        if status.st_uid != os.getuid() or status.st_mode & 0o022:
            return (f"{path} is not the user's own or others may write it (mode {status.st_mode & 0o777:o}); "
                    "the plugin loads no code from it: remove it, or set LLMDET_CACHE_DIR to a private "
                    "folder")
    return ""


def _compile(library: Path) -> str:
    """Compiles the kernel to ``library`` (beside it, then renamed into place); '' or why it failed."""
    compiler = os.environ.get("CC", "gcc")
    try:
        library.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=library.parent) as folder:
            built = Path(folder) / library.name
            done = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(built)], capture_output=True,
                                  text=True, timeout=120, check=False)
            if done.returncode != 0:
                said = done.stderr.strip().splitlines()
                return f"{compiler} failed ({said[-1] if said else f'exit status {done.returncode}'})"
            built.chmod(0o755)  # not group-writable whatever the umask: _untrusted would refuse it
            os.replace(built, library)
    except (OSError, subprocess.SubprocessError) as error:
        return f"{compiler} could not build it: {error}"
    return ""


class ChainKernel:
    """``F.linear`` for float32 on the CPU with the bits of oneDNN's AVX2 kernels (its GEMM and its
    one-row kernel), each shape checked against oneDNN once per process before it is used."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._function = library.chain_linear
        self._function.restype = ctypes.c_int
        self._function.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 5
        # (out, in, rows, bias, threads) -> whether the kernel's bits equalled oneDNN's there
        self.checked: dict[tuple[int, int, int, bool, int], bool] = {}

    def linear(self, x: Any, weight: Any, bias: Any, reference: Callable[[Any, Any, Any], Any]) -> Any:
        """``reference(x, weight, bias)``'s result, computed by the kernel where it was seen to be equal."""
        import torch

        out_features, in_features = weight.shape
        rows = x.numel() // in_features
        threads = torch.get_num_threads()
        key = (out_features, in_features, rows, bias is not None, threads)
        equal = self.checked.get(key)
        if equal is False or not _plain(x, weight, bias):
            return reference(x, weight, bias)
        y = self._run(x, weight, bias, rows, threads)
        if equal is None:
            expected = reference(x, weight, bias)
            self.checked[key] = bool(torch.equal(expected.view(torch.int32), y.view(torch.int32)))
            return expected
        return y

    def _run(self, x: Any, weight: Any, bias: Any, rows: int, threads: int) -> Any:
        import torch

        out_features, in_features = weight.shape
        x = x.contiguous()
        y = torch.empty(*x.shape[:-1], out_features, dtype=torch.float32)
        if self._function(x.data_ptr(), weight.data_ptr(), bias.data_ptr() if bias is not None else None,
                          y.data_ptr(), rows, in_features, out_features, ONEDNN_KBLOCK, threads):
            raise MemoryError(f"chain_linear: no memory for a {rows}x{in_features} input")
        return y


def _plain(x: Any, weight: Any, bias: Any) -> bool:
    import torch

    return (x.dtype == weight.dtype == torch.float32 and weight.is_contiguous() and x.device.type == "cpu"
            and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous())))
