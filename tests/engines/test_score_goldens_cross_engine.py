"""The RL parity check as score goldens (issue 42): a transformers score golden of the SmolLM2 GGUF
file (float32, dequantised) read by the llama.cpp engine (Q4_1, the same file) through
``--llm-golden-fallback``: a verdict, and the per-position differences in the failure and the report."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: CMAKE_ARGS=-DGGML_NATIVE=OFF "
                    "pip install -e '.[llamacpp]' "
                    "(.ci/run does)")

SUITE = """
from pytest_llmdeterminism import deterministic

@deterministic
def test_parity(llm_model, golden_tokens):
    score = llm_model.score("The capital of France is", " Paris. It is known for the Eiffel Tower.")
    golden_tokens.check(score)
"""


def test_a_transformers_score_golden_read_by_llamacpp_reports_each_positions_difference(pytester,
                                                                                      smollm2_gguf):
    pytester.makeini(f"[pytest]\nllm_model = {smollm2_gguf}\nllm_batch_shape = 2x64\n")
    pytester.makepyfile(test_rl=SUITE)
    pytester.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    run = pytester.runpytest(f"--llm-model=llamacpp:{smollm2_gguf}", "--llm-golden-fallback",
                             "--llm-report=report.json")
    (check,) = json.loads((pytester.path / "report.json").read_text())["checks"]
    assert (check["kind"], check["variant"], check["run_variant"]) == ("score", "cpu/float32",
                                                                       "llamacpp:cpu/Q4_1")
    # Two engines' numbers are never identical; beyond near_tie's default atol (1e-3) it fails.
    assert check["verdict"] in ("LOGIT_DRIFT", "RANK_FLIP", "REGRESSION") and not check["passed"]
    golden_total, llamacpp_total = check["log_likelihood"]
    assert golden_total != llamacpp_total
    moved = check["moved_positions"]
    assert moved and all(p["expected_logprob"] != p["actual_logprob"] for p in moved)
    deltas = [abs(p["actual_logprob"] - p["expected_logprob"]) for p in moved]
    # the largest move of a given token first; the top-k's largest move bounds it
    assert deltas == sorted(deltas, reverse=True) and check["max_logprob_delta"] >= deltas[0] > 0
    run.assert_outcomes(failed=1)
    run.stdout.fnmatch_lines([f"E*golden mismatch in 'test_parity': {check['verdict']} (score) at position *",
                              "E*log-likelihood of the continuation (* tokens): -* -> -*",
                              "E*moved positions that moved most (position, token, logprob golden -> now):",
                              f"E*[[]{moved[0]['position']}[]] *: {moved[0]['expected_logprob']:.6f} -> "
                              f"{moved[0]['actual_logprob']:.6f}*"])
