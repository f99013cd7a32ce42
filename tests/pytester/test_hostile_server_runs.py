"""A hostile or broken OpenAI-compatible server in pytest runs (DESIGN §11): a transient status records
the same golden, a 429 forever fails with its status and records nothing, an update records an
honest server and nothing of a lying one, a key the server generates reaches no golden, candidate,
report or output, credentials in the server URL stop the run at start, and no frame of a full trace
with locals shows the key.

The server is a fake (``fake_openai_server``) on a free localhost port, speaking raw HTTP; its
tokens are the built-in tiny model's, whose tokenizer the spec names."""

from __future__ import annotations

import pytest

from pytest_llmdeterminism.engines.server.secret import RUN
from tests.helpers.fake_openai_server import Connection, Request
from tests.helpers.hostile_server import (
    KEY,
    KEY_ENV,
    TINY,
    answer_with,
    generate,
    honest,
    respond,
    routes,
    spec,
    times_five,
)

# --- transient answers never change what is recorded ---

def _first(times: dict[str, int], answer, pieces):
    """``answer`` to the next ``times["left"]`` requests, then honest completions."""
    def once(request: Request, connection: Connection) -> None:
        if times["left"] > 0:
            times["left"] -= 1
            answer(request, connection)
        else:
            connection.respond(200, honest(request.json(), pieces))
    return once


@pytest.mark.parametrize("status", [429, 503])
def test_a_transient_status_on_the_first_completion_records_the_same_golden(pytester, serve, pieces, status):
    """The first completion also decides whether the server takes token ids: a 503 there once made
    the whole session send text prompts (another fingerprint, near-tie tolerance)."""
    times = {"left": 0}
    busy = _first(times, lambda r, c: c.respond(status, "busy", {"Retry-After": "0"}), pieces)
    server = serve(routes(pieces, **{"/v1/completions": busy}))
    pytester.makeini(f"[pytest]\nllm_model = {spec(server)}\nllm_batch_shape = 1x32\n")
    pytester.makepyfile(test_served=SUITE)
    golden = pytester.path / "__golden__" / "test_served.json"
    pytester.runpytest("--llm-golden-update", "-p", "no:randomly").assert_outcomes(passed=1)
    calm = golden.read_bytes()
    golden.unlink()
    times["left"] = 1
    pytester.runpytest("--llm-golden-update", "-p", "no:randomly").assert_outcomes(passed=1)
    assert golden.read_bytes() == calm and b'"prompt_sent_as": "token ids"' in calm
    completions = [r.json()["prompt"] for r in server.requests if r.path == "/v1/completions"]
    assert all(isinstance(prompt, list) for prompt in completions) and len(completions) == 3


def test_a_server_that_answers_429_forever_fails_with_its_status_and_records_nothing(pytester, serve, pieces):
    limited = answer_with(429, "rate limit reached", {"Retry-After": "0"})
    server = serve(routes(pieces, **{"/v1/completions": limited}))
    pytester.makeini(f"[pytest]\nllm_model = {spec(server)}\nllm_batch_shape = 1x32\n")
    pytester.makepyfile(test_served=SUITE)
    result = pytester.runpytest("--llm-golden-update", "-p", "no:randomly")
    result.assert_outcomes(failed=1)
    assert f"HTTPStatusError: llm_model {spec(server)!r}: the server at {server.url} answered POST " \
           "/v1/completions with HTTP 429 (the same 4 times in a row, with a wait before each retry; it is " \
           "overloaded, rate-limited or behind a failing gateway: run again when it has capacity): " \
           "'rate limit reached'" in result.stdout.str()
    prompts = [r.json()["prompt"] for r in server.requests if r.path == "/v1/completions"]
    assert len(prompts) == 4 and all(isinstance(prompt, list) for prompt in prompts)  # no text fallback
    assert not (pytester.path / "__golden__").exists()


def test_a_logprob_a_rounding_above_0_is_recorded_as_0(pytester, serve, pieces):
    """The check accepts up to POSITIVE_SLACK above 0 (float32 rounding of a near-certain token);
    the golden then records 0, which its schema accepts, where it once failed with a raw
    ``msgspec.ValidationError`` at the end of the run."""
    def near_certain(completion, choice, logprobs):
        logprobs["token_logprobs"] = [5e-4] * len(logprobs["tokens"])
        logprobs["top_logprobs"] = [{t: 5e-4, " zebra": -3.0} for t in logprobs["tokens"]]

    server = serve(routes(pieces, near_certain))
    _, result = generate(spec(server))
    assert [top[0][1] for top in result.top_logprobs] == [0.0] * 4
    pytester.makeini(f"[pytest]\nllm_model = {spec(server)}\nllm_batch_shape = 1x32\n")
    pytester.makepyfile(test_served=SUITE)
    pytester.runpytest("--llm-golden-update", "-p", "no:randomly").assert_outcomes(passed=1)
    pytester.runpytest("-p", "no:randomly").assert_outcomes(passed=1)


# --- the whole run ---

SUITE = """
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=4)
def test_cat(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The cat"))
"""


@pytest.mark.parametrize("lying", [False, True], ids=["honest", "lying"])
def test_an_update_run_records_an_honest_server_and_nothing_of_a_lying_one(pytester, serve, pieces, lying):
    server = serve(routes(pieces, times_five if lying else None))
    pytester.makeini(f"[pytest]\nllm_model = {spec(server)}\nllm_batch_shape = 1x32\n")
    pytester.makepyfile(test_served=SUITE)
    result = pytester.runpytest("--llm-golden-update", "-p", "no:randomly")
    golden = pytester.path / "__golden__" / "test_served.json"
    if not lying:
        assert result.ret == pytest.ExitCode.OK and golden.is_file()
        return
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert f"EngineError: llm_model {spec(server)!r}: the server at {server.url}, answering POST " \
           "/v1/completions, sent a completion that cannot be right: choices[0].logprobs.tokens: 20 tokens " \
           "for max_tokens=4." in result.stdout.str()
    assert not golden.exists()


KEY_SUITE = """
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=32)
def test_echo(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The cat"))
"""
# How a served completion can carry the key: whole in one token, split over two, over tokens of
# three characters each, none of which holds enough of it to be recognised alone, or as the tiny
# tokenizer's own tokens (one or two characters each), whose ids decode back to the key.
KEY_TOKENS = {
    "one token": [f" {KEY}"],
    "two tokens": [f" {KEY[:13]}", KEY[13:]],
    "tokens of 3 characters": [" "] + [KEY[i:i + 3] for i in range(0, len(KEY), 3)],
    "vocabulary tokens": [" s", "k", "-", "h", "o", "s", "t", "i", "le", "-", *"0123456789abc", "def"],
}
# Where the refusal finds the key: in the ids a golden would record wherever they are the vocabulary's
KEY_FOUND_IN = {"vocabulary tokens": "its tokens' ids, as the tokenizer decodes them"}


def _echoing(split: str, first: str):
    """A completion that says ``first`` and then the request's key, its fingerprint the key too, and
    the key among the top-k of each step."""
    def answer(request: Request, connection: Connection) -> None:
        key = request.headers["authorization"].removeprefix("Bearer ")
        tokens = [first, *(t.replace(KEY, key) for t in KEY_TOKENS[split])]
        completion = {"model": "tiny", "system_fingerprint": f"fp-{key}", "usage": {},
                      "choices": [{"text": "".join(tokens), "finish_reason": "stop",
                                   "logprobs": {"tokens": tokens, "token_logprobs": [-0.1] * len(tokens),
                                                "top_logprobs": [{t: -0.1, key: -2.0} for t in tokens]}}]}
        connection.respond(200, completion)
    return answer


@pytest.mark.parametrize("split", list(KEY_TOKENS))
def test_a_key_the_server_generates_is_refused_and_in_no_golden_candidate_report_or_output(pytester, serve,
                                                                                          pieces, monkeypatch,
                                                                                          split):
    """D14: a completion that spells the key is refused, not masked: its tokens are vocabulary tokens
    (of 3 characters each, say), whose recorded ids the tokenizer would decode back to the key."""
    monkeypatch.setenv(KEY_ENV, KEY)
    server = serve(routes(pieces, **{"/v1/completions": _echoing(split, "The")}))
    pytester.makeini(f"[pytest]\nllm_model = {spec(server, api_key_env=KEY_ENV)}\nllm_batch_shape = 1x64\n")
    pytester.makepyfile(test_served=KEY_SUITE)
    reports = ["--llm-report=r.json", "--llm-report=r.md", "--llm-report=r.html"]
    recorded = pytester.runpytest("--llm-golden-update", "-p", "no:randomly", "-rA", *reports)
    recorded.assert_outcomes(failed=1)
    assert f"sent a completion that spells the API key ({KEY_FOUND_IN.get(split, 'its text')}). A " \
           "golden holds token ids, which the tokenizer decodes back to the key, so nothing was recorded" \
           in recorded.stdout.str()
    assert not (pytester.path / "__golden__").exists()
    failed = pytester.runpytest("-p", "no:randomly", "-l", "--llm-golden-artifacts=artifacts", *reports)
    failed.assert_outcomes(failed=1)
    assert "spells the API key" in failed.stdout.str()
    written = {path: path.read_text() for path in pytester.path.rglob("*")  # Python's bytecode aside
               if path.is_file() and "__pycache__" not in path.parts}
    assert {path.name for path in written} >= {"r.json", "r.md", "r.html"}
    key = "".join(c for c in KEY if c.isalnum())
    runs = {key[i:i + RUN] for i in range(len(key) - RUN + 1)}  # what Secret.mask counts as part of it
    for text in [*written.values(), *(r.stdout.str() + r.stderr.str() for r in (recorded, failed))]:
        letters = "".join(c for c in text.lower() if c.isalnum())
        assert KEY not in text and not any(run in letters for run in runs)


@pytest.mark.subprocess
def test_a_run_with_credentials_in_the_server_url_stops_at_start_without_printing_them(pytester, serve,
                                                                                       pieces):
    server = serve(routes(pieces))
    url = server.url.replace("http://", "http://user:hunter2-secret@")
    pytester.makeini(f"[pytest]\nllm_model = openai:{url}#tokenizer={TINY}\n")
    pytester.makepyfile(test_served=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    assert "hunter2" not in output and "the URL holds credentials (USER:PASSWORD@)" in output
    assert server.requests == []


@pytest.mark.parametrize("where", ["/v1/models", "/v1/completions"])
def test_a_failing_request_shows_no_key_in_any_frame_of_a_full_trace_with_locals(pytester, serve, pieces,
                                                                               monkeypatch, where):
    monkeypatch.setenv(KEY_ENV, KEY)
    server = serve(routes(pieces, **{where: respond(500, {"error": "overloaded"})}))
    pytester.makeini(f"[pytest]\nllm_model = {spec(server, api_key_env=KEY_ENV)}\nllm_batch_shape = 1x32\n")
    pytester.makepyfile(test_served=SUITE)
    result = pytester.runpytest("--full-trace", "-l", "--junitxml=junit.xml", "-p", "no:randomly")
    output = result.stdout.str() + result.stderr.str()
    xml = (pytester.path / "junit.xml").read_text()
    assert result.ret != pytest.ExitCode.OK
    assert f"answered {'GET' if where.endswith('models') else 'POST'} {where} with HTTP 500" in output
    assert KEY not in output and KEY not in xml
