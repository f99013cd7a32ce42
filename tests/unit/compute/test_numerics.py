"""CPU numerics mode, the batch-invariance probe, and the environment-aware default tolerance."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from pytest_llmdeterminism import BatchInvarianceProbeError, engines
from pytest_llmdeterminism.compute import numerics
from pytest_llmdeterminism.engines import hf
from pytest_llmdeterminism.judge.fingerprint import numerics_changes

PORTABLE_CPU = {"device_class": "cpu", "machine": "x86_64", "dtype": "float32", "torch": "2.13.0",
                "transformers": "5.24.0", "attention_implementation": "sdpa", "cpu_numerics": "portable",
                "device_name": "AMD EPYC", "cpu_capability": "AVX2", "mkl_cbwr": "COMPATIBLE",
                "torch_threads": 2}


def test_this_test_run_is_itself_pinned_to_portable_numerics():
    found = numerics.effective()
    assert found["aten_capability"] == ("AVX2" if platform.machine() == "x86_64" else "DEFAULT")
    assert found["mkl_cbwr"] in ("COMPATIBLE", None)  # None: a torch without MKL
    assert found["blas"] == "mkl" if found["mkl_cbwr"] else found["blas_coretype"] in ("ARMV8", None)
    pinned = {name: os.environ[name] for name in numerics.PORTABLE_ENVIRONMENT}
    assert pinned == dict(numerics.PORTABLE_ENVIRONMENT)


def test_portable_goldens_ignore_the_cpu_model_but_not_threads_software_or_mode():
    other_cpu = {**PORTABLE_CPU, "device_name": "Intel(R) Xeon(R) Platinum 8488C"}
    assert numerics_changes(PORTABLE_CPU, other_cpu) == []
    # MKL's portable branch is documented for a fixed thread count only (measured: 3 and 6 differ).
    assert numerics_changes(PORTABLE_CPU, {**other_cpu, "torch_threads": 8}) == [("torch_threads", 2, 8)]
    upgraded = {**PORTABLE_CPU, "torch": "2.14.0"}
    assert numerics_changes(PORTABLE_CPU, upgraded) == [("torch", "2.13.0", "2.14.0")]
    arm = {**PORTABLE_CPU, "machine": "aarch64"}
    assert numerics_changes(PORTABLE_CPU, arm) == [("machine", "x86_64", "aarch64")]
    native = {**PORTABLE_CPU, "cpu_numerics": "native", "cpu_capability": "AVX512", "mkl_cbwr": "OFF"}
    assert [name for name, _, _ in numerics_changes(native, PORTABLE_CPU)] == [
        "cpu_numerics", "cpu_capability", "mkl_cbwr"]
    # Portable asked for, but nothing pinned in force (a torch without MKL): judged as CPU-specific.
    no_mkl = {**PORTABLE_CPU, "mkl_cbwr": None}
    assert [c[0] for c in numerics_changes(no_mkl, {**no_mkl, "device_name": "Graviton3"})] == ["device_name"]


def test_native_goldens_depend_on_cpu_and_threads_gpu_goldens_on_device_and_driver():
    native = {**PORTABLE_CPU, "cpu_numerics": "native", "cpu_capability": "AVX512", "mkl_cbwr": "OFF"}
    assert numerics_changes(native, {**native, "torch_threads": 1}) == [("torch_threads", 2, 1)]
    elsewhere = {**native, "device_name": "Intel Xeon"}
    assert [c[0] for c in numerics_changes(native, elsewhere)] == ["device_name"]
    gpu = {**PORTABLE_CPU, "device_class": "cuda", "device_name": "NVIDIA H200", "compute_capability": "9.0",
           "cuda": "12.8", "cudnn": 91002, "cuda_driver": "13.0"}
    assert numerics_changes(gpu, {**gpu, "torch_threads": 64, "cpu_capability": "AVX2"}) == []
    assert numerics_changes(gpu, {**gpu, "cuda_driver": "13.1"}) == [("cuda_driver", "13.0", "13.1")]


PORTABLE_ARM64 = {**PORTABLE_CPU, "machine": "aarch64", "torch": "2.9.1", "device_name": "aarch64",
                  "cpu_capability": "DEFAULT", "mkl_cbwr": None, "blas": "openblas", "blas_coretype": "ARMV8"}


def test_arm64_portable_goldens_ignore_the_core_type_native_ones_do_not():
    assert numerics_changes(PORTABLE_ARM64, {**PORTABLE_ARM64, "device_name": "Neoverse-N1"}) == []
    native = {**PORTABLE_ARM64, "cpu_numerics": "native"}
    assert numerics_changes(native, {**native, "blas_coretype": "NEOVERSEN1"}) == [
        ("blas_coretype", "ARMV8", "NEOVERSEN1")]
    # Portable asked for but OpenBLAS not on its generic kernels (torch loaded too early): CPU-specific.
    unpinned = {**PORTABLE_ARM64, "blas_coretype": "NEOVERSEN1"}
    elsewhere = {**unpinned, "device_name": "Graviton3"}
    assert [c[0] for c in numerics_changes(unpinned, elsewhere)] == ["device_name"]


def test_x86_and_arm64_portable_goldens_differ_by_machine_torch_and_blas():
    x86 = {**PORTABLE_CPU, "blas": "mkl", "blas_coretype": None}
    assert numerics_changes(x86, PORTABLE_ARM64) == [
        ("machine", "x86_64", "aarch64"), ("torch", "2.13.0", "2.9.1"), ("cpu_capability", "AVX2", "DEFAULT"),
        ("blas", "mkl", "openblas")]


def test_goldens_recorded_as_portable_before_its_avx2_kernels_are_compatible_ones():
    """Before portable moved to ATen's AVX2 kernels and oneDNN's AVX2 GEMM, it pinned the generic
    kernels compatible pins now: such a golden compares exactly under compatible, and under today's
    portable it is another environment, named by the fields that changed."""
    before = {**PORTABLE_CPU, "cpu_capability": "DEFAULT"}
    compatible = {**before, "cpu_numerics": "compatible", "device_name": "Intel Xeon"}
    assert numerics_changes(before, compatible) == []
    assert numerics_changes(compatible, before) == []
    assert numerics_changes(before, PORTABLE_CPU) == [("cpu_numerics", "compatible", "portable"),
                                                      ("cpu_capability", "DEFAULT", "AVX2")]
    # a portable run on a CPU without AVX2 is refused at load; were it recorded, it would not count as pinned
    assert [c[0] for c in numerics_changes({**PORTABLE_CPU, "cpu_capability": "DEFAULT", "mkl_cbwr": "OFF"},
                                           {**PORTABLE_CPU, "device_name": "Intel Xeon"})] == [
        "device_name", "cpu_capability", "mkl_cbwr"]
    # arm64 has one pinned profile under both names
    assert numerics_changes(PORTABLE_ARM64, {**PORTABLE_ARM64, "cpu_numerics": "compatible"}) == []


def test_goldens_recorded_before_the_blas_fields_still_match_an_mkl_torch():
    """Committed goldens predate ``blas``: their recorded MKL branch says the BLAS was MKL."""
    current = {**PORTABLE_CPU, "blas": "mkl", "blas_coretype": None}
    assert numerics_changes(PORTABLE_CPU, current) == []
    native = {**PORTABLE_CPU, "cpu_numerics": "native", "cpu_capability": "AVX512", "mkl_cbwr": "OFF"}
    assert numerics_changes(native, {**native, "blas": "mkl", "blas_coretype": None}) == []
    # Without MKL's branch nothing says which BLAS it was: on arm64 the core type may have changed.
    old_arm = {k: v for k, v in PORTABLE_ARM64.items() if k not in ("blas", "blas_coretype")}
    changes = numerics_changes({**old_arm, "cpu_numerics": "native"},
                               {**PORTABLE_ARM64, "cpu_numerics": "native"})
    assert [c[0] for c in changes] == ["blas", "blas_coretype"]


def test_a_golden_that_predates_the_numerics_fields_counts_as_another_environment():
    old = {k: v for k, v in PORTABLE_CPU.items() if k not in ("cpu_numerics", "machine", "mkl_cbwr")}
    assert {name for name, _, _ in numerics_changes(old, PORTABLE_CPU)} >= {"cpu_numerics", "machine"}


@pytest.fixture
def fresh_tiny(tiny):
    """The loaded tiny model with an empty probe cache, so the next generation probes again."""
    return tiny.fresh()


def _llm(loaded, shape="4x32"):
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    return LLMModel(loaded, GenerationSettings(BatchShape.parse(shape), 3, 0))


def test_a_row_dependent_forward_pass_is_refused_at_the_first_generation(fresh_tiny):
    def last_row_differs(module, args, output):
        output.logits[-1:] += 1e-4  # what a row-dependent kernel does, at the last row only

    handle = fresh_tiny.model.register_forward_hook(last_row_differs)
    try:
        with pytest.raises(BatchInvarianceProbeError) as info:
            _llm(fresh_tiny).generate("The capital of France is")
    finally:
        handle.remove()
    message = str(info.value)
    assert ("batch invariance fails here: 'The capital of France is' gives different logits at row 0 and "
            "at row 3 of a 4x32 batch with other companions (first at step 0)") in message
    assert "cpu numerics 'portable'" in message and "Fix: one thread (OMP_NUM_THREADS=1)" in message
    assert not info.value.nondeterministic
    # remembered for the model and shape: every test fails alike
    with pytest.raises(BatchInvarianceProbeError):
        _llm(fresh_tiny).generate("Count: one,")
    assert _llm(fresh_tiny, "1x32").generate("Count: one,").token_ids  # one row per batch: nothing to verify


def test_randomness_in_the_forward_pass_is_named_nondeterministic_and_not_remembered(fresh_tiny):
    import torch

    def noise(module, args, output):
        output.logits.add_(torch.randn(output.logits.shape, generator=torch.Generator().manual_seed(
            int.from_bytes(os.urandom(4), "little"))) * 1e-3)

    handle = fresh_tiny.model.register_forward_hook(noise)
    try:
        with pytest.raises(BatchInvarianceProbeError,
                           match=r"^NONDETERMINISTIC: the same 4x32 batch") as info:
            _llm(fresh_tiny).generate("The capital of France is")
    finally:
        handle.remove()
    assert info.value.nondeterministic and "--llm-audit" in str(info.value)
    notes = []
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    LLMModel(fresh_tiny, GenerationSettings(BatchShape(4, 32), 3, 0),
             note=notes.append).generate("The sky is")
    assert notes == ["batch invariance: verified at 4x32 (row 0 vs row 3, and against 1x4, 3 steps)"]


def test_tokenizer_without_pad_and_eos_tokens_gets_a_safe_pad(tmp_path):
    import shutil

    from pytest_llmdeterminism.engines import BUILTIN_MODELS, load

    folder = shutil.copytree(BUILTIN_MODELS["tiny"], tmp_path / "no-pad-no-eos")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    for key in ("pad_token", "eos_token"):
        config.pop(key, None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    for name in ("config.json", "generation_config.json"):
        data = json.loads((folder / name).read_text())
        data.pop("eos_token_id", None)
        data.pop("pad_token_id", None)
        (folder / name).write_text(json.dumps(data))
    loaded = load(str(folder), dtype="float32", device="cpu")
    assert loaded.tokenizer.eos_token_id is None and loaded.tokenizer.pad_token_id == 0
    result = _llm(loaded).generate(["The sky is", "Count: one,"])
    assert [len(r.token_ids) for r in result] == [3, 3] and {r.finish_reason for r in result} == {"length"}


@pytest.mark.skipif(platform.machine() != "x86_64", reason="AVX2 is asked on x86-64 only")
@pytest.mark.fresh_python  # it tests what a new Python imports
def test_avx2_and_fma_are_asked_of_the_cpu_without_importing_torch():
    code = ("import sys; from pytest_llmdeterminism.compute import numerics; "
            "print(numerics._has_avx2(), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    import torch

    capabilities = torch.backends.cpu.get_cpu_capability()  # the suite runs pinned at AVX2
    assert out.stdout.split() == [str(capabilities == "AVX2"), "False"]


def test_cpu_features_are_read_without_executable_memory(monkeypatch):
    """Hosts that forbid writable+executable memory (SELinux deny_execmem) refuse such a mapping:
    the CPU's features come from numpy's table, which reads CPUID in C."""
    import mmap

    import torch

    requested = []

    def refused(*args, **kwargs):
        requested.append(kwargs.get("prot"))
        raise PermissionError(13, "Permission denied (deny_execmem)")

    monkeypatch.setattr(mmap, "mmap", refused)
    assert numerics._has_avx2() == (torch.backends.cpu.get_cpu_capability() == "AVX2" or
                                    platform.machine() != "x86_64")
    assert requested == []


@pytest.mark.skipif(platform.machine() != "x86_64", reason="portable needs AVX2 on x86-64 only")
@pytest.mark.parametrize("features", [{"AVX": True, "AVX2": False, "FMA3": True},
                                      {"AVX": True, "AVX2": True, "FMA3": False},
                                      {"AVX": False, "AVX2": True, "FMA3": True}, {}])
def test_a_cpu_without_avx2_and_fma_gets_generic_kernels_and_the_settings_that_work(monkeypatch, features):
    monkeypatch.setattr(numerics, "_cpu_features", lambda: features)  # a CPU of another generation
    for name in numerics.PINNED_VARIABLES:
        monkeypatch.setenv(name, "before")
    replaced = numerics.pin("portable")
    try:
        assert os.environ["ATEN_CPU_CAPABILITY"] == "default"  # ATen's AVX2 kernels would not run here
    finally:
        numerics.unpin(replaced)
    in_force = {"aten_capability": "DEFAULT", "mkl_cbwr": "COMPATIBLE", "blas": "mkl", "blas_coretype": None}
    monkeypatch.setattr(numerics, "effective", lambda: in_force)
    with pytest.raises(numerics.CPUNumericsError) as info:
        numerics.check("portable")
    message = str(info.value)
    assert "has no AVX2 and FMA, which portable numerics use on x86-64" in message
    assert "--llm-cpu-numerics=compatible" in message


@pytest.mark.skipif(platform.machine() != "x86_64", reason="portable needs AVX2 on x86-64 only")
def test_a_run_refused_for_its_cpu_numerics_loads_no_model(monkeypatch):
    """The check runs before the load: a refused run does not first spend a (multi-GB) model load."""
    monkeypatch.setattr(numerics, "_cpu_features", lambda: {"AVX": True, "AVX2": False, "FMA3": True})
    in_force = {"aten_capability": "DEFAULT", "mkl_cbwr": "COMPATIBLE", "blas": "mkl", "blas_coretype": None}
    monkeypatch.setattr(numerics, "effective", lambda: in_force)
    monkeypatch.setattr(hf, "load", lambda *args, **kwargs: pytest.fail("the model loaded before refusing"))
    with pytest.raises(numerics.CPUNumericsError, match="has no AVX2 and FMA"):
        engines.load("builtin:tiny", dtype="float32", device="cpu")


@pytest.mark.skipif(platform.machine() != "x86_64", reason="portable needs AVX2 on x86-64 only")
def test_a_cpu_with_avx2_and_fma_keeps_the_avx2_pin(monkeypatch):
    monkeypatch.setattr(numerics, "_cpu_features", lambda: {"AVX": True, "AVX2": True, "FMA3": True})
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "before")
    replaced = numerics.pin("portable")
    try:
        assert os.environ["ATEN_CPU_CAPABILITY"] == "avx2"
    finally:
        numerics.unpin(replaced)
