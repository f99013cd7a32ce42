"""The serving audit (model/serving_audit.py): a server engine's request alone, among concurrent
companions, repeated under load and after a request that fills the server's prefix cache, each row
identical / drift / changed; and what it verified, as a golden's fingerprint records it.

The servers are fakes whose answer depends on what a real server's may: on other requests since the
needle's last answer (a batch it shared, without depending on thread timing) and on
``cache_prompt``.
"""

from __future__ import annotations

import json

import pytest

from pytest_llmdeterminism.decoding import resolve_generation_config
from pytest_llmdeterminism.engines import load
from pytest_llmdeterminism.model.serving_audit import serving_audit
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


# --- what a failed server golden's note says, and the run summary's tables ---

def decision(fingerprint, *, passed=False):
    from types import SimpleNamespace

    return SimpleNamespace(passed=passed, expected=SimpleNamespace(fingerprint=fingerprint))


def test_a_failed_server_golden_says_whether_its_serving_was_verified():
    from pytest_llmdeterminism.reporting.hints import serving_note

    unverified = serving_note(decision({"engine": "openai"}))
    assert "recorded without verifying how the server serves it" in unverified
    assert "llm_server_checks = true" in unverified and "--llm-audit" in unverified
    verified = serving_note(decision({"engine": "openai", "serving_verified": {
        "concurrency": "invariant at 4 (3 rounds)", "prefix_cache": "off; with it on: drift"}}))
    assert verified == ("its golden was recorded on a server verified as serving it (concurrency: "
                        "invariant at 4 (3 rounds); prefix cache: off; with it on: drift)")
    assert serving_note(decision({"engine": "openai"}, passed=True)) == ""
    assert serving_note(decision({"engine": "llamacpp"})) == ""


def test_the_run_summary_shows_serving_audits_beside_the_others():
    from pytest_llmdeterminism.reporting.terminal import audit_summary

    rows = (ServingRow("concurrent", "among 2", False, None, 0.5, runs=3, companions=2),
            ServingRow("prefix-cache", "cache on", False, None, 0.0))
    found = ServingAudit("p", "http://h/v1", rows, seed=9)
    lines = audit_summary([("t.py::test_a", found.to_json())])
    assert lines[0] == "t.py::test_a: serving audit of 'p' on http://h/v1 (companions drawn from seed 9):"
    assert lines[-1] == ("serving audit summary: 1 request(s); answers moved by concurrent 1/1, "
                         "prefix-cache 0/1")
    assert any("drift" in line and "other requests in flight changed the answer" in line for line in lines)


def test_llm_server_checks_takes_true_or_false():
    from pytest_llmdeterminism import ConfigurationError
    from pytest_llmdeterminism.run.options import SETTINGS, parse_boolean

    assert "llm_server_checks" in {setting.ini for setting in SETTINGS}
    assert parse_boolean("llm_server_checks", "true") is True
    with pytest.raises(ConfigurationError, match="llm_server_checks.*expected true or false"):
        parse_boolean("llm_server_checks", "yes")


def test_llm_audit_of_a_server_generation_is_the_serving_audit(pieces):
    from pytest_llmdeterminism.model.audit import after_generate_hook
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    server = FakeServer(sensitive(pieces, cached=drift), concurrent=True)
    try:
        loaded = load(spec(server, reset_prefix=1, slots=3), dtype="float32", device="cpu")
        recorded: list[dict] = []
        llm = LLMModel(loaded, GenerationSettings(BatchShape(1, 32), 3, 0),
                       after_generate=after_generate_hook(5, None, recorded.append))
        llm.generate("The cat")
    finally:
        server.stop()
    (found,) = map(ServingAudit.from_json, recorded)
    assert found.prompt == "The cat" and found.server == server.url
    assert [(row.source, row.companions, row.verdict) for row in found.rows] == [
        ("concurrent", 2, "identical"), ("concurrent", 3, "identical"), ("repeat", 3, "identical"),
        ("prefix-cache", 0, "drift")]


def test_two_answers_differ_by_their_shared_top_k_before_they_part_and_the_margin_where_they_do():
    from pytest_llmdeterminism.engines.capture import Chunk, RowSteps
    from pytest_llmdeterminism.model.serving_audit import answer_difference

    def answer(tokens, tops):
        steps = RowSteps()
        for top in tops:
            steps.append("h", [t for t, _ in top], [v for _, v in top])
        return Chunk(tokens=[tokens], steps=[steps])

    alone = answer([5, 6, 7], [[(5, -0.1), (9, -2.0)], [(6, -0.5), (8, -0.7)], [(7, -0.1), (1, -4.0)]])
    same = answer([5, 6, 7], [[(5, -0.1), (9, -2.0)], [(6, -0.5), (8, -0.7)], [(7, -0.1), (1, -4.0)]])
    drifted = answer([5, 6, 7], [[(5, -0.1), (3, -2.5)], [(6, -0.55), (8, -0.7)], [(7, -0.1), (1, -4.0)]])
    parted = answer([5, 8, 2], [[(5, -0.1), (9, -2.0)], [(8, -0.6), (6, -0.65)], [(2, -9.0), (7, -9.5)]])
    assert answer_difference(alone, same) == (False, None, 0.0, None)
    changed, first, delta, margin = answer_difference(alone, drifted)
    # ids 9 and 3 are in one answer's top-k only: not compared
    assert (changed, first, margin) == (False, None, None) and delta == pytest.approx(0.05)
    changed, first, delta, margin = answer_difference(alone, parted)
    # up to the step they part, not after it (step 2's -9.0 would be 8.9)
    assert (changed, first) == (True, 1) and delta == pytest.approx(0.15) and margin == pytest.approx(0.2)
