"""The portable premium on prefill-heavy and decode-heavy work, per CPU numerics mode, side by side.

A wider random Llama than the built-in one (hidden 1024, 4 layers, vocabulary 512; built here, no
download): the forward pass over a 128-token prompt (prefill) and 32 decode steps from its cache,
with the model's linears routed as the plugin routes them under each mode (``compute/kernels.py``).
Numerics are fixed when torch starts, so each mode runs in its own process; the processes alternate
round by round, and each prints the median of its rounds.

    python benchmarks/portable_premium.py              # 2 alternating rounds of 5 repeats per mode
    python benchmarks/portable_premium.py --rounds 4
    python benchmarks/portable_premium.py --smoke      # a narrow model, one round of one repeat
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("native", "compatible", "portable")
SMOKE = ("a narrow model (hidden 256, 1 layer, 16-token prefill, 4 steps), one round of one repeat, so the "
         "script cannot rot (its figures mean nothing)")


def measure(mode: str, repeats: int, smoke: bool) -> None:
    sys.path.insert(0, str(ROOT))
    from pytest_llmdeterminism.compute import numerics
    from pytest_llmdeterminism.compute.kernels import Kernels

    numerics.pin(mode)  # as the plugin does, before torch computes anything
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    hidden, layers, prompt, steps = (256, 1, 16, 4) if smoke else (1024, 4, 128, 32)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                         num_attention_heads=16, num_key_value_heads=4, vocab_size=512,
                         max_position_embeddings=1024)
    model = LlamaForCausalLM(config).eval()
    kernels = Kernels.choose(numerics.profile(mode), in_force=numerics.check(mode), dtype="float32",
                             device="cpu")
    ids = torch.randint(0, 512, (1, prompt), generator=torch.Generator().manual_seed(1))
    prefill, decode = [], []
    with torch.inference_mode(), kernels.routed(model):
        for repeat in range(repeats + 1):  # the first is a warm-up
            started = time.perf_counter()
            out = model(ids, use_cache=True)
            prefilled = time.perf_counter()
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            for _ in range(steps):
                step = model(token, past_key_values=cache, use_cache=True)
                token = step.logits[:, -1:].argmax(-1)
            if repeat:
                prefill.append(prefilled - started)
                decode.append((time.perf_counter() - prefilled) / steps)
    print(f"{statistics.median(prefill)} {statistics.median(decode)} {kernels.policy.value}", flush=True)


def main() -> None:
    if len(sys.argv) > 4 and sys.argv[1] == "--mode":
        measure(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "smoke")
        return
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.repeats = 1, 1
    env = {k: v for k, v in os.environ.items()
           if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    found: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    kernels = {}
    for _ in range(args.rounds):
        for mode in MODES:
            out = subprocess.run([sys.executable, __file__, "--mode", mode, str(args.repeats),
                                  "smoke" if args.smoke else "full"], env=env,
                                 check=True, capture_output=True, text=True).stdout.split()
            found[mode].append((float(out[0]), float(out[1])))
            kernels[mode] = " ".join(out[2:])
    native = {k: statistics.median(v[k] for v in found["native"]) for k in (0, 1)}
    model, prefill_tokens = ("hidden 256, 1 layer (--smoke)", 16) if args.smoke else \
        ("hidden 1024, 4 layers", 128)
    print(f"{model}; medians, and the ratio to native:")
    for mode in MODES:
        prefill = statistics.median(p for p, _ in found[mode])
        decode = statistics.median(d for _, d in found[mode])
        print(f"  {mode:10} linears on {kernels[mode]:14} prefill of {prefill_tokens} tokens "
              f"{prefill * 1e3:7.1f} ms "
              f"({prefill / native[0]:.2f}x)   decode step {decode * 1e3:6.2f} ms "
              f"({decode / native[1]:.2f}x)")


if __name__ == "__main__":
    main()
