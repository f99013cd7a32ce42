"""``@deterministic(concurrency=N)``: a request sent again among N concurrent ones must be answered as
it was alone (``model/concurrency.py``), against toy servers whose batching is known
(``tests/helpers/served_toy.py``)."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_llmdeterminism import ConcurrencyError, ConfigurationError
from pytest_llmdeterminism.engines import load
from pytest_llmdeterminism.model.concurrency import ROUNDS, refuse_where_not_served
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.run.markers import validate_marker_kwargs
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings
from tests.helpers.served_toy import Behaviour, ToyServer


@pytest.fixture
def toy():
    servers: list[ToyServer] = []

    def start(**behaviour) -> ToyServer:
        servers.append(ToyServer(Behaviour(**behaviour)))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def model(server: ToyServer, concurrency: int) -> LLMModel:
    loaded = load(server.spec(), dtype="float32", device="cpu")
    return LLMModel(loaded, GenerationSettings(BatchShape(1, 32), 3, 0, concurrency=concurrency))


def test_an_invariant_server_passes_and_the_request_really_ran_among_its_companions(toy):
    server = toy()
    alone = model(server, 0).generate("The cat")
    assert server.batches() == [1]
    among = model(server, 3).generate("The cat")
    assert among == alone  # what the test goes on with is the alone answer, the same as without the marker
    # the test's own request, then ROUNDS rounds of the needle and its 3 companions, held together
    assert server.batches()[1] == 1 and len(server.batches()) == 2 + ROUNDS * 4
    needles = [c for c in server.log.completions[2:] if c["prompt"] == list(alone.prompt_token_ids)]
    assert len(needles) == ROUNDS and all(c["batch"] >= 2 for c in needles)
    # the companions replay from the test's seed: the same requests again
    first = sorted(tuple(c["prompt"]) for c in server.log.completions[2:])
    model(server, 3).generate("The cat")
    assert sorted(tuple(c["prompt"]) for c in server.log.completions[len(first) + 3:]) == first


def test_a_server_whose_batching_changes_a_token_fails_saying_where_and_what(toy):
    server = toy(batch_changes_token=True)
    with pytest.raises(ConcurrencyError) as caught:
        model(server, 3).generate("The cat")
    error = caught.value
    found = error.finding
    assert (found.round, found.rounds, found.companions) == (1, ROUNDS, 3) and 0 <= found.position <= 3
    divergence = found.comparison.divergence
    assert divergence is not None and divergence.step == 1
    assert error.alone.token_ids[0] == error.among.token_ids[0] != -1
    assert error.alone.token_ids[1] != error.among.token_ids[1]
    text = str(error)
    assert text.startswith("NONDETERMINISTIC under concurrency: 'The cat' was answered differently by ")
    assert found.differed == tuple(range(1, ROUNDS + 1))  # every round is counted, not only the first
    assert (f"among 3 concurrent requests than alone, in round 1 of {ROUNDS}, sent at position "
            f"{found.position} of 4 (among 3 concurrent companion requests, companion seed {error.seed}); "
            f"{ROUNDS} of {ROUNDS} rounds differed (also 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 and {ROUNDS - 11} "
            "more): tokens changed at step 1: alone ") in text
    assert f"(id {divergence.expected_token})" in text and f"(id {divergence.actual_token})" in text
    assert "--parallel 1" in text and "VLLM_BATCH_INVARIANT=1" in text
    # a server that moves the answer in some rounds only: how many, and which
    for differed, says in [((1, 4, 9), f"; 3 of {ROUNDS} rounds differed (also 4, 9): "),
                           ((1,), f"; the other {ROUNDS - 1} rounds answered as alone: ")]:
        some = dataclasses.replace(found, differed=differed)
        again = ConcurrencyError(error.spec, error.prompt, error.seed, some, alone=error.alone,
                                 among=error.among, piece=str)
        assert says in str(again)


def test_a_server_whose_batching_moves_only_logprobs_fails_naming_the_drift(toy):
    server = toy(batch_drifts=True)
    with pytest.raises(ConcurrencyError) as caught:
        model(server, 2).generate("The cat")
    assert caught.value.finding.comparison.divergence is None
    assert "among 2 concurrent requests than alone" in str(caught.value)
    assert "the same tokens, but logprobs drifted by up to 0.005 (first at step 0)" in str(caught.value)


class _InProcess:
    name = "transformers"
    hash_definition = runs_rows_alone = owns_sampling = supports_audit = None


def test_concurrency_is_refused_on_an_engine_in_this_process():
    with pytest.raises(ConfigurationError) as caught:
        refuse_where_not_served(_InProcess(), "builtin:tiny", 4)  # type: ignore[arg-type]
    assert str(caught.value).startswith("@deterministic(concurrency=...) = 4: sends each request among N "
                                        "concurrent requests to a server; builtin:tiny runs in this process "
                                        "on the transformers engine")
    assert "openai:URL#" in str(caught.value)


@pytest.mark.parametrize("value", [-1, 65, True, "3", 2.0])
def test_a_bad_concurrency_fails_naming_the_marker(value):
    with pytest.raises(ConfigurationError) as caught:
        validate_marker_kwargs({"concurrency": value}, "t.py::test")
    expected = f"@deterministic(concurrency=...) in t.py::test = {value!r}: expected "
    assert str(caught.value).startswith(expected)


def test_a_good_concurrency_is_taken():
    assert validate_marker_kwargs({"concurrency": 4}, "t.py::test") == {"concurrency": 4}
