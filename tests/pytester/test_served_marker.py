"""The user's journey with a served model: ``@deterministic(concurrency=N)`` and ``do_sample=True`` on
toy servers whose batching and seeding are known (``tests/helpers/served_toy.py``), in process."""

from __future__ import annotations

import json

import pytest

from pytest_llmdeterminism.model.concurrency import ROUNDS
from tests.helpers.served_toy import Behaviour, Noise, ToyServer

SUITE = """
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=3, concurrency=3)
def test_cat(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The cat"))

@deterministic(max_new_tokens=3)
def test_sampled(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The cat", do_sample=True, temperature=0.8))
"""


@pytest.fixture
def toy():
    servers: list[ToyServer] = []

    def start(behaviour: Behaviour) -> ToyServer:
        servers.append(ToyServer(behaviour))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def _project(pytester, server: ToyServer) -> None:
    pytester.makeini(f"[pytest]\nllm_model = {server.spec()}\nllm_batch_shape = 1x32\n")
    pytester.makepyfile(test_served=SUITE)


def test_an_invariant_faithful_server_records_both_and_passes_again(pytester, toy):
    server = toy(Behaviour())
    _project(pytester, server)
    pytester.runpytest("--llm-golden-update", "-p", "no:randomly").assert_outcomes(passed=2)
    golden = json.loads((pytester.path / "__golden__" / "test_served.json").read_text())
    configs = [entry["generation_config"] for entry in _entries(golden)]
    assert sorted(config.get("sampler", "greedy") for config in configs) == ["engine:openai@toy-1", "greedy"]
    pytester.runpytest("-p", "no:randomly").assert_outcomes(passed=2)


def test_a_server_whose_batching_changes_the_answer_fails_the_marked_test_and_records_nothing(pytester, toy):
    server = toy(Behaviour(batch_changes_token=True, noise=Noise.SHARED))
    _project(pytester, server)
    result = pytester.runpytest("--llm-golden-update", "-p", "no:randomly")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "ConcurrencyError: NONDETERMINISTIC under concurrency: 'The cat' was answered differently " in out
    assert f"among 3 concurrent requests than alone, in round 1 of {ROUNDS}, sent at position " in out
    assert "the seed row failed: different prompts sent with one seed share noise" in out
    assert not (pytester.path / "__golden__").exists()


def test_a_hang_up_among_companions_fails_that_test_only_and_the_next_one_passes(pytester, toy):
    """T7: a server that drops connections under load fails the concurrency check with what happened;
    the server is not marked down, so the session's next test is answered and recorded."""
    server = toy(Behaviour(hang_up_in_batch=True))
    pytester.makeini(f"[pytest]\nllm_model = {server.spec()}\nllm_batch_shape = 1x32\n")
    pytester.makepyfile(test_served="""
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=3, concurrency=3)
def test_among(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The cat"))

@deterministic(max_new_tokens=3)
def test_then_alone(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The dog"))
""")
    result = pytester.runpytest("--llm-golden-update", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert f"4 of 4 concurrent requests of round 1 of {ROUNDS} failed (the request under test among them); " \
           "the needle's failed first: the server at " in out
    assert "did not answer POST /v1/completions (RemoteDisconnected: " in out
    assert "every later test that uses it fails with this message" not in out
    golden = json.loads((pytester.path / "__golden__" / "test_served.json").read_text())
    assert list(golden["goldens"]) == ["test_then_alone"]


def _entries(golden):
    """Every recorded generation of a golden file, wherever the format nests them."""
    if isinstance(golden, dict):
        if "generation_config" in golden:
            yield golden
        for value in golden.values():
            yield from _entries(value)
    elif isinstance(golden, list):
        for value in golden:
            yield from _entries(value)
