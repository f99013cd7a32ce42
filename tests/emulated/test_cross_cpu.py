"""Goldens travel between CPUs: short golden checks re-run under emulated CPUs of another vendor
and instruction set (qemu-x86_64 user mode runs this very Python and torch, reporting another CPU),
and a probe of the linears' kernels whose bits must equal the host's there.

Portable numerics must give the goldens recorded here bit for bit, compatible ones too on a CPU
without AVX2 (where portable is refused); native numerics must not (the negative control that shows
the check can fail). Emulation is slow, and most of an emulated run is its start (importing torch and
transformers: ~30 CPU s under -cpu EPYC), so the runs that share a CPU and a numerics mode share one
Python, as pytest sessions one after another (tests/helpers/sessions.py), the linear probe last as a
session of its own (sessions.script_project): one process under each emulated CPU and mode, the
host's likewise.

Long: one test, with the probe scripts it runs and why their shapes suffice beside the assertions.
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


Session = tuple[Path, tuple[str, ...]]  # a project folder and the pytest arguments it runs with
Started = tuple[subprocess.Popen[str], list[str]]  # a process running sessions, and their names


def _start_sessions(named: dict[str, Session], *, cpu: str | None = None) -> Started:
    """pytest runs of the ``named`` projects, in order, under ``cpu`` (else natively) in one Python
    (tests/helpers/sessions.py), for runs whose numerics set the same variables before a product;
    with the runs' names, in order."""
    options = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")
    python = [*([str(QEMU), "-cpu", cpu] if cpu else []), sys.executable]
    command = sessions.command(python, [(project, [*options, *args]) for project, args in named.values()])
    first_project = next(iter(named.values()))[0]
    run = subprocess.Popen(command, cwd=first_project, env=_environment(), text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
    return run, list(named)


def _finish_sessions(started: Started) -> dict[str, tuple[int, str]]:
    """Each session's exit status and output by its name, once the process ended."""
    run, names = started
    code, output = _finish(run)
    assert code == 0, output[-4000:]
    outputs, codes = sessions.split(output)
    assert len(outputs) == len(names), output[-4000:]
    return {name: (code, output) for name, code, output in zip(names, codes, outputs, strict=True)}


# Score goldens (teacher-forced logprobs, one forward over prompt + continuation) travel between CPUs
# under portable numerics, bit for bit, like generation goldens.
SCORE_PROBE = """

PAIRS = [("The capital of France is", " Paris, a city of light."), ("def add(a, b):", "\\n    return a + b")]

@deterministic
def test_score(llm_model, golden_tokens):
    for (prompt, _), score in zip(PAIRS, llm_model.score(PAIRS)):
        golden_tokens.check(score, name=prompt)
"""


LINEAR_PROBE = """
import json, sys
from pytest_llmdeterminism.compute import numerics, tensor_ops
# "portable,compatible": portable first, which a CPU without AVX2 refuses, then compatible in the same
# process. The refusal changes no kernel: numerics.check reads the CPU capability, DEFAULT, and MKL's
# branch, COMPATIBLE, which are compatible's too, and the variables are restored before it pins.
*REFUSED, MODE = sys.argv[1].split(",")
for mode in REFUSED:
    replaced = numerics.pin(mode)
    try:
        print(json.dumps({"not refused": numerics.check(mode)}))
    except numerics.CPUNumericsError as error:
        print(json.dumps({"refused": str(error)}))
    numerics.unpin(replaced)
sys.argv[1] = MODE
# As the plugin does. Torch computed before, in this process's goldens sessions of the same mode, which
# pinned it first; check reads what is in force.
numerics.pin(sys.argv[1])
import torch, xxhash
torch.set_num_threads(2)  # whatever count the process runs at: the products below at 2 threads
try:
    found = {"in force": numerics.check(sys.argv[1])["aten_capability"]}
except numerics.CPUNumericsError as error:
    print(json.dumps({"refused": str(error)}))
    raise SystemExit(0)
from pytest_llmdeterminism.compute import fixed_order
from pathlib import Path
KERNEL, why = fixed_order.build(Path(sys.argv[2]))
found["kernel"] = why if KERNEL is None else "built"
# the batch-invariant kernels of each mode: portable's in both phases; compatible's prefill, then decode
INVARIANT = {"portable": ("invariant_linear",), "compatible": ("tiled_linear", "rows_linear")}
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
            # a decode step's lone row: split in two, or two rows on the fixed-order kernel where built
            split = (2,) if kernel == "rows_linear" else (KERNEL,) if kernel == "invariant_linear" else ()
            alone = {}
            for threads in (1, 2, 4):
                torch.set_num_threads(threads)
                alone[threads] = compute(row, weight, bias, *split)
                # one tile and two (32 rows; the fixed-order kernel's blocks: up to 8 rows, and over 8);
                # the host also where in a tile or block the row falls, at 2 threads
                counts = (2, 7, 33, 64) if threads == 2 and sys.argv[4] == "host" else (2, 33)
                found[f"{name} {kernel} at {threads} threads: rows equal"] = all(
                    torch.equal(compute(torch.cat([companions[:rows - 1], row]), weight, bias)[-1],
                                alone[threads][0]) for rows in counts)
            torch.set_num_threads(2)
            found[f"{name} {kernel} threads equal"] = all(torch.equal(a, alone[2]) for a in alone.values())
            found[f"{name} {kernel}"] = xxhash.xxh3_64_hexdigest(alone[2].numpy().tobytes())
print(json.dumps(found))
"""
# The top-k and logprobs the plugin takes of a raw logits row (llama.cpp's, engines/capture.py): numpy
# picks its SIMD kernels per CPU, and np.argpartition's gave another top-5 for 50 of 300 random rows
# under an emulated Haswell. 100 rows of SmolLM2's vocabulary size, their hashes, ids and logprobs,
# where llama.cpp's goldens travel: between AVX2 CPUs (without AVX2 numpy's float32 exp, and with it
# the logprobs, gives other bits: measured under -cpu Nehalem; llama.cpp's own kernels differ there too).
TOP_K_PROBE = """
import numpy as np
from pytest_llmdeterminism.engines.capture import logits_step
rows = np.random.default_rng(0).standard_normal((100, 49152), dtype=np.float32) * 4
if sys.argv[1] == "portable":
    steps = json.dumps([logits_step(row, 0) for row in rows])
    found["top-k of 100 rows"] = xxhash.xxh3_64_hexdigest(steps.encode())
"""
# the attention's tensors drawn from a seed of their own too: the same whatever the shapes before them
LINEAR_PROBE = LINEAR_PROBE.replace("print(json.dumps(found))", "torch.manual_seed(0)" + ATTENTION_PROBE
                                    + TOP_K_PROBE + "print(json.dumps(found))")


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


# pytest arguments of the goldens' runs: each mode records into its own folder of the tiny project.
# Native kernels are not even row-invariant on every CPU (measured: emulated Nehalem, 1 thread), so
# the negative control runs one prompt per batch, at one thread.
NATIVE = ("--llm-cpu-numerics=native", "--llm-golden-dir=native", "--llm-batch-shape=1x32")
COMPATIBLE = ("--llm-cpu-numerics=compatible", "--llm-golden-dir=compatible")
UPDATE = ("--llm-golden-update",)


def _tiny_project(tmp_path: Path) -> Path:
    project = tmp_path / "tiny"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\nllm_model = builtin:tiny\nllm_batch_shape = 4x32\n")
    (project / "test_probe.py").write_text(PROBE + SAMPLED_PROBE + SCORE_PROBE)
    return project


def _llamacpp_project(tmp_path: Path, request: pytest.FixtureRequest) -> Path | None:
    """The llama.cpp engine's project on SmolLM2-135M, or None, saying why, where llama-cpp-python or
    the model is missing: the rest of the test runs without it.

    Its goldens must not depend on the CPU's SIMD dispatch: llama.cpp's quantised products (the
    prompt's batched ones and a decode step's) and the plugin's top-k and logprobs over its raw logits
    (numpy's argpartition did: a REGRESSION at step 7 of the first prompt under an emulated Haswell;
    the linear probe checks that selection on 100 random rows, TOP_K_PROBE)."""
    try:
        pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: "
                            "CMAKE_ARGS=-DGGML_NATIVE=OFF pip install -e '.[llamacpp]'")
        gguf = request.getfixturevalue("smollm2_gguf")
    except pytest.skip.Exception as missing:
        print(f"the llama.cpp engine's goldens are left out: {missing.msg}")
        return None
    project = tmp_path / "llamacpp"
    project.mkdir()
    (project / "pytest.ini").write_text(f"[pytest]\nllm_model = llamacpp:{gguf}\nllm_batch_shape = 1x32\n")
    # That prompt alone, 2 steps (the prompt's evaluation, then one token's): under -cpu EPYC on an Intel
    # host its evaluation takes ~27 CPU s and each token's ~7; more steps or prompts add no kernel (one
    # row each, the same model's products in the same llama.cpp build).
    probe = PROBE.replace("max_new_tokens=4", "max_new_tokens=2").replace(
        'PROMPTS = ["The capital of France is", "Count: one,", "def add(a, b):"]',
        'PROMPTS = ["The capital of France is"]')
    (project / "test_probe.py").write_text(probe)
    return project


def _linear_sessions(tmp_path: Path, other_vendor: str, old_isa: str) -> dict[tuple[str, str], Session]:
    """A session per (mode, CPU) whose one test runs the linear probe there (sessions.script_project);
    what it printed lands in ``printed.txt`` in its project folder."""
    script = tmp_path / "linear_probe.py"
    script.write_text(LINEAR_PROBE)
    kernels = tmp_path / "kernels"  # the fixed-order kernel, built once on the host for every run
    assert fixed_order.build(kernels)[0] is not None
    # under the CPU without AVX2, portable first, refused, then compatible
    runs = {("portable", "host"): "portable", ("compatible", "host"): "compatible",
            ("portable", other_vendor): "portable", ("compatible", old_isa): "portable,compatible"}
    folders: dict[tuple[str, str], Session] = {}
    for (mode, cpu), modes in runs.items():
        shapes, where = (SHAPES, "host") if cpu == "host" else (EMULATED_SHAPES, "emulated")
        folder = tmp_path / f"linears-{mode}-{cpu}"
        sessions.script_project(folder, script, modes, str(kernels), json.dumps(shapes), where)
        folders[mode, cpu] = folder, ()
    return folders


def test_goldens_and_linears_keep_their_bits_under_other_cpus_and_native_ones_do_not(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Goldens recorded here (the tiny model's greedy, sampled and score checks; the llama.cpp
    engine's where it is installed) read IDENTICAL under another vendor's emulated CPU in portable
    numerics, and under one without AVX in compatible numerics, where portable is refused; native
    ones there give other bits (the negative control). The linears keep their bits under both CPUs
    (_assert_linears says which)."""
    tiny, llamacpp = _tiny_project(tmp_path), _llamacpp_project(tmp_path, request)
    other_vendor, old_isa = _foreign_cpus()
    linears = _linear_sessions(tmp_path, other_vendor, old_isa)
    llamacpp_record = {"llama.cpp record": (llamacpp, UPDATE)} if llamacpp else {}
    # The host records the goldens, one process per mode, each mode's linear probe last in it.
    host = [_start_sessions({"portable record": (tiny, UPDATE), **llamacpp_record,
                             "linears portable on host": linears["portable", "host"]}),
            _start_sessions({"compatible record": (tiny, (*COMPATIBLE, *UPDATE)),
                             "linears compatible on host": linears["compatible", "host"]})]
    results = {"native record": _finish(_pytest(tiny, *NATIVE, *UPDATE, threads=1))}
    for started in host:
        results.update(_finish_sessions(started))
    for name in ("portable record", "compatible record", "native record", *llamacpp_record):
        code, output = results[name]
        assert code == 0 and f"golden checks: {1 if name == 'llama.cpp record' else 8} recorded" in output, \
            f"{name}:\n{output[-3000:]}"

    # Under emulation one process per CPU and mode; native numerics at one thread in one of its own.
    llamacpp_check = {f"llama.cpp on {other_vendor}": (llamacpp, ())} if llamacpp else {}
    emulated = [
        _start_sessions({other_vendor: (tiny, ()), **llamacpp_check,
                         f"linears portable on {other_vendor}": linears["portable", other_vendor]},
                        cpu=other_vendor),
        # Portable first, refused before its model loads and before any product (the CPU capability it
        # reads is DEFAULT, MKL's branch COMPATIBLE: compatible's too; the run restores the variables
        # it set), then compatible, then the linear probe of both.
        _start_sessions({f"portable on {old_isa}": (tiny, ()), old_isa: (tiny, COMPATIBLE),
                         f"linears compatible on {old_isa}": linears["compatible", old_isa]},
                        cpu=old_isa)]
    # the greedy checks alone: other bits there need no more (and each prompt is a batch of its own)
    native = _pytest(tiny, *NATIVE, "--llm-tolerance=exact", "-k", "test_probe", cpu=old_isa, threads=1)
    for started in emulated:
        results.update(_finish_sessions(started))
    results[f"native on {old_isa}"] = _finish(native)
    _assert_goldens(results, other_vendor, old_isa)
    if llamacpp_check:
        code, output = results[f"llama.cpp on {other_vendor}"]
        assert code == 0 and "golden checks: 1 IDENTICAL" in output, \
            f"under -cpu {other_vendor}:\n{output[-4000:]}"
    _assert_linears(results, linears, old_isa)


def _assert_goldens(results: dict[str, tuple[int, str]], other_vendor: str, old_isa: str) -> None:
    """The tiny model's goldens: IDENTICAL under both CPUs, portable refused without AVX2, native
    numerics other bits without it."""
    __tracebackhide__ = True
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


def _assert_linears(results: dict[str, tuple[int, str]], linears: dict[tuple[str, str], Session],
                    old_isa: str) -> None:
    """Under portable numerics float32 linears run on oneDNN's AVX2 GEMM (smaller products on MKL's
    generic path), under compatible on MKL's generic path, one-row products there split over the
    threads (compute/kernels.py): each must give
    the same bits on every CPU its mode serves, and portable must refuse a CPU without AVX2. Under
    portable and compatible, the batch-invariant kernels too (compute/kernels.py): the
    prefill's (oneDNN, or MKL tiles) and the decode steps' (rows, on MKL or oneDNN), a row's bits
    alone and among 1, 6, 32 and 63 random companions at 2 threads (1 and 32 at 1 and 4 threads),
    the same bits at every thread count, and a left-padded row's attention as the row alone. The
    emulated runs compute the shapes and companions that take every branch (EMULATED_SHAPES; 1 and 32
    companions at every thread count, oneDNN's rows among one), the host all of them, and each
    emulated result must equal the host's; under portable the plugin's top-k and logprobs of raw
    logits rows too (TOP_K_PROBE)."""
    __tracebackhide__ = True
    found = {}
    for (mode, cpu), (folder, _) in linears.items():
        code, output = results[f"linears {mode} on {cpu}"]
        assert code == 0, f"{mode} under -cpu {cpu}:\n{output[-3000:]}"
        printed = (folder / "printed.txt").read_text().splitlines()
        found[mode, cpu] = json.loads(printed[-1])
        if cpu == old_isa:  # the refusal's line comes first
            found["portable", cpu] = json.loads(next(line for line in printed if line[:1] == "{"))
    assert "has no AVX2 and FMA" in found.pop(("portable", old_isa))["refused"]
    assert found["portable", "host"]["in force"] == "AVX2"
    # oneDNN's products: 4 shapes at one row (the 576x576 and 192x576 ones stay on MKL), 6 at 7 and 64
    assert sum(key.endswith("chain equal") for key in found["portable", "host"]) == 16
    assert found["compatible", "host"]["in force"] == "DEFAULT"
    assert "top-k of 100 rows" in found["portable", "host"]  # llama.cpp's top-k and logprobs, TOP_K_PROBE
    host_only = {f"{out}x{into}" for out, into in SHAPES} - {f"{out}x{into}" for out, into in EMULATED_SHAPES}
    for (mode, cpu), values in found.items():
        equal = [v for k, v in values.items()
                 if k.endswith(("split equal", "rows equal", "threads equal", "chain equal"))]
        assert equal and all(equal), (mode, cpu, values)
        host = {k: v for k, v in found[mode, "host"].items()
                if cpu == "host" or k.split()[0] not in host_only}
        assert values == host, f"{mode} under -cpu {cpu} gives other bits than the host: {values} != {host}"
