"""Could a kernel of the plugin's own give portable bits at native speed? A feasibility measurement.

``kernels/fixed_order_gemm.c`` computes ``y = x @ W.T`` with every output a sequential chain of
fused multiply-adds over ``k = 0..K-1`` (the weight packed once into panels of 16 outputs), in three
builds: AVX-512 (one 16-lane register per panel), AVX2 and FMA (two 8-lane registers) and scalar C
``fmaf``. A fused multiply-add rounds once, as IEEE 754 defines it, and each output's chain is the
same in every build, so the three must give the same bits, on any CPU that runs them (any x86-64
through ``fmaf``; arm64's NEON has the same fused multiply-add); and a row's bits cannot depend on
the rows beside it or on the thread count (threads take whole panels). The script checks both,
compares the bits with today's route, and times the kernel against the plain test's ``F.linear``
(native kernels, its own process) and the route portable numerics take today
(``compute/kernels.py``), on SmolLM2-135M's shapes at 1, 4 and 64 rows (30 distinct weights per
shape, streamed from memory; 2 threads; best of 5).

    python benchmarks/fixed_order_kernel.py        # needs gcc with OpenMP (builds into a temp folder)
    python benchmarks/fixed_order_kernel.py --smoke   # one shape, 3 weights, once

Not in the product: its bits are not today's, so goldens would have to record which kernels made
them. The product's kernel (``compute/fixed_order.py``) computes oneDNN's own order instead, so its bits
are today's.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = Path(__file__).resolve().parent / "kernels" / "fixed_order_gemm.c"
BUILDS = {"avx512": ["-mavx512f", "-mfma", "-DVARIANT_AVX512"], "avx2": ["-mavx2", "-mfma", "-DVARIANT_AVX2"],
          "scalar": ["-ffp-contract=off"]}
SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]
ROWS = (1, 4, 64)
WEIGHTS = 30
SMOKE = "one shape, 3 weights, timed once, so the script cannot rot (its figures mean nothing)"


def build(folder: Path) -> dict[str, Path]:
    built = {}
    for name, flags in BUILDS.items():
        built[name] = folder / f"gemm_{name}.so"
        command = ["gcc", "-O3", "-fopenmp", "-fPIC", "-shared", *flags, str(SOURCE), "-o", str(built[name]),
                   "-lm"]
        subprocess.run(command, check=True)
    return built


def _best_us(kernel, weights, repeats: int) -> float:
    for w in weights[:2]:
        kernel(w)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for w in weights:
            kernel(w)
        best = min(best, (time.perf_counter() - started) / len(weights) * 1e6)
    return best


def measure(mode: str, folder: str, smoke: bool) -> None:
    sys.path.insert(0, str(ROOT))
    from pytest_llmdeterminism.compute import numerics, tensor_ops

    numerics.pin(mode)
    import torch

    torch.set_num_threads(2)
    functional = torch.nn.functional
    pointer = ctypes.c_void_p
    libraries = {}
    for name in BUILDS:
        library = ctypes.CDLL(str(Path(folder) / f"gemm_{name}.so"))
        library.gemm.argtypes = [pointer, pointer, pointer, pointer, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        library.pack.argtypes = [pointer, pointer, ctypes.c_int, ctypes.c_int]
        libraries[name] = library

    def fixed(name, x, packed, out_features, in_features):
        y = torch.empty(x.shape[0], out_features)
        libraries[name].gemm(x.data_ptr(), packed.data_ptr(), None, y.data_ptr(), x.shape[0], out_features,
                             in_features)
        return y

    torch.manual_seed(0)
    found: dict[str, object] = {}
    repeats = 1 if smoke else 5
    for out_features, in_features in SHAPES[:1] if smoke else SHAPES:
        count = 3 if out_features > 4096 or smoke else WEIGHTS
        weights = [torch.randn(out_features, in_features) * 0.05 for _ in range(count)]
        packs = {}
        for w in weights:
            packs[id(w)] = torch.empty(out_features * in_features)
            libraries["scalar"].pack(w.data_ptr(), packs[id(w)].data_ptr(), out_features, in_features)
        for rows in ROWS:
            if out_features > 4096 and rows > 1:
                continue  # generate() computes the LM head for the last row only
            x = torch.randn(rows, in_features)
            key = f"{out_features}x{in_features}, {rows} rows"
            if mode == "native":
                found[key] = {"native": _best_us(lambda w, x=x: functional.linear(x, w), weights, repeats)}
                continue
            first = packs[id(weights[0])]

            def timed(name, x=x, packs=packs, shape=(out_features, in_features), weights=weights):
                return _best_us(lambda weight: fixed(name, x, packs[id(weight)], *shape), weights, repeats)

            ys = {name: fixed(name, x, first, out_features, in_features) for name in BUILDS}
            alone = fixed("avx512", x[-1:].contiguous(), first, out_features, in_features)
            exact = x.double() @ weights[0].double().T
            onednn = rows * in_features * out_features >= tensor_ops.ONEDNN_MIN_PRODUCT

            def routed(w, x=x, onednn=onednn, rows=rows):
                if onednn:
                    return tensor_ops.onednn_linear(x, w, None)
                return tensor_ops.split_linear(x, w, None, 2) if rows == 1 else functional.linear(x, w)

            found[key] = {
                "builds_agree": all(torch.equal(ys["avx512"], y) for y in ys.values()),
                "row_alone_agrees": torch.equal(alone[0], ys["avx512"][-1]),
                "today_agrees": torch.equal(ys["avx512"], routed(weights[0])),
                "error": (ys["avx512"].double() - exact).abs().max().item(),
                "routed_error": (routed(weights[0]).double() - exact).abs().max().item(),
                "avx512": timed("avx512"),
                "avx2": timed("avx2"),
                "routed": _best_us(routed, weights, repeats),
            }
    print(json.dumps(found))


def main() -> None:
    if len(sys.argv) > 4 and sys.argv[1] == "--measure":
        measure(sys.argv[2], sys.argv[3], sys.argv[4] == "smoke")
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    smoke = parser.parse_args().smoke
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from natural_test import NUMERICS_ENV, cpu_vendor  # type: ignore[import-not-found]

    env = {k: v for k, v in os.environ.items() if k not in NUMERICS_ENV}
    with tempfile.TemporaryDirectory() as folder:
        build(Path(folder))
        print(f"CPU: {cpu_vendor()}; 2 threads, {WEIGHTS} weights per shape, best of 5", flush=True)
        runs = {mode: json.loads(subprocess.run(
            [sys.executable, __file__, "--measure", mode, folder, "smoke" if smoke else "full"], env=env,
            check=True, capture_output=True,
            text=True).stdout.strip().splitlines()[-1]) for mode in ("native", "portable")}
    print(f"{'shape':24} {'native':>8} {'today':>8} {'fixed512':>8} {'fixed256':>8} {'ratio':>6} "
          f"{'builds=':>7} {'alone=':>6} {'today=':>6} {'max error (today)':>20}")
    for key, native in runs["native"].items():
        p = runs["portable"][key]
        best = min(p["avx512"], p["avx2"])
        print(f"{key:24} {native['native']:7.0f}µ {p['routed']:7.0f}µ {p['avx512']:7.0f}µ {p['avx2']:7.0f}µ "
              f"{best / native['native']:5.2f}× {p['builds_agree']!s:>7} {p['row_alone_agrees']!s:>6} "
              f"{p['today_agrees']!s:>6} "
              f"{p['error']:9.1e} ({p['routed_error']:.1e})")


if __name__ == "__main__":
    main()
