"""The benchmarks' smoke runs (tests/pytester/test_benchmarks.py, tests/engines/test_benchmarks_engines.py):
every script in ``benchmarks/`` takes ``--smoke``, one short round of each of its steps on the tiny model,
so a benchmark the docs cite cannot rot unnoticed. Each must exit 0 and print the lines its figures
are read from (``RESULT_LINES``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT

BENCHMARKS = ROOT / "benchmarks"
RATIO = r"[0-9.]+[x×]"
# The lines each script's figures are read from, as patterns searched line by line in its output.
RESULT_LINES: dict[str, tuple[str, ...]] = {
    "arm64_numerics": (r"^portable +host .*( [0-9a-f]{8}){4} ", r"^native +host .*( [0-9a-f]{8}){4} "),
    "audit_cost": (rf"^builtin:tiny: generate \d+ ms, audit \d+ ms -> {RATIO} \(10 rows, 5 repeats\)$",),
    "batch_invariant": (rf"^lone call, prefill-heavy .* -> {RATIO} \(rounds ",
                        rf"^lone call, decode-heavy .* -> {RATIO}",
                        rf"^8 prompts x 16 new tokens on batch-invariant kernels, bit-identical: .* "
                        rf"-> {RATIO}$"),
    "engines": (rf"^llama\.cpp in process \(1 thread\) .* {RATIO}$",
                rf"^OpenAI-compatible server \(HTTP\) .* {RATIO}$",
                r"^transformers fp32 → llama\.cpp Q4_1: "),
    "eval_cost": (rf"^evaluate \d+ items / one call at a time: {RATIO} wall, {RATIO} CPU; same scores bit "
                  r"for bit: True$",),
    "fingerprint_cost": (r"^weights hash, 0\.02 GiB file: uncached [0-9.]+ s .*; cached [0-9.]+ ms$",
                         r"^full fingerprint of builtin:tiny \(builtin\): first \d+ ms, next session "),
    "fixed_order_kernel": (rf"^576x576, 1 rows .* {RATIO} +True +True ",),
    "golden_scale": (r"^10 goldens \(2 files x 5 entries x 4 steps, ", r"^  write .* [0-9.]+ s$",
                     r"^  read \+ validate \+ compare every golden +[0-9.]+ s$"),
    "linear_kernels": (rf"^576x576, 1 rows +MKL reproducible .* {RATIO} .* {RATIO} ",
                       rf"^49152x576, 1 rows +oneDNN AVX2 .* {RATIO} .* {RATIO} +same bits$"),
    "mkl_branches": (r"^native \| 1 \| not compared \| [0-9.]+ \| [0-9.]+$",
                     r"^COMPATIBLE \+ aten default \| 1 \| not compared \| [0-9.]+ \| [0-9.]+$"),
    "natural_test": (rf"defaults \(portable numerics\) +per call {RATIO}, long prompt {RATIO}, "
                     rf"early-EOS prompt {RATIO}; whole pytest run {RATIO}$",
                     rf"CPU time: per call {RATIO}, long prompt {RATIO}, early-EOS prompt {RATIO}$",
                     r"model load, 1 alternating fresh loads each: plain [0-9.]+ s, plugin [0-9.]+ s"),
    "overhead": (rf"^  portable / native: bare {RATIO}, plugin ", r"^  peak RSS growth, +4 new tokens: "),
    "perturb_scales": (r"^ +0\.5( +\d+){4}$",),
    "portable_premium": (r"^  native .*\(1\.00x\)$", r"^  compatible .*\([0-9.]+x\)$",
                         r"^  portable .*\([0-9.]+x\)$"),
    "prompt_suite": (r"^  8 one-prompt tests: +[0-9.-]+ s$",
                     rf"^  JSONL suite \(batched\): .* speed-up -?{RATIO}$"),
    "sampling_cost": (rf"^sampled / greedy per token: {RATIO}$",),
    "score_cost": (rf"^score / forward \(plugin's kernels\): {RATIO} wall, {RATIO} CPU$",),
}
# Scripts that run llama.cpp: their smoke runs live in the engines tier (a .gguf of the tiny model).
LLAMACPP = ("engines",)


def scripts() -> list[str]:
    """Every script in benchmarks/, by name: a new one is run (and fails until it has a smoke form)."""
    return sorted(path.stem for path in BENCHMARKS.glob("*.py"))


def run_smoke(name: str, *args: str) -> str:
    """Run ``benchmarks/NAME.py --smoke`` in a child Python on this checkout; fail unless it exits 0 and
    prints every result line ``RESULT_LINES`` names for it. Its output, returned."""
    __tracebackhide__ = True
    if name not in RESULT_LINES:
        pytest.fail(f"benchmarks/{name}.py has no entry in RESULT_LINES (tests/helpers/benchmarks.py): give "
                    "it a --smoke form (one short round on builtin:tiny) and name the lines it prints there",
                    pytrace=False)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # this checkout's package
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), "--smoke", *args], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=600,
                          check=False)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        pytest.fail(f"benchmarks/{name}.py --smoke exited with {done.returncode}:\n{output[-4000:]}",
                    pytrace=False)
    missing = [line for line in RESULT_LINES[name] if not re.search(line, done.stdout, re.MULTILINE)]
    if missing:
        pytest.fail(f"benchmarks/{name}.py --smoke printed none of {missing}:\n{done.stdout[-4000:]}",
                    pytrace=False)
    return done.stdout

