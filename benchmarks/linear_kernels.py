"""Where the portable premium goes, per linear and kernel: SmolLM2-135M's products, native vs portable.

Each mode runs in its own process (numerics are fixed when torch starts), the processes alternating
round by round. Per shape (SmolLM2's query/output, key/value, gate/up, down projections and LM head)
and rows (1: a decode step at batch 1; 4: a short prompt's prefill; 265: the long prompt's), the CPU
time (``time.process_time``, one thread: robust to a busy machine, where a second thread's wait is
not) of one product, each over 30 distinct weights so they stream from memory as in a model:

- native: ``F.linear`` with the CPU's own kernels (MKL's AVX-512 path on an AVX-512 Intel CPU);
- portable: the kernel the plugin routes the shape to (``compute/kernels.py``: oneDNN capped at AVX2
  at or above ``ONEDNN_MIN_PRODUCT`` multiply-adds, else MKL's reproducible branch), and oneDNN with
  a weight packed once (``torch.ops.mkldnn._reorder_linear_weight``), with whether it gives the bits
  of oneDNN on the plain weight (the routed kernel where the shape goes to oneDNN);
- the fixed-order kernel (``compute/fixed_order.py``), which the plugin runs for oneDNN's products where it
  gives oneDNN's bits, with whether it does.

    python benchmarks/linear_kernels.py                # 3 alternating rounds, one thread
    python benchmarks/linear_kernels.py --rounds 5 --threads 2
    python benchmarks/linear_kernels.py --smoke         # one round, two shapes, 3 weights each

A one-row product streams its weight once: there the kernel's loads decide. A packed weight saves
oneDNN's copy of the plain weight on every call, but its one-row kernel gives other bits.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (out, in features): query/output, key/value, gate/up, down, LM head (SmolLM2-135M).
SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]
ROWS = (1, 4, 265)
WEIGHTS = 30
SMOKE = "one round, two shapes, 3 weights each, so the script cannot rot (its figures mean nothing)"


def measure(mode: str, threads: int, smoke: bool) -> None:
    sys.path.insert(0, str(ROOT))
    from pytest_llmdeterminism.compute import fixed_order, numerics, tensor_ops
    from pytest_llmdeterminism.engines.cached import cache_dir

    numerics.pin(mode)
    import torch

    torch.set_num_threads(threads)
    own, why = fixed_order.build(cache_dir() / "kernels")  # the plugin's own (a folder in /tmp is refused)
    if own is None:
        raise SystemExit(f"the fixed-order kernel did not build: {why}")
    torch.manual_seed(0)
    portable = mode == numerics.PORTABLE
    if portable:
        numerics.check(mode)
    results = {}
    for out_features, in_features in [SHAPES[0], SHAPES[-1]] if smoke else SHAPES:
        count = 3 if out_features > 4096 or smoke else WEIGHTS
        weights = [torch.randn(out_features, in_features) * 0.05 for _ in range(count)]
        packed = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in weights] if portable else []
        for rows in ROWS[:2] if smoke else ROWS:
            if out_features > 4096 and rows > 1:
                continue  # generate() computes the LM head for the last row only
            x = torch.randn(1, rows, in_features)
            onednn = rows * in_features * out_features >= tensor_ops.ONEDNN_MIN_PRODUCT

            def routed(w, x=x, onednn=onednn):
                if portable and onednn:
                    return tensor_ops.onednn_linear(x, w, None)
                return torch.nn.functional.linear(x, w)

            kernels = {"routed": (routed, weights)}
            if portable:
                kernels["packed"] = (lambda w, x=x: tensor_ops.onednn_linear(x, w, None), packed)
                kernels["own"] = (lambda w, x=x, rows=rows: own._run(x, w, None, rows, threads), weights)
            entry = {"kernel": ("oneDNN AVX2" if onednn else "MKL reproducible") if portable else "native"}
            for name, (kernel, ws) in kernels.items():
                for w in ws[:2]:
                    kernel(w)  # primitives created, pages touched
                started = time.process_time()
                for w in ws:
                    kernel(w)
                entry[f"{name}_us"] = (time.process_time() - started) / len(ws) * 1e6
            if portable:
                # against oneDNN on the plain weight: what a packed weight would replace
                entry["packed_same_bits"] = all(
                    torch.equal(tensor_ops.onednn_linear(x, w, None), tensor_ops.onednn_linear(x, p, None))
                    for w, p in zip(weights[:3], packed[:3], strict=True))
                entry["own_same_bits"] = not onednn or all(
                    torch.equal(tensor_ops.onednn_linear(x, w, None), own._run(x, w, None, rows, threads))
                    for w in weights[:3])
            results[f"{out_features}x{in_features}, {rows} rows"] = entry
    print(json.dumps(results))


def main() -> None:
    if len(sys.argv) > 4 and sys.argv[1] == "--measure":
        measure(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "smoke")
        return
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.rounds = 1
    from natural_test import NUMERICS_ENV, cpu_vendor  # type: ignore[import-not-found]

    sys.path.insert(0, str(ROOT))
    print(f"CPU: {cpu_vendor()}; {args.threads} thread(s), {WEIGHTS} weights per shape; CPU time", flush=True)
    env = {k: v for k, v in os.environ.items() if k not in NUMERICS_ENV}
    rounds: dict[str, list[dict]] = {"native": [], "portable": []}
    for r in range(args.rounds):
        for mode in (("native", "portable") if r % 2 == 0 else ("portable", "native")):
            command = [sys.executable, __file__, "--measure", mode, str(args.threads),
                       "smoke" if args.smoke else "full"]
            done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
            rounds[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"{'shape':24} {'portable kernel':17} {'native':>9} {'portable':>9} {'ratio':>6} "
          f"{'packed':>9} {'packed = plain oneDNN':>21} {'plugin':>9} {'ratio':>6} {'plugin = oneDNN':>16}")
    for key in rounds["native"][0]:
        native = statistics.median(r[key]["routed_us"] for r in rounds["native"])
        portable = statistics.median(r[key]["routed_us"] for r in rounds["portable"])
        packed = statistics.median(r[key]["packed_us"] for r in rounds["portable"])
        own = statistics.median(r[key]["own_us"] for r in rounds["portable"])
        entry = rounds["portable"][0][key]
        own_bits = "same bits" if entry["own_same_bits"] else "OTHER BITS"
        own_bits = own_bits if "oneDNN" in entry["kernel"] else "-"
        print(f"{key:24} {entry['kernel']:17} {native:8.0f}µ {portable:8.0f}µ {portable / native:5.2f}× "
              f"{packed:8.0f}µ {'same bits' if entry['packed_same_bits'] else 'OTHER BITS':>21} "
              f"{own:8.0f}µ {own / native:5.2f}× "
              f"{own_bits:>16}")


if __name__ == "__main__":
    main()
