"""Goldens travel between architectures: a small suite recorded natively on x86-64 is checked on
arm64, and one recorded on arm64 is checked natively, where arm64 is Debian's arm64 Python with
torch's arm64 CPU wheel run under qemu-aarch64 user mode (``scripts/arm64_root.sh`` prepares both
once into a cache folder; ``.ci/run`` calls it).

Across architectures the bits differ (another torch, another BLAS, other kernels): every check must
still pass as IDENTICAL or as cross-environment LOGIT_DRIFT, and a model with planted weight noise
must fail as REGRESSION in both directions (the negative control). Within arm64, portable goldens
must be identical under other emulated CPUs and forced OpenBLAS core types; native ones are judged
across environments when the core type changes, for the tiny model and for SmolLM2-135M, whose GEMMs
are large enough for native core types to change bits; the batch-invariant kernels give a row the
same bits whatever its companions, threads and CPU, so goldens do not depend on the batch shape.

Emulation is slow, and most of an emulated run is its start (~35 CPU s of imports): the one test
runs every check that shares an emulated CPU, a numerics mode and a core type in one process
(tests/helpers/sessions.py), five arm64 processes in all."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pytest_llmdeterminism
from pytest_llmdeterminism.compute import numerics
from pytest_llmdeterminism.engines.cached import cache_dir
from tests.helpers import sessions
from tests.helpers.models import dequantized_copy, perturbed_tiny_copy
from tests.helpers.probes import ATTENTION_PROBE

QEMU = shutil.which("qemu-aarch64")
ARM64 = Path(os.environ.get("LLMDET_ARM64_CACHE", cache_dir() / "arm64"))
SOURCE_TREE = Path(pytest_llmdeterminism.__file__).resolve().parent.parent
pytestmark = [
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the arm64 side runs under qemu-aarch64 on an "
                                                               "x86-64 host"),
    pytest.mark.skipif(QEMU is None, reason="qemu-aarch64 is not installed: apt-get install qemu-user "
                                            "(.ci/run installs it)"),
    pytest.mark.skipif(not (ARM64 / "READY").is_file(),
                       reason=f"no arm64 Python and torch in {ARM64}: run scripts/arm64_root.sh (.ci/run "
                              "does; it needs apt-get, dpkg and PyPI)"),
]

PROMPTS = ["The capital of France is", "Count: one,", "def add(a, b):", "The cat sat on the"]
PROBE = f"""
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=8)
def test_probe(llm_model, golden_tokens):
    for prompt, result in zip({PROMPTS!r}, llm_model.generate({PROMPTS!r})):
        golden_tokens.check(result, name=prompt)

# The plugin's seeded sampler: its draws do not depend on the architecture either.
@deterministic(max_new_tokens=8, seed=11)
def test_sampled(llm_model, golden_tokens):
    sampled = llm_model.generate({PROMPTS!r}, do_sample=True, temperature=1.3, top_p=0.95)
    for prompt, result in zip({PROMPTS!r}, sampled):
        golden_tokens.check(result, name="sampled " + prompt)
"""
# Every variable that portable numerics sets on either machine: each run starts without them.
PINNED = {"MKL_CBWR", "ATEN_CPU_CAPABILITY", "OPENBLAS_CORETYPE", "TORCH_MKLDNN_MATMUL_MIN_DIM",
          *numerics.PORTABLE_ENVIRONMENT}


class Run:
    """One pytest run of the probe project, natively or under qemu-aarch64, started now."""

    def __init__(self, project: Path, *args: str, arm64: bool = False, cpu: str | None = None,
                 env: dict[str, str] | None = None,
                 then: tuple[tuple[Path, tuple[str, ...]], ...] = ()) -> None:
        base = {k: v for k, v in os.environ.items() if k not in PINNED and k != "CI"}
        base = {**base, **(env or {})}
        options = ("-p", "no:cacheprovider", "-p", "no:xdist")
        if arm64:
            # The plugin comes from this source tree, not from an installed distribution.
            python = [str(QEMU), "-L", str(ARM64 / "ROOT"), *(["-cpu", cpu] if cpu else []),
                      str(ARM64 / "ROOT" / "usr" / "bin" / "python3.11")]
            # later sessions share the process (tests/helpers/sessions.py): ~20 s of imports under emulation
            plugin = ("-p", "pytest_llmdeterminism.plugin")
            command = sessions.command(python, [(path, [*options, *session, *plugin])
                                                for path, session in [(project, args), *then]])
            base["PYTHONPATH"] = os.pathsep.join([str(SOURCE_TREE), str(ARM64 / "SITE")])
            # An editable install leaves pytest_llmdeterminism.egg-info in the source tree, whose
            # entry point would register the plugin a second time, under its distribution's name.
            base["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        else:  # no:hypothesispytest: its summary hook imports all of Hypothesis (autoload is off on arm64)
            x86 = ("-p", "no:hypothesispytest")
            command = ([sys.executable, "-m", "pytest", *options, *args, *x86] if not then else
                       sessions.command([sys.executable], [(path, [*options, *session, *x86])
                                                           for path, session in [(project, args), *then]]))
        self.arm64 = arm64
        self.sessions = arm64 or bool(then)
        where = f" (arm64{', -cpu ' + cpu if cpu else ''})" if arm64 else " (x86-64)"
        self.names = [" ".join(args) + where,
                      *(" ".join(session) + where + " (after it)" for _, session in then)]
        self.started = time.monotonic()
        self.process = subprocess.Popen(command, cwd=project, env=base, text=True, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT)

    def finish(self, returncode: int) -> str:
        return self.finish_each(returncode)[0]

    def finish_each(self, *returncodes: int) -> list[str]:
        """Each session's output, once the process ended and each session's exit status is as given."""
        assert len(returncodes) == len(self.names)
        output, _ = self.process.communicate(timeout=1500)
        seconds = time.monotonic() - self.started
        print(f"{' + '.join(self.names)}: exit {self.process.returncode} in {seconds:.0f} s")
        if self.sessions:
            assert self.process.returncode == 0, f"{self.names[0]}:\n{output[-4000:]}"
            outputs, codes = sessions.split(output)
        else:
            outputs, codes = [output], [self.process.returncode]
        assert len(outputs) == len(self.names), f"{self.names[0]}:\n{output[-4000:]}"
        for name, text, code, expected in zip(self.names, outputs, codes, returncodes, strict=True):
            assert code == expected, f"{name}: exit {code}, not {expected}:\n{text[-4000:]}"
        return outputs


def summary(output: str) -> str:
    found = re.search(r"^golden checks: .*$", output, re.MULTILINE)
    assert found, output[-3000:]
    return found[0]


def across(output: str) -> str:
    found = re.search(r"compared across environments: .*$", output, re.MULTILINE)
    return found[0] if found else ""


def project(path: Path, model: str = "builtin:tiny", shape: str = "2x32", probe: str = PROBE,
            ini: str = "") -> Path:
    path.mkdir()
    (path / "pytest.ini").write_text(f"[pytest]\nllm_model = {model}\nllm_batch_shape = {shape}\n{ini}")
    (path / "test_probe.py").write_text(probe)
    return path


# One prompt, 4 tokens, one row: under emulation a SmolLM2 session takes under a minute, most of it the
# first kernels; a process's own start (torch's and transformers' imports) takes ~30 s more.
SMOLLM2_PROBE = """
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=4)
def test_capital(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The capital of France is"))
"""


KERNEL_PROBE = """
import json
from pytest_llmdeterminism.compute import numerics
numerics.pin("portable")  # as the plugin does, before torch computes anything
import torch, xxhash
from pytest_llmdeterminism.compute import tensor_ops
found = {}
torch.manual_seed(0)
# SmolLM2-135M's query and output, key and value, and down projections. Its gate and up (1536x576) take
# no other branch: on arm64 the tiles and the rows read no shape (only the rows % 32 of a tile), and
# OpenBLAS's threads share out a product's outputs, not the input features each output sums, which
# 576x576 has as many of and 576x1536 more.
for out_features, in_features in ((576, 576), (192, 576), (576, 1536)):
    weight, bias = torch.randn(out_features, in_features), torch.randn(out_features)
    row, companions = torch.randn(1, in_features), torch.randn(63, in_features)
    for kernel in ("tiled_linear", "rows_linear"):  # the prefill's and the decode steps' on OpenBLAS
        compute = getattr(tensor_ops, kernel)
        alone = {}
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            alone[threads] = compute(row, weight, bias)
            counts = (2, 7, 33, 64) if threads == 2 else (2, 33)  # one tile and two: fewer at 1 and 4
            found[f"{out_features}x{in_features} {kernel} at {threads} threads: rows equal"] = all(
                torch.equal(compute(torch.cat([companions[:rows - 1], row]), weight, bias)[-1],
                            alone[threads][0]) for rows in counts)
        found[f"{out_features}x{in_features} {kernel}: threads equal"] = all(
            torch.equal(a, alone[1]) for a in alone.values())
        found[f"{out_features}x{in_features} {kernel}"] = xxhash.xxh3_64_hexdigest(alone[1].numpy().tobytes())
print(json.dumps(found))
"""
KERNEL_PROBE = KERNEL_PROBE.replace("print(json.dumps(found))", ATTENTION_PROBE + "print(json.dumps(found))")


# The emulated CPUs and the OpenBLAS core types the user's environment names (portable numerics
# override them; native ones keep them). qemu's SVE CPUs (max, a64fx) run SmolLM2 3-5x slower;
# neoverse-n1 and cortex-a57 have none.
NEOVERSE, ARMV8 = {"OPENBLAS_CORETYPE": "NEOVERSEN1"}, {"OPENBLAS_CORETYPE": "ARMV8"}
CORTEX = {"OPENBLAS_CORETYPE": "CORTEXA57"}
UPDATE = ("--llm-golden-update",)
NATIVE = ("--llm-cpu-numerics=native", "--llm-golden-dir=native")

Session = tuple[Path, tuple[str, ...]]


def arm64(sessions: list[Session], cpu: str, env: dict[str, str]) -> Run:
    """One emulated arm64 process running ``sessions`` one after another."""
    (first, args), *then = sessions
    return Run(first, *args, arm64=True, cpu=cpu, env=env, then=tuple(then))


def exact_at(shape: str) -> tuple[str, ...]:
    return "--llm-batch-invariant=true", "--llm-tolerance=exact", f"--llm-batch-shape={shape}"


def smollm2_project(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    """SmolLM2-135M's project (its GEMMs are large enough for native core types to change bits), or
    None, saying why, where it was not fetched: the tiny model's checks run without it."""
    try:
        gguf = request.getfixturevalue("smollm2_gguf")
    except pytest.skip.Exception as skipped:
        print(f"SmolLM2's checks left out: {skipped}")
        return None
    # Dequantised here, natively: parsing the GGUF file under emulation would add about 3 min a run.
    model = dequantized_copy(gguf, tmp_path / "SmolLM2-135M-Instruct")
    # SmolLM2 on the previous kernels: on the batch-invariant ones (the default, which the tiny model
    # runs here) its emulated runs take minutes longer; those kernels' bits under two arm64 CPUs are
    # checked op by op by the kernel probe.
    return project(tmp_path / "smollm2", model=str(model), shape="1x16", probe=SMOLLM2_PROBE,
                   ini="llm_batch_invariant = false\n")


def kernel_projects(tmp_path: Path) -> tuple[Path, Path]:
    """Two folders whose one test runs the kernel probe (sessions.script_project), each writing what
    it printed to printed.txt."""
    script = tmp_path / "kernel_probe.py"
    script.write_text(KERNEL_PROBE)
    folders = tmp_path / "kernels-neoverse-n1", tmp_path / "kernels-cortex-a57"
    for folder in folders:
        sessions.script_project(folder, script)
    return folders


@pytest.mark.slow  # SmolLM2 under arm64 emulation, where it was fetched
def test_arm64_goldens_travel_ignore_the_cpu_and_core_type_and_do_not_depend_on_the_shape(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Goldens of the tiny model (and SmolLM2-135M where it was fetched) recorded on an emulated
    arm64 travel to x86-64 and back; portable ones read IDENTICAL under other arm64 CPUs and forced
    OpenBLAS core types, native ones are judged across environments when the core type changes; the
    batch-invariant kernels give a row's bits alone and among companions, at every thread count and
    under two CPUs, and goldens recorded at 2x32 read IDENTICAL at 1x32 and 4x32. Every run that
    shares an emulated CPU, a numerics mode and a core type shares one process (an arm64 start is
    ~35 CPU s): five processes in all."""
    tiny, x86 = project(tmp_path / "tiny"), project(tmp_path / "x86")
    changed = perturbed_tiny_copy(tmp_path / "changed", scale=0.5)
    smollm2 = smollm2_project(request, tmp_path)
    with_smollm2 = (lambda *args: [(smollm2, args)]) if smollm2 else (lambda *args: [])
    on_neoverse, on_cortex = kernel_projects(tmp_path)
    assert summary(Run(x86, *UPDATE).finish(0)) == "golden checks: 8 recorded"

    # neoverse-n1, portable: the records, the x86-64 goldens and the changed model, the other shapes
    # and the kernel probe, one after another; the native records beside it
    portable = arm64([(tiny, UPDATE), *with_smollm2(*UPDATE), (x86, ()), (x86, (f"--llm-model={changed}",)),
                      (tiny, exact_at("1x32")), (tiny, exact_at("4x32")), (on_neoverse, ())],
                     "neoverse-n1", NEOVERSE)
    native = arm64([(tiny, (*NATIVE, *UPDATE)), *with_smollm2(*NATIVE, *UPDATE)], "neoverse-n1", ARMV8)
    n = int(smollm2 is not None)  # SmolLM2's sessions: one in each process, or none
    outputs = portable.finish_each(*[0] * (1 + n), 0, 1, 0, 0, 0)
    (on_arm64, changed_on_arm64, *other_shapes, _) = outputs[1 + n:]
    records = ["golden checks: 8 recorded", *["golden checks: 1 recorded"] * n]  # tiny: 4 greedy, 4 sampled
    for recorded in outputs[:1 + n], native.finish_each(*[0] * (1 + n)):
        assert [summary(output) for output in recorded] == records, recorded[0][-3000:]

    # the arm64 goldens on x86-64, then under other arm64 CPUs and core types, each in a process of its own
    x86_checks = Run(tiny, then=((tiny, (f"--llm-model={changed}",)),))
    other_cpu = arm64([(tiny, ())], "a64fx", ARMV8)  # SVE-512, no BF16, another core type
    cortex = arm64([*with_smollm2("--llm-tolerance=exact"), (on_cortex, ())], "cortex-a57", CORTEX)
    other_core = arm64([(tiny, NATIVE), *with_smollm2(*NATIVE)], "neoverse-n1", NEOVERSE)
    on_x86, changed_on_x86 = x86_checks.finish_each(0, 1)
    travelled(on_arm64, on_x86, changed_on_arm64, changed_on_x86)

    *smollm2_exact, _ = cortex.finish_each(*[0] * (n + 1))
    identical = [(other_cpu.finish(0), 8), *((output, 1) for output in smollm2_exact)]
    for output, checks in identical:
        assert summary(output) == f"golden checks: {checks} IDENTICAL" and not across(output), output[-3000:]
    native_checked(*other_core.finish_each(*[0] * (1 + n)))
    shape_free(tiny, other_shapes, {"neoverse-n1": on_neoverse, "cortex-a57": on_cortex})


def travelled(on_arm64: str, on_x86: str, changed_on_arm64: str, changed_on_x86: str) -> None:
    """Across architectures the bits differ (another torch, another BLAS, other kernels): every check
    passes as IDENTICAL or as cross-environment LOGIT_DRIFT, and planted weight noise fails as a
    REGRESSION in both directions (the negative control)."""
    outputs = {"x86-64 goldens on arm64": on_arm64, "arm64 goldens on x86-64": on_x86}
    for direction, output in outputs.items():
        counts = {verdict: int(count) for count, verdict in re.findall(r"(\d+) ([A-Z_]+)", summary(output))}
        assert set(counts) <= {"IDENTICAL", "LOGIT_DRIFT"} and sum(counts.values()) == 8, \
            f"{direction}: {summary(output)}"
        print(f"{direction}: {summary(output)}; {across(output)}")
        # The summary names what changed: the machine, the BLAS and torch (2.9.1's arm64 CPU wheel).
        changes = across(output)
        assert ("machine 'x86_64' → 'aarch64'" in changes
                or "machine 'aarch64' → 'x86_64'" in changes), output[-3000:]
        assert "blas " in changes and "'openblas'" in changes and "'mkl'" in changes, changes
        assert "torch " in changes, changes
        assert "batch invariance: verified at 2x32" in output, output[-3000:]
    for output in (changed_on_arm64, changed_on_x86):
        assert "REGRESSION (failed)" in output, output[-3000:]
        assert "machine " in across(output), output[-3000:]


def native_checked(tiny_native: str, *smollm2_native: str) -> None:
    """Native goldens checked under another core type: the tiny model's GEMMs do not differ, so the
    tolerance passes them naming the change; SmolLM2's decode-step bits (not its tokens) change, and
    the check says why it tolerated them (the negative control of the portable checks)."""
    assert "blas_coretype 'ARMV8' → 'NEOVERSEN1'" in across(tiny_native), tiny_native[-3000:]
    for output in smollm2_native:
        print(f"SmolLM2 native, core type changed: {summary(output)}; {across(output)}")
        assert summary(output) == "golden checks: 1 LOGIT_DRIFT", output[-3000:]
        assert "blas_coretype 'ARMV8' → 'NEOVERSEN1'" in across(output), output[-3000:]


def shape_free(tiny: Path, other_shapes: list[str], kernels: dict[str, Path]) -> None:
    """On arm64 (OpenBLAS) the batch-invariant kernels are the tiles and the rows: per op, a row's bits
    alone and among 1, 6, 32 and 63 companions at 2 threads (1 and 32 at 1 and 4 threads), the same
    bits at every thread count and under both CPUs; end to end, the goldens recorded at 2x32 read
    IDENTICAL at 1x32 and 4x32 under --llm-tolerance=exact."""
    golden = (tiny / "__golden__" / "test_probe.json").read_text()
    assert '"batch_invariant": "cpu-openblas-armv8-tiles32-canonical-2"' in golden
    for output in other_shapes:
        assert summary(output) == "golden checks: 8 IDENTICAL", output[-3000:]
    found = {cpu: json.loads((folder / "printed.txt").read_text().splitlines()[-1])
             for cpu, folder in kernels.items()}
    for cpu, values in found.items():
        equal = [value for key, value in values.items() if key.endswith(("rows equal", "threads equal"))]
        assert len(equal) == 3 * 2 * 4 + 3 + 1 and all(equal), (cpu, values)
    assert found["neoverse-n1"] == found["cortex-a57"]
