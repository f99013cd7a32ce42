"""The serving audit against a real server: llama-cpp-python's OpenAI-compatible server on SmolLM2.

llama-cpp-python's server is the one this suite can start (llama.cpp's own ``llama-server`` is not
installed here). It has ONE slot and no ``--parallel`` / ``-cb``: every request waits for one lock,
so concurrent requests are computed one after another, never batched together. So:

- the one-slot run (``#slots=1``, what ``--parallel 1`` is on llama.cpp's server) must verify
  concurrency invariant, and record it in the golden's fingerprint;
- a four-slot continuous-batching run cannot be asked of it. The negative control is a workload that
  is not invariant on it, said here explicitly: companions that share the request's whole prompt
  (one system prompt for every request) with the prefix cache on (``cache_prompt=true``, the
  server's own default behaviour, which llama.cpp's server shares). The request is then computed
  from the companion's cached prompt, its last token alone: measured 0.2 in logprob against the
  request computed cold, in every round. The audit's ``prefix-cache`` row finds the same drift.
  (With the plugin's pin, a reset request before each request, such companions still move it at
  times: one may be served between the reset and the request. Timing decides, so no test asserts
  it; docs/serving.md says what to do.)

One server for the module; two rounds per condition (the README's test command has little time).
"""

from __future__ import annotations

import pytest

from tests.helpers.projects import read_goldens

pytest.importorskip("llama_cpp.server", reason="llama-cpp-python[server] is not installed: pip install -e "
                    "'.[llamacpp]' (.ci/run does)")

PROMPT = "Q: What is the capital of Japan? A:"
SUITE = """
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=4)
def test_capital(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Q: What is the capital of Japan? A:"))
"""


@pytest.fixture(scope="module")
def server(smollm2_gguf, tmp_path_factory):
    from tests.helpers.llama_server import LlamaServer

    started = LlamaServer(smollm2_gguf, tmp_path_factory.mktemp("serving") / "server.log")
    yield started
    started.stop()


@pytest.fixture(scope="module")
def one_slot_spec(server, smollm2_gguf, tmp_path_factory):
    """The server at one slot, its tokenizer as a folder: a tokenizer is parsed out of a GGUF file in
    ~15 s here, from a folder in under one. The plugin's converted copy of the file has it (when an
    earlier run made one), else it is parsed once and saved."""
    import shutil

    from pytest_llmdeterminism.engines.cached import converted_copy
    from pytest_llmdeterminism.engines.checkpoint import load_tokenizer

    folder = tmp_path_factory.mktemp("tokenizer")
    converted = converted_copy(smollm2_gguf)
    if converted.usable:
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json"):
            shutil.copy(converted.folder / name, folder / name)
    else:
        load_tokenizer("smollm2", smollm2_gguf).save_pretrained(folder)
    return f"{server.spec(folder)}&slots=1"


@pytest.fixture(scope="module")
def one_slot(one_slot_spec):
    from pytest_llmdeterminism.engines import load

    return load(one_slot_spec, dtype="float32", device="cpu")


def config(loaded):
    from pytest_llmdeterminism.generation import resolve_generation_config

    return resolve_generation_config({}, max_new_tokens=4, eos_token_ids=loaded.engine.eos_token_ids(),
                                     pad_token_id=0)


def test_negative_control_shared_prompt_companions_with_the_cache_on_move_every_round(one_slot):
    """No 4-slot batching on this server (see the module docstring): the workload that is not
    invariant here is companions that share the request's prompt, with the prefix cache on."""
    from pytest_llmdeterminism.engines.companions import alone, run_among
    from pytest_llmdeterminism.model.audit import answer_difference

    ids = list(one_slot.tokenizer(PROMPT)["input_ids"])
    reference = alone(one_slot.engine, ids, config(one_slot), seed=1)
    rounds = run_among(one_slot.engine.with_prefix_cache(), ids, config(one_slot), companions=2, rounds=2,
                       seed=1, shared_prefix=len(ids))
    found = [answer_difference(reference, r.output) for r in rounds]
    # every round: the request computed from a companion's cached prompt (or its own), never cold
    assert all(changed or delta > 0 for changed, _, delta, _ in found), found


def test_one_slot_is_verified_invariant_and_the_golden_records_it(pytester, one_slot_spec):
    """llm_server_checks at session start: the header's table, and the golden's serving_verified.
    The plugin's requests keep the prefix cache out (a reset before each); with it on, the answer
    moves: the prefix-cache row finds it."""
    pytester.makeini(f"[pytest]\nllm_model = {one_slot_spec}\nllm_server_checks = true\n")
    pytester.makepyfile(test_served=SUITE)
    result = pytester.runpytest("--llm-golden-update")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        f"llm server checks (llm_server_checks = true): serving audit of {PROMPT!r} on *",
        "  concurrent    among 2, at *identical    *0 * no effect",
        "  repeat        1 unique of 3 under load*identical*",
        "  prefix-cache  after its prompt+8, cache on*drift*a cached prefix changed*"])
    golden = read_goldens(pytester, "__golden__/test_served.json")["test_capital"]
    (entry,) = golden.values()
    assert entry["fingerprint"]["serving_verified"] == {"concurrency": "invariant at 2 (3 rounds)",
                                                        "prefix_cache": "off; with it on: drift"}
