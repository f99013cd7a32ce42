"""Goldens travel between CPUs: one short golden check re-run under emulated CPUs of another vendor
and instruction set (qemu-x86_64 user mode runs this very Python and torch, reporting another CPU).

Portable numerics must give the goldens recorded here bit for bit; native numerics must not (the
negative control that shows the check can fail). Emulation is slow, so the probe is one small test.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_llmdeterminism.compute import fixed_order, numerics
from tests.helpers import sessions
from tests.helpers.probes import ATTENTION_PROBE

QEMU = shutil.which("qemu-x86_64")
pytestmark = [
    pytest.mark.skipif(platform.machine() != "x86_64",
                       reason="qemu-x86_64 user mode emulates x86-64 hosts only"),
    pytest.mark.skipif(QEMU is None, reason="qemu-x86_64 is not installed: apt-get install qemu-user "
                                            "(.ci/run installs it)"),
]

PROBE = """
from pytest_llmdeterminism import deterministic

PROMPTS = ["The capital of France is", "Count: one,", "def add(a, b):"]

@deterministic(max_new_tokens=4)
def test_probe(llm_model, golden_tokens):
    for prompt, result in zip(PROMPTS, llm_model.generate(PROMPTS)):
        golden_tokens.check(result, name=prompt)
"""
# The plugin's seeded sampler (do_sample=True): its noise is integer arithmetic and one correctly
# rounded logarithm, so a sampled golden must travel between CPUs like a greedy one.
SAMPLED_PROBE = """

@deterministic(max_new_tokens=6, seed=11)
def test_sampled(llm_model, golden_tokens):
    sampled = llm_model.generate(PROMPTS, do_sample=True, temperature=1.3, top_p=0.95)
    for prompt, result in zip(PROMPTS, sampled):
        golden_tokens.check(result, name="sampled " + prompt)
"""


def _host_vendor() -> str:
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("vendor_id")), "")


def _foreign_cpus() -> tuple[str, str]:
    """Another vendor with AVX2, and an SSE4.2-only CPU (no AVX at all: another ISA than any current host)."""
    return ("Haswell" if _host_vendor() == "AuthenticAMD" else "EPYC"), "Nehalem"


def _environment() -> dict[str, str]:
    """This process pins portable numerics for itself; the runs below choose their own mode."""
    return {k: v for k, v in os.environ.items() if k not in numerics.PINNED_VARIABLES and k != "CI"}


def _pytest(project: Path, *args: str, cpu: str | None = None,
            threads: int | None = None) -> subprocess.Popen[str]:
    # no:hypothesispytest: its summary hook imports all of Hypothesis (about 8 s under emulation)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", *args]
    if cpu is not None:
        command = [str(QEMU), "-cpu", cpu, *command]
    env = _environment() if threads is None else {**_environment(), "OMP_NUM_THREADS": str(threads)}
    return subprocess.Popen(command, cwd=project, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def _finish(run: subprocess.Popen[str]) -> tuple[int, str]:
    output, _ = run.communicate(timeout=1500)
    lines = [line for line in output.splitlines() if not line.startswith("qemu-x86_64: warning")]
    return run.returncode, "\n".join(lines)


def _pytest_sessions(project: Path, *runs: tuple[str, ...], cpu: str) -> subprocess.Popen[str]:
    """pytest runs of ``project`` under ``cpu``, one after another in one emulated Python
    (tests/helpers/sessions.py), for runs whose numerics set the same variables before a product."""
    options = ["-p", "no:cacheprovider", "-p", "no:hypothesispytest"]
    command = sessions.command([str(QEMU), "-cpu", cpu, sys.executable],
                               [(project, [*options, *args]) for args in runs])
    return subprocess.Popen(command, cwd=project, env=_environment(), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def _finish_sessions(run: subprocess.Popen[str], count: int) -> list[tuple[int, str]]:
    """Each session's exit status and output, once the process ended."""
    code, output = _finish(run)
    assert code == 0, output[-4000:]
    outputs, codes = sessions.split(output)
    assert len(outputs) == count, output[-4000:]
    return list(zip(codes, outputs, strict=True))


# Score goldens (teacher-forced logprobs, one forward over prompt + continuation) travel between CPUs
# under portable numerics, bit for bit, like generation goldens.
SCORE_PROBE = """

PAIRS = [("The capital of France is", " Paris, a city of light."), ("def add(a, b):", "\\n    return a + b")]

@deterministic
def test_score(llm_model, golden_tokens):
    for (prompt, _), score in zip(PAIRS, llm_model.score(PAIRS)):
        golden_tokens.check(score, name=prompt)
"""


def test_portable_goldens_are_identical_under_other_cpus_and_native_ones_are_not(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\nllm_model = builtin:tiny\nllm_batch_shape = 4x32\n")
    (tmp_path / "test_probe.py").write_text(PROBE + SAMPLED_PROBE + SCORE_PROBE)
    # Native kernels are not even row-invariant on every CPU (measured: emulated Nehalem, 1 thread),
    # so the negative control runs one prompt per batch, at one thread.
    native = ("--llm-cpu-numerics=native", "--llm-golden-dir=native", "--llm-batch-shape=1x32")
    compatible = ("--llm-cpu-numerics=compatible", "--llm-golden-dir=compatible")
    for args, threads in ((("--llm-golden-update",), None), ((*compatible, "--llm-golden-update"), None),
                          ((*native, "--llm-golden-update"), 1)):
        code, output = _finish(_pytest(tmp_path, *args, threads=threads))
        assert code == 0 and "golden checks: 8 recorded" in output, output[-3000:]

    other_vendor, old_isa = _foreign_cpus()
    runs = {
        other_vendor: _pytest(tmp_path, cpu=other_vendor),
        f"native on {old_isa}": _pytest(tmp_path, *native, "--llm-tolerance=exact", cpu=old_isa, threads=1),
    }
    # One emulated Python (an emulated start fewer): portable, refused before its model loads and before
    # any product (the CPU capability it reads is DEFAULT, MKL's branch COMPATIBLE: compatible's too;
    # the run restores the variables it set), then compatible.
    refused_then_compatible = _pytest_sessions(tmp_path, (), compatible, cpu=old_isa)
    results = {name: _finish(run) for name, run in runs.items()}
    results[f"portable on {old_isa}"], results[old_isa] = _finish_sessions(refused_then_compatible, 2)

    # portable (AVX2 kernels) on another vendor's CPU; compatible (generic kernels) on one without AVX
    for cpu in (other_vendor, old_isa):
        code, output = results[cpu]
        assert code == 0, f"pinned goldens failed under -cpu {cpu}:\n{output[-4000:]}"
        assert "golden checks: 8 IDENTICAL" in output, output[-3000:]  # 3 greedy, 3 sampled, 2 scores
        assert "batch invariance: verified at 4x32" in output
        assert "compared across environments" not in output

    # Portable needs AVX2: a CPU without it is refused with the settings that work there.
    code, output = results[f"portable on {old_isa}"]
    assert code == 1, output[-3000:]
    assert "has no AVX2 and FMA" in output and "--llm-cpu-numerics=compatible" in output, output[-3000:]
    assert "llm: loaded" not in output, output[-3000:]  # refused before the model loads

    # Negative control: native kernels on an SSE4.2-only CPU give other bits than native ones here.
    code, output = results[f"native on {old_isa}"]
    assert code == 1, output[-3000:]
    assert any(f"{verdict} (failed)" in output for verdict in ("LOGIT_DRIFT", "REGRESSION", "TIE_FLIP"))
    assert "compared across environments:" in output and "cpu_capability" in output, output[-3000:]


def test_llamacpp_goldens_are_identical_under_another_vendors_cpu(tmp_path, smollm2_gguf):
    """The llama.cpp engine's greedy choice and top-5 must not depend on the CPU's SIMD dispatch
    (numpy's argpartition did: a REGRESSION at step 7 of the first prompt under an emulated Haswell)."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: "
                        "CMAKE_ARGS=-DGGML_NATIVE=OFF pip install -e '.[llamacpp]'")
    (tmp_path / "pytest.ini").write_text("[pytest]\nllm_model = "
                                         f"llamacpp:{smollm2_gguf}\nllm_batch_shape = 1x32\n")
    # That prompt alone, 8 steps: under emulation each prompt costs ~80 CPU s on an Intel host, and the
    # others add no kernel (one row each, the same model's products in the same llama.cpp build).
    probe = PROBE.replace("max_new_tokens=4", "max_new_tokens=8").replace(
        'PROMPTS = ["The capital of France is", "Count: one,", "def add(a, b):"]',
        'PROMPTS = ["The capital of France is"]')
    (tmp_path / "test_probe.py").write_text(probe)
    code, output = _finish(_pytest(tmp_path, "--llm-golden-update"))
    assert code == 0 and "golden checks: 1 recorded" in output, output[-3000:]
    other_vendor, _ = _foreign_cpus()
    code, output = _finish(_pytest(tmp_path, cpu=other_vendor))
    assert code == 0 and "golden checks: 1 IDENTICAL" in output, \
        f"under -cpu {other_vendor}:\n{output[-4000:]}"


LINEAR_PROBE = """
import json, sys
from pytest_llmdeterminism.compute import numerics, tensor_ops
# "portable,compatible": portable first, which a CPU without AVX2 refuses, then compatible in the same
# process. The refusal comes before any product: numerics.check reads the CPU capability, DEFAULT, and
# MKL's branch, COMPATIBLE, which are compatible's too, and the variables are restored before it pins.
*REFUSED, MODE = sys.argv[1].split(",")
for mode in REFUSED:
    replaced = numerics.pin(mode)
    try:
        print(json.dumps({"not refused": numerics.check(mode)}))
    except numerics.CPUNumericsError as error:
        print(json.dumps({"refused": str(error)}))
    numerics.unpin(replaced)
sys.argv[1] = MODE
numerics.pin(sys.argv[1])  # as the plugin does, before torch computes anything
import torch, xxhash
try:
    found = {"in force": numerics.check(sys.argv[1])["aten_capability"]}
except numerics.CPUNumericsError as error:
    print(json.dumps({"refused": str(error)}))
    raise SystemExit(0)
from pytest_llmdeterminism.compute import fixed_order
from pathlib import Path
KERNEL, why = fixed_order.build(Path(sys.argv[2]))
found["kernel"] = why if KERNEL is None else "built"
# the batch-invariant kernels of each mode: the prefill's, then the decode steps'
INVARIANT = {"portable": ("invariant_linear", "rows_linear", "onednn_rows_linear"),
             "compatible": ("tiled_linear", "rows_linear")}
for out_features, in_features in json.loads(sys.argv[3]):
    torch.manual_seed(out_features * 100003 + in_features)  # a shape's tensors whatever the others are
    weight, bias = torch.randn(out_features, in_features), torch.randn(out_features)
    name = f"{out_features}x{in_features}"
    for rows in (1, 7, 64):
        x = torch.randn(rows, in_features)
        if sys.argv[1] == "portable" and rows * in_features * out_features >= tensor_ops.ONEDNN_MIN_PRODUCT:
            y = tensor_ops.onednn_linear(x, weight, bias)
            # the fixed-order kernel for these products (compute/fixed_order.py): oneDNN's bits
            found[f"{name} x{rows} chain equal"] = torch.equal(KERNEL._run(x, weight, bias, rows, 2), y)
        else:  # MKL's reproducible branch, a one row product split over the threads
            y = torch.nn.functional.linear(x, weight, bias)
            found[f"{name} x{rows} split equal"] = rows > 1 or all(
                torch.equal(tensor_ops.split_linear(x, weight, bias, n), y) for n in (2, 4))
        found[f"{name} x{rows}"] = xxhash.xxh3_64_hexdigest(y.numpy().tobytes())
    if sys.argv[1] in INVARIANT:  # batch-invariant kernels: a row alone and among companions, 1-4 threads
        row, companions = torch.randn(1, in_features), torch.randn(63, in_features)
        for kernel in INVARIANT[sys.argv[1]]:
            compute = getattr(tensor_ops, kernel)
            # a decode step's lone row: split in two, or on the fixed-order kernel (companions: oneDNN)
            split = (2,) if kernel == "rows_linear" else (KERNEL,) if kernel == "onednn_rows_linear" else ()
            alone = {}
            for threads in (1, 2, 4):
                torch.set_num_threads(threads)
                alone[threads] = compute(row, weight, bias, *split)
                counts = (2, 7, 33, 64) if threads == 2 else (2, 33)  # emulation is slow: fewer at 1 and 4
                if sys.argv[4] == "emulated" and kernel == "onednn_rows_linear":
                    # each row its own one-row call on a row as aligned as the others (576 or 1536 float32
                    # features: whole 64-byte lines), so more companions add calls, not a path
                    counts = counts[:1]
                found[f"{name} {kernel} at {threads} threads: rows equal"] = all(
                    torch.equal(compute(torch.cat([companions[:rows - 1], row]), weight, bias)[-1],
                                alone[threads][0]) for rows in counts)
            torch.set_num_threads(2)
            found[f"{name} {kernel} threads equal"] = all(torch.equal(a, alone[2]) for a in alone.values())
            found[f"{name} {kernel}"] = xxhash.xxh3_64_hexdigest(alone[2].numpy().tobytes())
print(json.dumps(found))
"""
# the attention's tensors drawn from a seed of their own too: the same whatever the shapes before them
LINEAR_PROBE = LINEAR_PROBE.replace("print(json.dumps(found))",
                                    "torch.manual_seed(0)" + ATTENTION_PROBE + "print(json.dumps(found))")


# SmolLM2-135M's linears (query and output, key and value, gate and up, down; its head cut to 8192
# rows), and 1568x576, which takes the same branches as 8192x576 at a fifth of its multiply-adds.
SHAPES = ((576, 576), (192, 576), (1536, 576), (576, 1536), (8192, 576), (1568, 576))
# Under emulation (a few million multiply-adds a second) the host's shapes less two, whose every
# branch a kept shape takes. The dispatch reads a shape's size and divisibility alone: oneDNN or MKL by
# rows x in x out features against ONEDNN_MIN_PRODUCT (at one row: 576x576 and 192x576 below, the rest
# above), the decode step's oneDNN rows or MKL rows by the weight's size against it (the same split),
# a one-row split over 2 and 4 threads by the weight against MIN_WEIGHT_ELEMENTS and out features % 4
# (192x576 below, the rest split); the fixed-order kernel (chain_linear.c) by the input features
# against its 1024-feature block (576x1536: two blocks, the rest one), by its thread team's threshold,
# and by output blocks of 8 (one row, up to 8 rows), 16 (a lone row as a pair), 6 (AVX2, over 8 rows)
# and 12 (AVX-512, the host's): 8192x576 and 1568x576 end in a partial block of 6 and of 12 outputs,
# in none of 8, 16 or 32 (measured on the host: under compatible, MKL's tiles of 1544, 1552 or 2064
# out features change bits with the thread count, of 1568 or 8192 not), and hold full blocks of each. So
# 1568x576 takes every branch that 8192x576 and 1536x576 take; the host computes all six, and each
# emulated key is compared to the host's.
EMULATED_SHAPES = ((576, 576), (192, 576), (576, 1536), (1568, 576))


def test_linears_keep_their_bits_under_other_cpus(tmp_path):
    """Under portable numerics float32 linears run on oneDNN's AVX2 GEMM (smaller products on MKL's
    generic path), under compatible on MKL's generic path, one-row products there split over the
    threads (compute/kernels.py): each must give
    the same bits on every CPU its mode serves, and portable must refuse a CPU without AVX2. Under
    portable and compatible, the batch-invariant kernels too (compute/kernels.py): the
    prefill's (oneDNN, or MKL tiles) and the decode steps' (rows, on MKL or oneDNN), a row's bits
    alone and among 1, 6, 32 and 63 random companions at 2 threads (1 and 32 at 1 and 4 threads),
    the same bits at every thread count, and a left-padded row's attention as the row alone. The
    emulated runs compute the shapes and companions that take every branch (EMULATED_SHAPES; oneDNN's
    rows among one companion), the host all of them, and each emulated result must equal the host's."""
    script = tmp_path / "linear_probe.py"
    script.write_text(LINEAR_PROBE)
    kernels = tmp_path / "kernels"  # the fixed-order kernel, built once on the host for every run
    assert fixed_order.build(kernels)[0] is not None
    other_vendor, old_isa = _foreign_cpus()
    runs = {}
    # Under the CPU without AVX2 one process: portable, refused, then compatible (an emulated start fewer)
    for mode, cpus in (("portable", ("", other_vendor)), ("compatible", ("", old_isa))):
        env = {**_environment(), "OMP_NUM_THREADS": "2"}
        for cpu in cpus:
            modes = f"portable,{mode}" if cpu == old_isa else mode
            command = [*([str(QEMU), "-cpu", cpu] if cpu else []), sys.executable, str(script), modes,
                       str(kernels), *((json.dumps(EMULATED_SHAPES), "emulated") if cpu else
                                       (json.dumps(SHAPES), "host"))]
            runs[mode, cpu or "host"] = subprocess.Popen(command, env=env, text=True, stdout=subprocess.PIPE,
                                                         stderr=subprocess.STDOUT)
    found = {}
    for (mode, cpu), run in runs.items():
        code, output = _finish(run)
        assert code == 0, f"{mode} under -cpu {cpu}:\n{output[-3000:]}"
        found[mode, cpu] = json.loads(output.splitlines()[-1])
        if cpu == old_isa:  # the refusal's line comes first
            found["portable", cpu] = json.loads(next(line for line in output.splitlines() if line[:1] == "{"))
    assert "has no AVX2 and FMA" in found.pop(("portable", old_isa))["refused"]
    assert found["portable", "host"]["in force"] == "AVX2"
    # oneDNN's products: 4 shapes at one row (the 576x576 and 192x576 ones stay on MKL), 6 at 7 and 64
    assert sum(key.endswith("chain equal") for key in found["portable", "host"]) == 16
    assert found["compatible", "host"]["in force"] == "DEFAULT"
    host_only = {f"{out}x{into}" for out, into in SHAPES} - {f"{out}x{into}" for out, into in EMULATED_SHAPES}
    for (mode, cpu), values in found.items():
        equal = [v for k, v in values.items()
                 if k.endswith(("split equal", "rows equal", "threads equal", "chain equal"))]
        assert equal and all(equal), (mode, cpu, values)
        host = {k: v for k, v in found[mode, "host"].items()
                if cpu == "host" or k.split()[0] not in host_only}
        assert values == host, f"{mode} under -cpu {cpu} gives other bits than the host: {values} != {host}"
