"""Serving engines behind ``llm_model``: llama.cpp in process and an OpenAI-compatible server.

Real components only: llama-cpp-python runs the SmolLM2 GGUF file in the test process, and its
``[server]`` extra serves the same file on a free localhost port, started by the test. Each engine
records goldens in one pytest process and must reproduce them, bit for bit, in a second one.
"""

from __future__ import annotations

import pytest

from tests.helpers.models import perturbed_gguf
from tests.helpers.projects import REAL_GOLDEN, REAL_SUITE, llm_golden, read_goldens

# Quantised to Q4_1 in llama.cpp, the model answers the chat question otherwise ("L'Étoile, ...").
SUITE = REAL_SUITE.replace(' and "Paris" in result.text', "")
assert SUITE != REAL_SUITE

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: CMAKE_ARGS=-DGGML_NATIVE=OFF "
                    "pip install -e '.[llamacpp]' "
                    "(.ci/run does)")

def record_and_reproduce(pytester, spec: str, variant: str) -> dict:
    pytester.makeini(f"[pytest]\nllm_model = {spec}\nllm_batch_shape = 2x32\n")
    pytester.makepyfile(test_real=SUITE)
    recorded = pytester.runpytest_subprocess("--llm-golden-update")
    recorded.assert_outcomes(passed=3)
    recorded.stdout.fnmatch_lines(["golden checks: 5 recorded"])
    checked = pytester.runpytest_subprocess()
    checked.assert_outcomes(passed=3)
    checked.stdout.fnmatch_lines(["golden checks: 5 IDENTICAL"])
    goldens = read_goldens(pytester, REAL_GOLDEN)
    assert {v for variants in goldens.values() for v in variants} == {variant}
    return goldens


@pytest.mark.subprocess
def test_llamacpp_in_process_records_and_reproduces_bitwise(pytester, smollm2_gguf):
    goldens = record_and_reproduce(pytester, f"llamacpp:{smollm2_gguf}", "llamacpp:cpu/Q4_1")
    capital = goldens["test_capital"]["llamacpp:cpu/Q4_1"]
    # no step_hash: raw logits, the transformers definition
    assert "Paris" in capital["text"] and "step_hash" not in capital
    fingerprint = capital["fingerprint"]
    assert fingerprint["engine"] == "llamacpp" and fingerprint["dtype"] == "Q4_1"
    assert (fingerprint["threads"], fingerprint["n_batch"], fingerprint["n_ubatch"]) == (1, 512, 512)
    assert fingerprint["weights_hash"] and fingerprint["model"] == smollm2_gguf.name


@pytest.mark.subprocess
def test_openai_server_records_reproduces_and_detects_a_changed_model(pytester, smollm2_gguf, llama_server,
                                                                       tmp_path):
    server = llama_server(smollm2_gguf)
    goldens = record_and_reproduce(pytester, server.spec(smollm2_gguf), "openai:served/unknown")
    capital = goldens["test_capital"]["openai:served/unknown"]
    assert capital["step_hash"] == "served-topk"
    assert capital["fingerprint"]["server_model"].endswith(smollm2_gguf.name)
    server.stop()

    # The same endpoint now serves another model: every check must say so, and name the change.
    changed = llama_server(perturbed_gguf(smollm2_gguf, tmp_path / "changed.gguf", 1.05))
    pytester.makeini(f"[pytest]\nllm_model = {changed.spec(smollm2_gguf)}\nllm_batch_shape = 2x32\n")
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    output = result.stdout.str()
    assert "IDENTICAL" not in output.split("golden checks:")[-1]
    result.stdout.fnmatch_lines(["*server_model '*SmolLM2-135M-Instruct.Q4_1.gguf' → '*changed.gguf'*"])


@pytest.mark.subprocess
def test_server_killed_mid_run_gives_one_clear_error_per_test(pytester, smollm2_gguf, llama_server):
    server = llama_server(smollm2_gguf)
    pytester.makeini(f"[pytest]\nllm_model = {server.spec(smollm2_gguf)}\nllm_batch_shape = 2x32\n")
    pytester.makepyfile(test_killed=f"""
import os, signal
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=4)
def test_1_before(llm_model):
    assert llm_model.generate("The capital of France is").token_ids

@deterministic(max_new_tokens=4)
def test_2_killed(llm_model):
    os.kill({server.process.pid}, signal.SIGKILL)
    llm_model.generate("The capital of France is")

@deterministic(max_new_tokens=4)
def test_3_after(llm_model):
    llm_model.generate("def fibonacci(n):")
""")
    result = pytester.runpytest_subprocess("--tb=short")
    result.assert_outcomes(passed=1, failed=2)
    output = result.stdout.str()
    assert output.count(f"EngineError: llm_model {server.spec(smollm2_gguf)!r}: the server at {server.url} "
                        "did not answer") == 2
    assert "Is it running, at this URL? If it was, check its log" in output
    assert "urllib" not in output and "http.client" not in output  # one message, no library internals


@pytest.mark.subprocess
def test_cross_engine_table_transformers_vs_llamacpp(pytester, smollm2_gguf):
    """The differential test: goldens recorded by transformers (fp32, dequantised), the same prompts
    through llama.cpp (Q4_1) compared with them via --llm-golden-fallback, the table by llm-golden diff."""
    pytester.makeini(f"[pytest]\nllm_model = {smollm2_gguf}\nllm_batch_shape = 2x32\n")
    pytester.makepyfile(test_real=SUITE)
    pytester.runpytest_subprocess("--llm-golden-update").assert_outcomes(passed=3)
    candidates = pytester.path / "candidates"
    run = pytester.runpytest_subprocess(f"--llm-model=llamacpp:{smollm2_gguf}", "--llm-golden-fallback",
                                        f"--llm-golden-artifacts={candidates}", "--llm-tolerance=near_tie")
    output = run.stdout.str()
    assert "compared with 'cpu/float32' (--llm-golden-fallback)" in output
    diff = llm_golden("diff", "__golden__", candidates / "__golden__", cwd=pytester.path)
    table = diff.stdout
    assert diff.returncode in (0, 1), diff.stderr
    lines = [line for line in table.splitlines() if "(vs cpu/float32)" in line]
    assert len(lines) == 5, table  # every check, each paired with the transformers golden
    # Two engines' numbers are never "identical": equal tokens are LOGIT_DRIFT at best.
    assert all(line.split()[0] in ("LOGIT_DRIFT", "TIE_FLIP", "REGRESSION") for line in lines), table


def test_a_served_generation_does_not_depend_on_the_request_before_it(smollm2_gguf, llama_server):
    """llama-cpp-python's server reuses the previous request's prompt cache for a shared prefix and
    then gives other logprobs; the one-token reset request before each generation prevents that."""
    from pytest_llmdeterminism.engines import load
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    server = llama_server(smollm2_gguf)
    settings = GenerationSettings(BatchShape(1, 32), max_new_tokens=4, seed=0)
    japan, france = "Q: What is the capital of Japan? A:", "The capital of France is"
    for reset in (True, False):
        served = LLMModel(load(f"{server.spec(smollm2_gguf)}&reset_prefix={int(reset)}", dtype="float32",
                               device="auto"), settings)
        after_other = [served.generate(france), served.generate(japan)][1]
        after_itself = served.generate(japan)
        if reset:
            assert after_itself == after_other
        else:  # the server's own behaviour, which the reset exists for (0.07 in logprob, measured)
            assert after_itself.top_logprobs[0] != after_other.top_logprobs[0]


def test_what_only_transformers_does_is_refused_by_name_on_llamacpp(smollm2_gguf):
    from pytest_llmdeterminism import ConfigurationError
    from pytest_llmdeterminism.engines import load
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    with pytest.raises(ConfigurationError,
                       match="llm_dtype = 'bfloat16': llama.cpp runs the GGUF file's own weights"):
        load(f"llamacpp:{smollm2_gguf}", dtype="bfloat16", device="auto")
    loaded = load(f"llamacpp:{smollm2_gguf}", dtype="float32", device="auto")
    # 2 is <|im_end|>, SmolLM2's one EOG token
    assert loaded.engine.eos_token_ids() == [2] and loaded.dtype == "Q4_1"
    audited = LLMModel(loaded, GenerationSettings(BatchShape(1, 32), 4, 0), after_generate=lambda *args: None)
    with pytest.raises(ConfigurationError, match="the audit varies batch shape, padding, threads and dtype "
                                                 "of the transformers backend; .* runs on llamacpp"):
        audited.generate("The capital of France is")
    with pytest.raises(ConfigurationError,
                       match="is supported by the transformers backend only, not by llama.cpp"):
        LLMModel(loaded, GenerationSettings(BatchShape(1, 32), 4, 0)).generate("Hi", no_repeat_ngram_size=2)


def test_llamacpp_samples_with_the_plugins_sampler(smollm2_gguf):
    """do_sample=True in process on llama.cpp: the plugin's seeded draw over llama.cpp's raw logits (its
    own sampler unused), so the same seed gives the same sample bit for bit and other seeds others."""
    from pytest_llmdeterminism.engines import load
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    loaded = load(f"llamacpp:{smollm2_gguf}", dtype="float32", device="cpu")
    llm = LLMModel(loaded, GenerationSettings(BatchShape(1, 64), max_new_tokens=8, seed=0))
    prompt = "Once upon a time"
    first = llm.generate(prompt, do_sample=True, temperature=1.0, seed=1)
    again = llm.generate(prompt, do_sample=True, temperature=1.0, seed=1)
    assert (first.token_ids, first.step_hashes, first.draw_margins) == \
        (again.token_ids, again.step_hashes, again.draw_margins)
    assert len(first.draw_margins) == len(first.token_ids) and first.generation_config["seed"] == 1
    assert "seeded sampler" in first.fingerprint["flags"]["engine_loop"]
    samples = {llm.generate(prompt, do_sample=True, temperature=1.0, seed=seed).token_ids
               for seed in range(6)}
    assert len(samples) >= 3, samples
    assert llm.generate(prompt).draw_margins == ()


def test_the_llamacpp_build_is_named_in_the_fingerprint_and_on_the_load_line(smollm2_gguf):
    """The build installed here (.ci/run's wheel: portable) is what the fingerprint and the load line say;
    a native one would be named on both (tests/unit/engines/test_llamacpp_build.py reads recorded builds)."""
    import llama_cpp

    from pytest_llmdeterminism.engines import ModelCache
    from pytest_llmdeterminism.engines.llamacpp import LlamaCppBuild
    from pytest_llmdeterminism.model.fingerprint import fingerprint

    build = LlamaCppBuild.from_system_info(llama_cpp.llama_print_system_info().decode())
    said: list[str] = []
    loaded = ModelCache(f"llamacpp:{smollm2_gguf}", dtype="float32", device="cpu", cpu_numerics="portable",
                        announce=said.append).get()
    assert fingerprint(loaded)["llamacpp_build"] == build.fingerprint()
    loaded_line = next(line for line in said if line.startswith("llm: loaded llamacpp:"))
    assert ("(a native llama.cpp build, compiled for " in loaded_line) == build.native
