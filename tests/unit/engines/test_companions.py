"""The needle runner (engines/server/companions.py): a server engine's request among concurrent companions.

The server is the fake OpenAI-compatible one answering each connection in its own thread; each
completion waits (a few seconds at most) until every request of the round is in flight, so a
runner that did not overlap its requests would show ``in_flight == 1``.
"""

from __future__ import annotations

import json
import random
import threading

import pytest

from pytest_llmdeterminism import EngineError
from pytest_llmdeterminism.decoding import resolve_generation_config
from pytest_llmdeterminism.engines import load
from pytest_llmdeterminism.engines.server.companions import alone, companion_prompts, run_among
from tests.helpers.fake_openai_server import Connection, FakeServer, Request
from tests.helpers.hostile_server import GREEDY, honest, routes, spec

NEEDLE = [273, 442]  # "The cat" in the tiny tokenizer


def config(max_new_tokens: int = 3):
    return resolve_generation_config({}, max_new_tokens=max_new_tokens, eos_token_ids=[2, 0], pad_token_id=0)


def gathered(pieces, everyone: dict[str, int], fail_companions: bool = False, reset_companions: bool = False):
    """Honest completions, each answered once ``everyone["n"]`` requests are in flight (at most 5 s);
    a companion is refused (404) with ``fail_companions``, hung up on with a TCP reset with
    ``reset_companions``."""
    server: FakeServer | None = None
    arrived = threading.Condition()

    def complete(request: Request, connection: Connection) -> None:
        assert server is not None
        with arrived:
            arrived.notify_all()
            arrived.wait_for(lambda: request.in_flight >= everyone["n"], timeout=5)
        body = request.json()
        if fail_companions and body["prompt"] != NEEDLE:
            connection.respond(404, "companion refused")
            return
        if reset_companions and body["prompt"] != NEEDLE:
            connection.reset()
            return
        connection.respond(200, json.dumps(honest(body, pieces)))

    server = FakeServer(routes(pieces, **{"/v1/completions": complete}), concurrent=True)
    return server


@pytest.fixture
def concurrent_server(pieces):
    started: list[FakeServer] = []

    def start(everyone: dict[str, int], **kwargs) -> FakeServer:
        started.append(gathered(pieces, everyone, **kwargs))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def needles(server: FakeServer) -> list[Request]:
    return [r for r in server.requests if r.path == "/v1/completions" and r.json()["prompt"] == NEEDLE]


def test_the_needle_is_in_flight_with_all_its_companions_and_answers_as_alone(concurrent_server):
    everyone = {"n": 1}
    server = concurrent_server(everyone)
    engine = load(spec(server), dtype="float32", device="cpu").engine
    reference = alone(engine, NEEDLE, config(), seed=7)
    assert reference.tokens == [GREEDY[:3]]
    everyone["n"] = 4
    rounds = run_among(engine, NEEDLE, config(), companions=3, rounds=2, seed=7)
    assert [(r.companions, r.output.tokens) for r in rounds] == [(3, [GREEDY[:3]])] * 2
    assert all(0 <= r.position <= 3 for r in rounds)
    sent = needles(server)
    assert [r.in_flight for r in sent] == [1, 4, 4]  # alone, then twice among its 3 companions
    assert [r.json()["seed"] for r in sent] == [7, 7, 7]
    assert server.most_in_flight == 4
    companions = [r.json() for r in server.requests if r.path == "/v1/completions"
                  and r.json()["prompt"] != NEEDLE]
    assert len(companions) == 6 and all(r["max_tokens"] >= 1 for r in companions)


def test_one_seed_replays_the_same_companions_and_positions():
    def drawn(seed: int):
        rng = random.Random(seed)
        return [(c.ids, c.max_new_tokens, c.seed) for c in
                companion_prompts(rng, 3, vocab_size=1000, excluded={2, 0}, max_new_tokens=4)]

    assert drawn(5) == drawn(5) and drawn(5) != drawn(6)
    lengths = {len(ids) for ids, _, _ in drawn(5)}
    assert len(lengths) > 1  # random lengths
    assert all(t not in (0, 2) and 0 <= t < 1000 for ids, _, _ in drawn(5) for t in ids)


def test_positions_come_from_the_seed(concurrent_server):
    server = concurrent_server({"n": 3})
    engine = load(spec(server), dtype="float32", device="cpu").engine
    first = [r.position for r in run_among(engine, NEEDLE, config(1), companions=2, rounds=4, seed=11)]
    again = [r.position for r in run_among(engine, NEEDLE, config(1), companions=2, rounds=4, seed=11)]
    assert first == again and len(set(first)) > 1


def test_a_failing_companion_fails_the_run_with_its_error_after_all_threads_end(concurrent_server):
    server = concurrent_server({"n": 3}, fail_companions=True)
    engine = load(spec(server), dtype="float32", device="cpu").engine
    with pytest.raises(EngineError, match="HTTP 404") as caught:
        run_among(engine, NEEDLE, config(), companions=2, rounds=1, seed=3)
    assert [r.in_flight for r in needles(server)] == [3]
    assert "2 of 3 concurrent requests of round 1 of 1 failed (the request under test answered); " \
           "companion " in str(caught.value)


def test_a_companion_reset_fails_its_round_saying_what_happened_and_the_server_stays_up(concurrent_server):
    """T7: a connection reset met by a companion fails the check that sent it, naming the reset, and
    leaves the server in use: the next request (another test's) is sent and answered."""
    everyone = {"n": 3}
    server = concurrent_server(everyone, reset_companions=True)
    engine = load(spec(server), dtype="float32", device="cpu").engine
    with pytest.raises(EngineError) as caught:
        run_among(engine, NEEDLE, config(), companions=2, rounds=2, seed=3)
    text = str(caught.value)
    assert "2 of 3 concurrent requests of round 1 of 2 failed (the request under test answered); companion " \
           in text and "ConnectionResetError" in text
    assert "This check fails; the server stays in use for the other tests" in text
    assert "every later test" not in text
    everyone["n"] = 1
    assert alone(engine, NEEDLE, config(), seed=7).tokens == [GREEDY[:3]]  # the session's server is not down


def test_nonsense_counts_are_refused():
    with pytest.raises(ValueError, match="rounds >= 1"):
        run_among(None, NEEDLE, config(), companions=2, rounds=0, seed=0)  # type: ignore[arg-type]
