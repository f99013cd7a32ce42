"""Which kernels a load chooses (compute/kernels.py) and what each numerics profile sets, needs and
supports (compute/numerics.py): pure decisions, no model loaded."""

from __future__ import annotations

import pytest

from pytest_llmdeterminism import ConfigurationError
from pytest_llmdeterminism.compute import numerics
from pytest_llmdeterminism.compute.kernels import Kernels, Policy
from pytest_llmdeterminism.compute.numerics import COMPATIBLE, NATIVE, PORTABLE, profile

MKL = {"mkl_cbwr": numerics.MKL_REPRODUCIBLE_BRANCH, "blas": "mkl"}
OPENBLAS = {"mkl_cbwr": None, "blas": "openblas", "blas_coretype": "ARMV8"}
ONEDNN_ROWS, MKL_TILES = "cpu-onednn-avx2-canonical-4", "cpu-mkl-compatible-tiles32-canonical-2"
OPENBLAS_TILES = "cpu-openblas-armv8-tiles32-canonical-2"


def choose(mode: str, machine: str, in_force: dict[str, object], setting: bool | None, *,
           dtype: str = "float32", device: str = "cpu") -> Kernels:
    return Kernels.choose(profile(mode, machine), in_force=in_force, dtype=dtype, device=device,
                          batch_invariant=setting)


# (mode, machine, in force) -> the previous kernels, the batch-invariant ones, their generation
SUPPORTED = [
    (PORTABLE, "x86_64", MKL, Policy.ONEDNN_AVX2, Policy.BATCH_INVARIANT, ONEDNN_ROWS),
    (COMPATIBLE, "x86_64", MKL, Policy.SPLIT_ONE_ROW, Policy.BATCH_INVARIANT_TILES, MKL_TILES),
    (PORTABLE, "AMD64", MKL, Policy.ONEDNN_AVX2, Policy.BATCH_INVARIANT, ONEDNN_ROWS),
    (PORTABLE, "aarch64", OPENBLAS, Policy.LINEAR, Policy.BATCH_INVARIANT_TILES, OPENBLAS_TILES),
    (COMPATIBLE, "aarch64", OPENBLAS, Policy.LINEAR, Policy.BATCH_INVARIANT_TILES, OPENBLAS_TILES),
]


@pytest.mark.parametrize(("mode", "machine", "in_force", "previous", "invariant", "generation"), SUPPORTED)
def test_the_setting_is_tri_state_where_the_profile_has_batch_invariant_kernels(
        mode, machine, in_force, previous, invariant, generation):
    off = choose(mode, machine, in_force, False)
    assert off.policy is previous and off.generation is None and not off.batch_invariant
    for setting in (None, True):  # the default takes them where they exist; true requires them
        on = choose(mode, machine, in_force, setting)
        assert on.policy is invariant and on.batch_invariant and on.generation == generation


UNSUPPORTED = [
    # (mode, machine, in force, dtype, device) -> the previous kernels and the reason the error gives
    (NATIVE, "x86_64", {"mkl_cbwr": "OFF"}, "float32", "cpu", Policy.LINEAR, "cpu numerics 'native'"),
    (NATIVE, "x86_64", MKL, "float32", "cpu", Policy.SPLIT_ONE_ROW, "cpu numerics 'native'"),  # inherited
    (NATIVE, "aarch64", OPENBLAS, "float32", "cpu", Policy.LINEAR, "cpu numerics 'native'"),
    (PORTABLE, "x86_64", MKL, "bfloat16", "cpu", Policy.ONEDNN_AVX2, "float32, not bfloat16"),
    (PORTABLE, "x86_64", {}, "float32", "cuda", Policy.LINEAR, "runs on cuda"),
    (PORTABLE, "x86_64", {"mkl_cbwr": None, "blas": "openblas"}, "float32", "cpu", Policy.LINEAR,
     "cpu numerics 'portable'"),  # a torch without MKL: the branch the kernels rely on is not there
    (COMPATIBLE, "arm64", {"blas": "accelerate"}, "float32", "cpu", Policy.LINEAR,
     "cpu numerics 'compatible'"),  # macOS on Apple silicon
    (PORTABLE, "ppc64le", {"blas": "openblas"}, "float32", "cpu", Policy.LINEAR, "cpu numerics 'portable'"),
]


@pytest.mark.parametrize(("mode", "machine", "in_force", "dtype", "device", "previous", "why"), UNSUPPORTED)
def test_without_batch_invariant_kernels_the_default_keeps_the_previous_ones_and_true_says_why(
        mode, machine, in_force, dtype, device, previous, why):
    for setting in (None, False):
        kernels = choose(mode, machine, in_force, setting, dtype=dtype, device=device)
        assert kernels.policy is previous and kernels.generation is None
    with pytest.raises(ConfigurationError, match="batch-invariant kernels are not available here") as info:
        choose(mode, machine, in_force, True, dtype=dtype, device=device)
    assert why in str(info.value)


def test_the_fixed_order_kernel_is_built_only_for_onednns_products_and_never_when_recording(
        tmp_path, monkeypatch):
    x86 = profile(PORTABLE, "x86_64")
    recording = Kernels.choose(x86, in_force=MKL, dtype="float32", device="cpu", recording=True,
                               folder=tmp_path)
    assert recording.fixed_order is None
    assert recording.slower == (
        "matrix multiplications run on PyTorch's own kernel (oneDNN), not the plugin's faster copy of it: "
        "the same results to the bit, only slower, because goldens are recorded with PyTorch's own kernel, "
        "the reference the faster copy is checked against (--llm-golden-update)")
    monkeypatch.setenv("LLMDET_OWN_KERNELS", "0")
    switched_off = Kernels.choose(x86, in_force=MKL, dtype="float32", device="cpu", folder=tmp_path)
    assert switched_off.fixed_order is None and switched_off.slower.endswith("LLMDET_OWN_KERNELS=0")
    split = Kernels.choose(profile(COMPATIBLE, "x86_64"), in_force=MKL, dtype="float32", device="cpu",
                           recording=True, folder=tmp_path)
    assert split.fixed_order is None and split.slower == ""  # no oneDNN products: nothing slower
    assert not list(tmp_path.iterdir())
    assert Kernels().policy is Policy.LINEAR
    assert Kernels().describe() == ("kernels F.linear (not batch-invariant): the batch shape is part of "
                                    "every golden")


def test_each_machine_and_mode_has_one_profile_with_what_it_sets_and_must_find():
    portable, compatible = profile(PORTABLE, "x86_64"), profile(COMPATIBLE, "x86_64")
    assert portable.environment == {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "avx2",
                                    "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert portable.in_force == {"aten_capability": "AVX2", "mkl_cbwr": "COMPATIBLE"}
    assert portable.needs_avx2 and portable.onednn_isa == "AVX2" and portable.pins_mkl
    assert compatible.environment == {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default"}
    assert not compatible.needs_avx2 and compatible.onednn_isa is None
    arm = {mode: profile(mode, "aarch64") for mode in (PORTABLE, COMPATIBLE)}
    assert arm[PORTABLE].environment == arm[COMPATIBLE].environment  # one pinned profile on arm64
    assert arm[COMPATIBLE].mode == COMPATIBLE and not arm[PORTABLE].pins_mkl
    assert arm[PORTABLE].in_force == {"aten_capability": "DEFAULT", "blas_coretype": "ARMV8"}
    assert profile(PORTABLE, "ppc64le").environment == {"ATEN_CPU_CAPABILITY": "default"}
    native = profile(NATIVE, "x86_64")
    assert not native.pinned and native.environment == {} and portable.pinned
    assert numerics.pinned(PORTABLE) and not numerics.pinned(NATIVE)


@pytest.mark.parametrize(("fingerprint", "ran"), [
    ({"cpu_numerics": "portable", "cpu_capability": "AVX2", "mkl_cbwr": "COMPATIBLE"}, "portable"),
    ({"cpu_numerics": "compatible", "cpu_capability": "DEFAULT", "mkl_cbwr": "COMPATIBLE"}, "compatible"),
    # recorded as portable before portable moved to AVX2 kernels: compatible's kernels ran
    ({"cpu_numerics": "portable", "cpu_capability": "DEFAULT", "mkl_cbwr": "COMPATIBLE"}, "compatible"),
    ({"cpu_numerics": "compatible", "cpu_capability": "DEFAULT", "blas_coretype": "ARMV8"}, "portable"),
    ({"cpu_numerics": "portable", "cpu_capability": "DEFAULT", "blas_coretype": "ARMV8"}, "portable"),
    ({"cpu_numerics": "compatible", "cpu_capability": "AVX2", "mkl_cbwr": "COMPATIBLE"}, None),
    ({"cpu_numerics": "native", "cpu_capability": "DEFAULT", "mkl_cbwr": "COMPATIBLE"}, None),
    ({"cpu_numerics": "portable", "cpu_capability": "AVX2", "mkl_cbwr": "AUTO"}, None),
    ({"cpu_numerics": "portable", "cpu_capability": "DEFAULT", "mkl_cbwr": None}, None),  # ppc64le
    ({"cpu_numerics": "portable", "cpu_capability": "DEFAULT", "blas_coretype": "NEOVERSEN1"}, None),
])
def test_a_fingerprint_shows_which_travelling_profile_ran(fingerprint, ran):
    found = numerics.profile_that_ran(fingerprint)
    assert (found.mode if found is not None else None) == ran
    assert [p.mode for p in numerics.TRAVELLING if p.ran(fingerprint)] == ([ran] if ran else [])
