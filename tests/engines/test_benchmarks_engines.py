"""benchmarks/engines.py (llama.cpp in process and its OpenAI-compatible server beside transformers) in
its smoke form, on the SmolLM2 .gguf the other engine tests run: it exits 0 and prints its ratio lines
and verdict counts (the other scripts: tests/pytester/test_benchmarks.py)."""

from __future__ import annotations

import pytest

from tests.helpers.benchmarks import LLAMACPP, run_smoke

pytest.importorskip("llama_cpp.server", reason="llama-cpp-python[server] is not installed: "
                    "CMAKE_ARGS=\"-DGGML_NATIVE=OFF\" pip install -e '.[llamacpp]' (.ci/run does)")


@pytest.mark.parametrize("name", LLAMACPP)
def test_the_llamacpp_benchmark_runs_in_its_smoke_form(name, smollm2_gguf):
    run_smoke(name, "--gguf", str(smollm2_gguf))
