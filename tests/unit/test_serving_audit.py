"""The serving audit (model/audit.serving_audit): a server engine's request alone, among concurrent
companions, repeated under load and after a request that fills the server's prefix cache, each row
identical / drift / changed; and what it verified, as a golden's fingerprint records it.

The servers are fakes whose answer depends on what a real server's may: on other requests since the
needle's last answer (a batch it shared, without depending on thread timing) and on
``cache_prompt``.
"""

from __future__ import annotations

import json

import pytest

from pytest_llmdeterminism.engines import load
from pytest_llmdeterminism.generation import resolve_generation_config
from pytest_llmdeterminism.model.audit import serving_audit
from pytest_llmdeterminism.reporting.audit import ServingAudit, ServingRow
from tests.helpers.fake_openai_server import Connection, FakeServer, Request
from tests.helpers.hostile_server import GREEDY, honest, routes, spec

NEEDLE = [273, 442]  # "The cat" in the tiny tokenizer


def config():
    return resolve_generation_config({}, max_new_tokens=3, eos_token_ids=[2, 0], pad_token_id=0)


def sensitive(pieces, *, batched=None, cached=None):
    """Honest completions, except that the needle's is edited by ``batched`` when other requests
    came since its previous answer, and any request's by ``cached`` when it asks for the prefix cache."""
    since = {"others": 0}

    def complete(request: Request, connection: Connection) -> None:
        body = request.json()
        completion = honest(body, pieces)
        choice = completion["choices"][0]
        if body["prompt"] == NEEDLE:
            if since["others"] and batched is not None:
                batched(choice)
            since["others"] = 0
        elif isinstance(body["prompt"], list):  # not the engine's one-token reset, sent as text
            since["others"] += 1
        if body.get("cache_prompt") and cached is not None:
            cached(choice)
        connection.respond(200, json.dumps(completion))

    return routes(pieces, **{"/v1/completions": complete})


def drift(choice):
    logprobs = choice["logprobs"]
    logprobs["token_logprobs"][0] = -0.125
    first = logprobs["top_logprobs"][0]
    logprobs["top_logprobs"][0] = {t: -0.125 if v == -0.1 else v for t, v in first.items()}


def other_token(pieces):
    """Step 1's token swapped for another: the tokens part there."""

    def swap(choice):
        logprobs = choice["logprobs"]
        chosen, other = logprobs["tokens"][1], pieces[GREEDY[4]]
        logprobs["tokens"][1] = other
        logprobs["top_logprobs"][1] = {other: -0.1, chosen: -0.2}
        choice["text"] = "".join(logprobs["tokens"])

    return swap


@pytest.fixture
def audited(pieces):
    started: list[FakeServer] = []

    def run(answer, **knobs):
        started.append(FakeServer(answer, concurrent=True))
        loaded = load(spec(started[-1], **{"reset_prefix": 1, **knobs}), dtype="float32", device="cpu")
        return serving_audit(loaded, NEEDLE, config(), rounds=2, seed=3), started[-1]

    yield run
    for server in started:
        server.stop()


def verdicts(found: ServingAudit) -> list[tuple[str, str]]:
    return [(row.source, row.verdict) for row in found.rows]


def test_an_invariant_server_is_verified_invariant(audited, pieces):
    found, server = audited(sensitive(pieces), slots=4)
    assert verdicts(found) == [("concurrent", "identical"), ("concurrent", "identical"),
                               ("repeat", "identical"), ("prefix-cache", "identical")]
    assert [row.companions for row in found.rows[:2]] == [2, 4]
    assert found.capability() == {"concurrency": "invariant at 4 (2 rounds)",
                                  "prefix_cache": "off; with it on: invariant"}
    needles = [r for r in server.requests if r.path == "/v1/completions" and r.json()["prompt"] == NEEDLE]
    assert len(needles) == 1 + 2 + 2 + 1  # alone, 2 rounds among 2, 2 rounds among 4, after the cache
    table = "\n".join(found.lines())
    assert "companions drawn from seed 3" in table and "no effect" in table


def test_a_server_that_batches_drifts_and_the_row_says_how_much(audited, pieces):
    found, _ = audited(sensitive(pieces, batched=drift))
    concurrent = [row for row in found.rows if row.source == "concurrent"]
    assert [row.verdict for row in concurrent] == ["drift", "drift"]
    assert concurrent[0].max_logprob_delta == pytest.approx(0.025)
    assert found.capability()["concurrency"] == "drift at 2 (2 rounds)"
    assert "other requests in flight changed the answer" in "\n".join(found.lines())


def test_a_server_whose_tokens_change_under_load_names_the_step_and_margin(audited, pieces):
    found, _ = audited(sensitive(pieces, batched=other_token(pieces)))
    row = found.rows[0]
    assert (row.source, row.verdict, row.first_step) == ("concurrent", "changed", 1)
    assert row.margin == pytest.approx(2.9)  # the needle alone: -0.1 against " zebra"'s -3.0
    table = "\n".join(found.lines())
    assert "the tokens parted at step 1, where the request alone had a margin of 2.9" in table


def test_a_prefix_cache_that_moves_the_answer_is_found(audited, pieces):
    found, server = audited(sensitive(pieces, cached=drift))
    assert verdicts(found)[-1] == ("prefix-cache", "drift")
    assert found.capability()["prefix_cache"] == "off; with it on: drift"
    sent = [r.json() for r in server.requests if r.path == "/v1/completions"]
    cached = [body for body in sent if body.get("cache_prompt")]
    assert len(cached) == 2 and cached[0]["prompt"][:2] == NEEDLE and cached[1]["prompt"] == NEEDLE
    assert len(sent) > len(cached)  # every other request keeps it off


def test_the_report_round_trips_through_json():
    found = ServingAudit("p", "http://h/v1", (ServingRow("concurrent", "among 2", True, 1, 0.5, margin=0.1,
                                                         runs=3, companions=2),
                                              ServingRow("prefix-cache", "no cache", False, None, 0.0,
                                                         ran=False)), seed=9)
    assert ServingAudit.from_json(found.to_json()) == found
    assert found.capability() == {"concurrency": "changed at 2 (3 rounds)", "prefix_cache": "off"}
