"""Which CPU-numerics pin keeps the bits across x86-64 CPUs, and what each costs: the search for a
cheaper portable mode.

For each candidate (MKL's code branch ``MKL_CBWR`` x ATen's ``ATEN_CPU_CAPABILITY``) this hashes
the GEMMs a decoder runs (``linear`` at 1, 2, 5 and 32 rows, a bias, an attention ``bmm``; shapes
of SmolLM2-135M, K = 576) natively and under ``qemu-x86_64 -cpu`` of another vendor and of an
older ISA, at 1 and 2 threads, and times the same GEMMs natively (decode: 1 row; prefill: 121 rows).
A pin is portable when every CPU gives one hash. Emulation is slow: shapes stay small.

    python benchmarks/mkl_branches.py                  # all candidates, Haswell/EPYC (+Nehalem)
    python benchmarks/mkl_branches.py --cpus EPYC      # one emulated CPU
    python benchmarks/mkl_branches.py --smoke          # natively: no pin and one candidate, 1 thread

Measured 2026-12-01 on a 2-core Intel Xeon (AVX512) with torch 2.13 / MKL 2024.2: only
``MKL_CBWR=COMPATIBLE`` gave one hash on the host, an emulated Haswell and an emulated EPYC;
``MKL_CBWR=AVX2`` (and ``AVX2,STRICT``, ``AVX``) is honoured on Intel (host and Haswell agree) but
reads back as ``AUTO`` on the emulated EPYC and every ``linear`` hash differs there. ATen's level
changes no GEMM hash (MKL does the GEMMs) and little time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ("natively (no emulated CPU), no pin and the first candidate, 1 thread, fewer repeats, so the "
         "script cannot rot (its figures mean nothing)")
CANDIDATES = [("COMPATIBLE", "default"), ("COMPATIBLE", "avx2"), ("AVX2", "default"), ("AVX2", "avx2"),
              ("AVX2,STRICT", "default")]


def probe(threads: int, timed: bool, repeats: int) -> dict:
    import torch
    import xxhash

    from pytest_llmdeterminism.compute import numerics

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    weight, bias = torch.randn(1536, 576), torch.randn(1536)
    hashes = {}
    for rows in (1, 2, 5, 32):
        x = torch.randn(rows, 576)
        for name, out in ((f"linear {rows}", torch.nn.functional.linear(x, weight)),
                          (f"linear+bias {rows}", torch.nn.functional.linear(x, weight, bias))):
            hashes[name] = xxhash.xxh3_64_hexdigest(out.contiguous().numpy().tobytes())[:8]
    q, k = torch.randn(1, 9, 64, 64), torch.randn(1, 9, 64, 64)
    hashes["bmm"] = xxhash.xxh3_64_hexdigest((q @ k.transpose(-1, -2)).contiguous().numpy().tobytes())[:8]
    result = {"effective": numerics.effective(), "hashes": hashes}
    if timed:
        head = torch.randn(49152, 576)
        for label, rows, w in (("decode (1 row, 49152x576)", 1, head),
                               ("prefill (121 rows, 1536x576)", 121, weight)):
            x = torch.randn(rows, 576)
            for _ in range(3):
                torch.nn.functional.linear(x, w)
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                torch.nn.functional.linear(x, w)
                times.append(time.perf_counter() - started)
            result[label] = statistics.median(times) * 1e3
    return result


def run(cbwr: str | None, aten: str | None, threads: int, cpu: str | None, timed: bool,
        repeats: int = 21) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY")}
    env.update({k: v for k, v in (("MKL_CBWR", cbwr), ("ATEN_CPU_CAPABILITY", aten)) if v})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, __file__, "--probe", str(threads), "1" if timed else "0", str(repeats)]
    if cpu:
        command = [shutil.which("qemu-x86_64") or "qemu-x86_64", "-cpu", cpu, *command]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--probe":
        print(json.dumps(probe(int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4]))))
        return
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpus", nargs="*", default=["Haswell", "EPYC"],
                        help="qemu -cpu models to compare with (none: time only)")
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    candidates, repeats = (CANDIDATES[:1], 3) if args.smoke else (CANDIDATES, 21)
    if args.smoke:
        args.cpus, args.threads = [], [1]
    rows = [("native", None, None, "", "")] + [(f"{c} + aten {a}", c, a, "", "") for c, a in candidates]
    print("candidate | threads | portable across host and " + ", ".join(args.cpus)
          + " | decode ms | prefill ms")
    for label, cbwr, aten, _, _ in rows:
        for threads in args.threads:
            host = run(cbwr, aten, threads, None, timed=True, repeats=repeats)
            differing = []
            for cpu in args.cpus:
                other = run(cbwr, aten, threads, cpu, timed=False)
                wrong = [name for name, value in host["hashes"].items() if other["hashes"][name] != value]
                if wrong:
                    differing.append(f"{cpu} ({other['effective']['mkl_cbwr']}): {len(wrong)} of "
                                     f"{len(host['hashes'])} GEMMs differ")
            verdict = ("not compared" if not args.cpus
                       else "no: " + "; ".join(differing) if differing else "yes")
            print(f"{label} | {threads} | {verdict} | {host['decode (1 row, 49152x576)']:.2f} | "
                  f"{host['prefill (121 rows, 1536x576)']:.2f}", flush=True)


if __name__ == "__main__":
    main()
