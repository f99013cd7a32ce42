"""Which llama.cpp build runs, read from what llama-cpp-python reports as compiled in: a native build
(a source build's default, GGML_NATIVE) is named in the fingerprint and on the load line, with the
portable build's install line; a portable one is not flagged.

The strings are ``llama_cpp.llama_print_system_info()`` in llama.cpp's format: the portable x86-64 one
as the portable wheel of llama-cpp-python 0.3.36 prints it; the others written from the features that
ggml-cpu.cpp lists, in its order, for the flags each CPU's native build compiles with (older releases
list every feature, the absent ones ``= 0``)."""

from __future__ import annotations

import pytest

from pytest_llmdeterminism.engines.llamacpp import INSTALL, REINSTALL, LlamaCppBuild

# llama-cpp-python 0.3.36 built with CMAKE_ARGS="-DGGML_NATIVE=OFF" (.ci/run's wheel)
PORTABLE_X86 = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
                "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ")
# the same sources built natively (pip's default) on an Intel Xeon with AMX: the build that crashed
# in llama.cpp's own decode there
NATIVE_XEON_AMX = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | "
                   "BMI2 = 1 | AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | "
                   "AMX_INT8 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ")
NATIVE_ZEN4 = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
               "AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | "
               "OPENMP = 1 | REPACK = 1 | ")
# an older release's format: every feature, with 0 for the absent ones
OLD_PORTABLE = ("AVX = 1 | AVX_VNNI = 0 | AVX2 = 1 | AVX512 = 0 | AVX512_VBMI = 0 | AVX512_VNNI = 0 | "
                "AVX512_BF16 = 0 | FMA = 1 | NEON = 0 | SVE = 0 | ARM_FMA = 0 | F16C = 1 | FP16_VA = 0 | "
                "WASM_SIMD = 0 | BLAS = 0 | SSE3 = 1 | SSSE3 = 1 | VSX = 0 | MATMUL_INT8 = 0 | "
                "LLAMAFILE = 1 | ")
PORTABLE_ARM64 = "CPU : NEON = 1 | ARM_FMA = 1 | OPENMP = 1 | REPACK = 1 | "
NATIVE_GRAVITON3 = ("CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | MATMUL_INT8 = 1 | SVE = 1 | DOTPROD = 1 | "
                    "SVE_CNT = 32 | OPENMP = 1 | REPACK = 1 | ")


@pytest.mark.parametrize(("info", "fingerprint"), [
    (PORTABLE_X86, "portable"),
    (OLD_PORTABLE, "portable"),
    (PORTABLE_ARM64, "portable"),
    (NATIVE_XEON_AMX, "native (AVX_VNNI, AVX512, AVX512_VBMI, AVX512_VNNI, AVX512_BF16, AMX_INT8)"),
    (NATIVE_ZEN4, "native (AVX512, AVX512_VBMI, AVX512_VNNI, AVX512_BF16)"),
    (NATIVE_GRAVITON3, "native (FP16_VA, MATMUL_INT8, SVE, DOTPROD)"),
], ids=["portable-x86", "portable-old-format", "portable-arm64", "native-xeon-amx", "native-zen4",
        "native-graviton3"])
def test_the_build_is_read_from_the_features_compiled_in(info, fingerprint):
    assert LlamaCppBuild.from_system_info(info).fingerprint() == fingerprint


def test_a_native_build_is_named_on_the_load_line_with_the_portable_install():
    note = LlamaCppBuild.from_system_info(NATIVE_XEON_AMX).load_note()
    assert note.startswith("a native llama.cpp build, compiled for AVX_VNNI, AVX512, ")
    assert "its goldens hold only on CPUs with these" in note
    assert note.endswith('the portable build: CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install --force-reinstall '
                         "--no-cache-dir llama-cpp-python")
    assert LlamaCppBuild.from_system_info(PORTABLE_X86).load_note() == ""


def test_every_install_line_of_the_engine_gives_the_portable_build():
    for line in (INSTALL, REINSTALL):
        assert line.startswith('CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install ')
