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

from pytest_llmdeterminism.engines import numerics

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


def _host_vendor() -> str:
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("vendor_id")), "")


def _foreign_cpus() -> tuple[str, str]:
    """Another vendor with AVX2, and an SSE4.2-only CPU (no AVX at all: another ISA than any current host)."""
    return ("Haswell" if _host_vendor() == "AuthenticAMD" else "EPYC"), "Nehalem"


def _environment() -> dict[str, str]:
    """This process pins portable numerics for itself; the runs below choose their own mode."""
    env = {k: v for k, v in os.environ.items() if k not in numerics.PORTABLE_ENVIRONMENT and k != "CI"}
    return {**env, "PYTHONDONTWRITEBYTECODE": "1"}


def _pytest(project: Path, *args: str, cpu: str | None = None,
            threads: int | None = None) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    if cpu is not None:
        command = [str(QEMU), "-cpu", cpu, *command]
    env = _environment() if threads is None else {**_environment(), "OMP_NUM_THREADS": str(threads)}
    return subprocess.Popen(command, cwd=project, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def _finish(run: subprocess.Popen[str]) -> tuple[int, str]:
    output, _ = run.communicate(timeout=1500)
    lines = [line for line in output.splitlines() if not line.startswith("qemu-x86_64: warning")]
    return run.returncode, "\n".join(lines)


def test_portable_goldens_are_identical_under_other_cpus_and_native_ones_are_not(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\nllm_model = builtin:tiny\nllm_batch_shape = 4x32\n")
    (tmp_path / "test_probe.py").write_text(PROBE)
    # Native kernels are not even row-invariant on every CPU (measured: emulated Nehalem, 1 thread),
    # so the negative control runs one prompt per batch, at one thread.
    native = ("--llm-cpu-numerics=native", "--llm-golden-dir=native", "--llm-batch-shape=1x32")
    for args, threads in ((("--llm-golden-update",), None), ((*native, "--llm-golden-update"), 1)):
        code, output = _finish(_pytest(tmp_path, *args, threads=threads))
        assert code == 0 and "golden checks: 3 recorded" in output, output[-3000:]

    other_vendor, old_isa = _foreign_cpus()
    runs = {
        other_vendor: _pytest(tmp_path, cpu=other_vendor),
        old_isa: _pytest(tmp_path, cpu=old_isa),
        f"native on {old_isa}": _pytest(tmp_path, *native, "--llm-tolerance=exact", cpu=old_isa, threads=1),
    }
    results = {name: _finish(run) for name, run in runs.items()}

    for cpu in (other_vendor, old_isa):
        code, output = results[cpu]
        assert code == 0, f"portable goldens failed under -cpu {cpu}:\n{output[-4000:]}"
        assert "golden checks: 3 IDENTICAL" in output, output[-3000:]
        assert "batch invariance: verified at 4x32" in output
        assert "compared across environments" not in output

    # Negative control: native kernels on an SSE4.2-only CPU give other bits than native ones here.
    code, output = results[f"native on {old_isa}"]
    assert code == 1, output[-3000:]
    assert any(f"{verdict} (failed)" in output for verdict in ("LOGIT_DRIFT", "REGRESSION", "TIE_FLIP"))
    assert "compared across environments:" in output and "cpu_capability" in output, output[-3000:]


def test_llamacpp_goldens_are_identical_under_another_vendors_cpu(tmp_path, smollm2_gguf):
    """The llama.cpp engine's greedy choice and top-5 must not depend on the CPU's SIMD dispatch
    (numpy's argpartition did: a REGRESSION at step 7 of the first prompt under an emulated Haswell)."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: pip install -e '.[llamacpp]'")
    (tmp_path / "pytest.ini").write_text("[pytest]\nllm_model = "
                                         f"llamacpp:{smollm2_gguf}\nllm_batch_shape = 1x32\n")
    (tmp_path / "test_probe.py").write_text(PROBE.replace("max_new_tokens=4", "max_new_tokens=8"))
    code, output = _finish(_pytest(tmp_path, "--llm-golden-update"))
    assert code == 0 and "golden checks: 3 recorded" in output, output[-3000:]
    other_vendor, _ = _foreign_cpus()
    code, output = _finish(_pytest(tmp_path, cpu=other_vendor))
    assert code == 0 and "golden checks: 3 IDENTICAL" in output, \
        f"under -cpu {other_vendor}:\n{output[-4000:]}"


SPLIT_PROBE = """
import json, torch, xxhash
from pytest_llmdeterminism.engines import gemv, numerics
torch.manual_seed(0)
found = {"mkl_cbwr": numerics.effective()["mkl_cbwr"]}
for out_features, in_features in ((576, 576), (1536, 576), (576, 1536), (8192, 576)):
    weight, bias = torch.randn(out_features, in_features), torch.randn(out_features)
    x = torch.randn(1, in_features)
    linear = torch.nn.functional.linear(x, weight, bias)
    name = f"{out_features}x{in_features}"
    found[name] = xxhash.xxh3_64_hexdigest(linear.numpy().tobytes())
    splits = [gemv.split_linear(x, weight, bias, n) for n in (2, 4)]
    found[name + " split equal"] = all(torch.equal(split, linear) for split in splits)
print(json.dumps(found))
"""


def test_split_one_row_products_keep_linears_bits_under_other_cpus(tmp_path):
    """The plugin splits a batch-1 decode step's products over the threads (engines/gemv.py): under
    portable numerics that must give F.linear's bits on every CPU, as F.linear's own are."""
    script = tmp_path / "split_probe.py"
    script.write_text(SPLIT_PROBE)
    env = {**_environment(), **numerics.PORTABLE_ENVIRONMENT, "OMP_NUM_THREADS": "2"}
    runs = {cpu: subprocess.Popen([*([str(QEMU), "-cpu", cpu] if cpu else []), sys.executable, str(script)],
                                  env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for cpu in ("", *_foreign_cpus())}
    found = {}
    for cpu, run in runs.items():
        code, output = _finish(run)
        assert code == 0, f"under -cpu {cpu or 'host'}:\n{output[-3000:]}"
        found[cpu or "host"] = json.loads(output.splitlines()[-1])
    host = found["host"]
    assert host["mkl_cbwr"] == numerics.MKL_REPRODUCIBLE_BRANCH
    for cpu, values in found.items():
        assert all(v for k, v in values.items() if k.endswith("split equal")), (cpu, values)
        assert values == host, f"-cpu {cpu} gives other bits than the host: {values} != {host}"
