"""A server is an untrusted peer (DESIGN §11): what a hostile or broken OpenAI-compatible server
can do to a run, each ending in one ``EngineError`` (or a refusal at load) naming the server and
the request, with no key printed, nothing followed elsewhere and nothing recorded.

The server is a fake (``fake_openai_server``) on a free localhost port, speaking raw HTTP; its
tokens are the built-in tiny model's, whose tokenizer the spec names.
"""

from __future__ import annotations

import base64
import gzip
import json
import time

import pytest

from pytest_llmdeterminism import ConfigurationError, EngineError
from pytest_llmdeterminism.engines import load
from pytest_llmdeterminism.generation import LOGPROB_FLOOR
from tests.helpers.fake_openai_server import Connection, Request
from tests.helpers.hostile_server import (
    GREEDY,
    KEY,
    KEY_ENV,
    MODELS,
    TINY,
    answer_with,
    generate,
    honest,
    respond,
    routes,
    spec,
    times_five,
)

MODELS_JSON = json.dumps(MODELS).encode()  # 44 bytes


def test_an_honest_server_is_accepted_and_its_key_goes_to_its_api_only(serve, pieces, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    server = serve(routes(pieces))
    loaded, result = generate(spec(server, reset_prefix=1, api_key_env=KEY_ENV))
    assert result.token_ids == tuple(GREEDY[:4]) and result.text == "The cat sat on"
    assert result.fingerprint["flags"]["system_fingerprint"] == "fp-1"
    assert loaded.describe["server"] == server.url and loaded.describe["server_version"] == "fake-1.0"
    paths = [r.path for r in server.requests]
    assert paths == ["/v1/models", "/version", "/v1/completions", "/v1/completions"]  # a reset, the prompt
    keys = [r.headers.get("authorization") for r in server.requests]
    assert keys == [f"Bearer {KEY}", None, f"Bearer {KEY}", f"Bearer {KEY}"]


# --- where the request and the key go ---

@pytest.mark.parametrize(("path", "status"), [("/v1/models", 302), ("/v1/completions", 302),
                                              ("/v1/completions", 307)])
def test_a_redirect_is_not_followed_and_the_key_goes_nowhere_else(serve, pieces, monkeypatch, path, status):
    monkeypatch.setenv(KEY_ENV, KEY)
    elsewhere = serve(routes(pieces))  # another port: another origin
    location = f"{elsewhere.origin}{path}?echo={KEY}"
    server = serve(routes(pieces, **{path: lambda r, c: c.respond(status, "", {"Location": location})}))
    with pytest.raises(EngineError) as raised:
        generate(spec(server, api_key_env=KEY_ENV))
    assert elsewhere.requests == []
    message = str(raised.value)
    method = "GET" if path.endswith("models") else "POST"
    assert f"the server at {server.url} answered {method} {path} with HTTP {status}, a redirect to " \
           f"'{elsewhere.origin}{path}?echo=***'. Redirects are not followed" in message
    assert "put the final URL in the spec" in message and KEY not in message


def test_a_key_the_server_echoes_in_an_error_is_masked(serve, pieces, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)

    def echo(request: Request, connection: Connection) -> None:
        connection.respond(500, {"error": f"invalid header {request.headers['authorization']}"})

    server = serve(routes(pieces, **{"/v1/models": echo}))
    with pytest.raises(EngineError) as raised:
        generate(spec(server, api_key_env=KEY_ENV))
    message = str(raised.value)
    assert "answered GET /v1/models with HTTP 500" in message and "invalid header Bearer ***" in message
    assert KEY not in message


ENCODED_ECHOES = {
    "upper-cased": lambda header: header.upper(),
    "base64 of the header": lambda header: base64.b64encode(header.encode()).decode(),
    "base64 URL-safe of user:KEY": lambda header: base64.urlsafe_b64encode(f"user:{KEY}".encode()).decode(),
    "hex": lambda header: header.encode().hex(),
    "halves on two lines": lambda header: f"{header[:20]}\n{header[20:]}",
    "split by punctuation": lambda header: "-".join(header[i:i + 3] for i in range(0, len(header), 3)),
}


@pytest.mark.parametrize("encoding", list(ENCODED_ECHOES))
def test_a_key_the_server_echoes_encoded_is_masked(serve, pieces, monkeypatch, encoding):
    monkeypatch.setenv(KEY_ENV, KEY)
    encode = ENCODED_ECHOES[encoding]

    def echo(request: Request, connection: Connection) -> None:
        connection.respond(401, f"rejected: {encode(request.headers['authorization'])} (id 42)")

    server = serve(routes(pieces, **{"/v1/models": echo}))
    with pytest.raises(EngineError) as raised:
        generate(spec(server, api_key_env=KEY_ENV))
    message = str(raised.value)
    assert "answered GET /v1/models with HTTP 401: 'rejected: " in message and "***" in message
    detail = message.partition("HTTP 401: ")[2]
    assert detail.endswith(" (id 42)'") and encode(f"Bearer {KEY}") not in detail
    for piece in ("hostile", "0123456", "789abcdef"):
        assert piece not in detail.lower()


def test_a_top_k_whose_ids_spell_the_key_is_refused_and_nothing_recorded(serve, pieces, monkeypatch):
    """D14: the key in no chosen token and in no text, but as the runner-up of each step: the top-k ids a
    golden records decode to it (the tiny tokenizer has a token per digit), so the completion is refused."""
    monkeypatch.setenv(KEY_ENV, KEY)
    runners_up = "0123456789"  # part of KEY: a run of 8 of its letters and digits is the key

    def answer(request: Request, connection: Connection) -> None:
        texts = [" cat"] * len(runners_up)
        tops = [{" cat": -0.1, digit: -3.0} for digit in runners_up]
        connection.respond(200, {"model": "tiny", "usage": {}, "choices": [{
            "text": "".join(texts), "finish_reason": "length",
            "logprobs": {"tokens": texts, "token_logprobs": [-0.1] * len(texts), "top_logprobs": tops}}]})

    server = serve(routes(pieces, **{"/v1/completions": answer}))
    with pytest.raises(EngineError) as raised:
        generate(spec(server, api_key_env=KEY_ENV), max_new_tokens=len(runners_up))
    message = str(raised.value)
    assert "sent a completion that spells the API key (the ids of rank 2 of its top-k, step after step, as " \
           "the tokenizer decodes them). A golden holds token ids" in message
    assert runners_up not in message


def test_no_frame_on_the_request_path_holds_the_key_as_text(serve, pieces, monkeypatch):
    """``pytest -l`` prints every local of every frame of a failure: none may be the key, the header
    or a dict holding it. Every line run in the plugin and in ``http.client`` is watched, through a
    whole load, a generation and a failing request; bytes on their way to the socket aside."""
    import http.client
    import sys
    from pathlib import Path

    import pytest_llmdeterminism

    monkeypatch.setenv(KEY_ENV, KEY)
    failing = {"/v1/completions": respond(500, {"error": "overloaded"})}
    good, bad = serve(routes(pieces)), serve(routes(pieces, **failing))
    package = Path(pytest_llmdeterminism.__file__).parent
    watched, box = (str(package), http.client.__file__), str(package / "engines" / "server" / "secret.py")
    seen: set[str] = set()

    def watch_line(frame, event, arg):
        for name, value in frame.f_locals.items():
            if not isinstance(value, (bytes, bytearray, memoryview)) and KEY in repr(value):
                seen.add(f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}: {name}")
        return watch_line

    def watch(frame, event, arg):
        where = frame.f_code.co_filename
        if where.startswith(watched) and where != box:  # the Secret's own frames hold the key
            return watch_line
        return None

    before = sys.gettrace()
    sys.settrace(watch)
    try:
        generate(spec(good, api_key_env=KEY_ENV))
        with pytest.raises(EngineError, match="answered POST /v1/completions with HTTP 500"):
            generate(spec(bad, api_key_env=KEY_ENV))
    finally:
        sys.settrace(before)
    assert [r.headers["authorization"] for r in good.requests if "models" in r.path] == [f"Bearer {KEY}"]
    assert sorted(seen) == []


def test_a_key_no_header_can_carry_is_refused_at_load_without_printing_it(serve, pieces, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-two words-0123456789")
    server = serve(routes(pieces))
    with pytest.raises(ConfigurationError) as raised:
        load(spec(server, api_key_env=KEY_ENV), dtype="float32", device="cpu")
    assert f"the key in ${KEY_ENV} holds a space, a line break or a non-ASCII character, which no HTTP " \
           "header can carry; set it to the key alone" in str(raised.value)
    assert "words" not in str(raised.value) and server.requests == []


@pytest.mark.parametrize("password", ["hunter2-secret", "hunter2/secret?x"])
def test_credentials_in_the_url_are_refused_without_printing_them(serve, pieces, password):
    server = serve(routes(pieces))
    spec_text = f"openai:http://user:{password}@127.0.0.1:{server.port}/v1#tokenizer={TINY}"
    with pytest.raises(ConfigurationError) as raised:
        load(spec_text, dtype="float32", device="cpu")
    message = str(raised.value)
    assert "hunter2" not in message and f"'openai:http://***@127.0.0.1:{server.port}/v1#" in message
    assert "the URL holds credentials (USER:PASSWORD@)" in message and "#api_key_env=NAME" in message
    assert server.requests == []


# --- time and size ---

@pytest.mark.parametrize("part", ["status line", "body"])
def test_a_trickling_server_is_cut_at_the_total_deadline(serve, part):
    body = json.dumps(MODELS).encode()
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()

    def trickle(request: Request, connection: Connection) -> None:
        if part == "body":
            connection.send(head)
        connection.trickle(body if part == "body" else head + body, 0.5)

    server = serve(trickle)
    started = time.monotonic()
    with pytest.raises(EngineError) as raised:
        load(spec(server, timeout=1.5), dtype="float32", device="cpu")
    assert time.monotonic() - started < 8  # 1.5 s in fact; a per-read timeout would wait 20 s
    assert f"the server at {server.url} did not answer GET /v1/models within its 1.5 s deadline (#timeout=" \
           in str(raised.value)


@pytest.mark.parametrize("framing", ["Content-Length", "none", "chunked"])
def test_a_body_above_the_size_limit_is_refused_without_reading_it(serve, framing):
    piece = b" " * 65536

    def flood(request: Request, connection: Connection) -> None:
        header = {"Content-Length": "Content-Length: 50000000\r\n", "none": "",
                  "chunked": "Transfer-Encoding: chunked\r\n"}[framing]
        connection.send(f"HTTP/1.1 200 OK\r\nConnection: close\r\n{header}\r\n".encode())
        chunk = b"10000\r\n" + piece + b"\r\n" if framing == "chunked" else piece
        connection.flood(chunk, most=50_000_000 // len(piece))

    server = serve(flood)
    with pytest.raises(EngineError) as raised:
        load(spec(server, max_response_mb=1), dtype="float32", device="cpu")
    assert f"the server at {server.url} answered GET /v1/models with " in str(raised.value)
    assert "above the 1 MB limit (#max_response_mb=); refused without reading it all" in str(raised.value)
    assert server.connections[0].sent < 30_000_000  # the client hung up long before the end


# --- broken HTTP ---

def _raw(data: bytes):
    return lambda request, connection: connection.send(data)


CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
BROKEN_HTTP = {
    "truncated body": (_raw(b'HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{"data": ['), "IncompleteRead"),
    "truncated chunk": (_raw(CHUNKED + b"100\r\n{}"), "IncompleteRead"),
    "bad chunk size": (_raw(CHUNKED + b"zz\r\n"), "IncompleteRead"),
    "bad status line": (_raw(b"HELLO THERE\r\n\r\n"), "BadStatusLine"),
    "bad status code": (_raw(b"HTTP/1.1 2x0 OK\r\n\r\n"), "BadStatusLine"),
    "huge header line": (_raw(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n"), "LineTooLong"),
    "too many headers": (_raw(b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 150 + b"\r\n"), "HTTPException"),
    "no answer": (_raw(b""), "RemoteDisconnected"),
    "not JSON": (respond(200, b"<html>hello</html>"), "malformed JSON"),
    "not UTF-8": (respond(200, b'{"data": [{"id": "\xff"}]}'), "malformed JSON"),
    "wrong shape": (respond(200, {"data": "tiny"}),
                    "an answer of the wrong shape (Expected `array`, got `str` - at `$.data`)"),
    "wrong type": (respond(200, {"data": [{"id": 7}]}), "Expected `str`, got `int` - at `$.data[0].id`"),
}


def _chunks_of_one_byte(request: Request, connection: Connection) -> None:
    connection.send(CHUNKED)
    for byte in json.dumps(MODELS).encode():
        connection.send(b"1\r\n" + bytes([byte]) + b"\r\n")
    connection.send(b"0\r\n\r\n")


def _framed(*lengths: int, after: bytes = b""):
    body = json.dumps(MODELS).encode()
    header = "".join(f"Content-Length: {n or len(body)}\r\n" for n in lengths).encode()
    return _raw(b"HTTP/1.1 200 OK\r\n" + header + b"\r\n" + body + after)


# Tricks a client must survive, as they behave now: the body as its framing says, or one EngineError.
HTTP_TRICKS = {
    "one-byte chunks": (_chunks_of_one_byte, None),
    "data after Content-Length": (_framed(0, after=b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 100_000), None),
    "two equal Content-Lengths": (_framed(0, 0), None),
    "one length twice in one header": (_raw(b"HTTP/1.1 200 OK\r\nContent-Length: 44, 44\r\n\r\n" + MODELS_JSON
                                            + b"HTTP/1.1 200 OK\r\n\r\n"), None),
    "a gzip bomb": (respond(200, gzip.compress(b"[" * 10_000_000)), "malformed JSON (JSON is malformed: "
                    "invalid character (byte 0)"),  # sent with Accept-Encoding: identity, never inflated
}


@pytest.mark.parametrize("case", list(HTTP_TRICKS))
def test_http_tricks_give_the_framed_body_or_one_engine_error(serve, pieces, case):
    answer, says = HTTP_TRICKS[case]
    server = serve(routes(pieces, **{"/v1/models": answer}))
    if says is None:
        _, result = generate(spec(server, timeout=10))
        assert result.text == "The cat sat on"
    else:
        with pytest.raises(EngineError) as raised:
            generate(spec(server, timeout=10))
        assert f"the server at {server.url} answered GET /v1/models with {says}" in str(raised.value)
    assert server.requests[0].headers["accept-encoding"] == "identity"


# Framings HTTP/1.1 calls unreadable (RFC 9112 §6.3): refused, whichever length comes first.
CONFLICTING_LENGTHS = {
    "the true one first": (_framed(0, 5), "'44', '5'"),
    "a short one first": (_framed(5, 0), "'5', '44'"),
    "two in one header": (_raw(b"HTTP/1.1 200 OK\r\nContent-Length: 44, 5\r\n\r\n" + MODELS_JSON), "'44, 5'"),
    "no number": (_raw(b"HTTP/1.1 200 OK\r\nContent-Length: 5x\r\n\r\n" + MODELS_JSON), "'5x'"),
}


@pytest.mark.parametrize("case", list(CONFLICTING_LENGTHS))
def test_content_lengths_that_disagree_are_refused(serve, pieces, case):
    answer, shown = CONFLICTING_LENGTHS[case]
    assert len(MODELS_JSON) == 44
    server = serve(routes(pieces, **{"/v1/models": answer}))
    with pytest.raises(EngineError) as raised:
        generate(spec(server, timeout=10))
    assert f"the server at {server.url} did not answer GET /v1/models with valid HTTP (HTTPException: " \
           f"\"Content-Length headers {shown} that do not give one length: a body HTTP/1.1 cannot frame " \
           "(RFC 9112 §6.3)\"). Is it an HTTP server, at this URL?" in str(raised.value)


def test_a_429_with_retry_after_above_the_cap_fails_at_once_without_waiting(serve, pieces):
    server = serve(routes(pieces, **{"/v1/models": lambda r, c: c.respond(429, "slow down",
                                                                         {"Retry-After": "3600"})}))
    started = time.monotonic()
    with pytest.raises(EngineError) as raised:
        generate(spec(server, timeout=60))
    assert time.monotonic() - started < 10 and len(server.requests) == 1
    assert "answered GET /v1/models with HTTP 429 (its Retry-After asks for 3600 s, above the 30 s the " \
           "plugin waits; it is overloaded, rate-limited or behind a failing gateway: run again when it " \
           "has capacity): 'slow down'" in str(raised.value)


def test_a_retry_that_would_end_past_the_deadline_is_not_waited_for(serve, pieces):
    server = serve(routes(pieces, **{"/v1/models": answer_with(503, "busy", {"Retry-After": "5"})}))
    with pytest.raises(EngineError) as raised:
        generate(spec(server, timeout=2))
    assert len(server.requests) == 1
    assert "answered GET /v1/models with HTTP 503 (a retry in 5 s would end past the request's deadline " \
           "(#timeout=, retries included; e.g. #timeout=600 gives it longer);" in str(raised.value)


@pytest.mark.parametrize("case", list(BROKEN_HTTP))
def test_broken_http_is_one_engine_error_naming_the_server_and_the_request(serve, case):
    answer, says = BROKEN_HTTP[case]
    server = serve(answer)
    with pytest.raises(EngineError) as raised:
        load(spec(server, timeout=10), dtype="float32", device="cpu")
    message = str(raised.value)
    assert f"the server at {server.url} " in message and "GET /v1/models" in message and says in message
    assert "\n" not in message


def _early_hints(then):
    def answer(request: Request, connection: Connection) -> None:
        connection.send(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n")
        connection.send(b"HTTP/1.1 102 Processing\r\n\r\n")
        then(request, connection)
    return answer


def test_informational_answers_are_skipped_not_taken_for_the_answer(serve, pieces):
    models = _early_hints(lambda r, c: c.respond(200, MODELS))
    completions = _early_hints(lambda r, c: c.respond(200, honest(r.json(), pieces)))
    server = serve(routes(pieces, **{"/v1/models": models, "/v1/completions": completions}))
    _, result = generate(spec(server))
    assert result.text == "The cat sat on" and result.fingerprint["flags"]["prompt_sent_as"] == "token ids"


def test_endless_informational_answers_are_one_engine_error(serve, pieces):
    def endless(request: Request, connection: Connection) -> None:
        connection.flood(b"HTTP/1.1 103 Early Hints\r\n\r\n", most=1000)

    server = serve(routes(pieces, **{"/v1/models": endless}))
    with pytest.raises(EngineError) as raised:
        generate(spec(server, timeout=10))
    assert "did not answer GET /v1/models with valid HTTP (HTTPException: 'more than 20 informational " \
           "(1xx) answers before the answer')" in str(raised.value)


@pytest.mark.parametrize("status", [400, 422, 500])
def test_a_server_that_refuses_token_id_prompts_gets_text_prompts(serve, pieces, status):
    def ids_refused(request: Request, connection: Connection) -> None:
        body = request.json()
        if isinstance(body["prompt"], list):
            connection.respond(status, {"error": "prompt must be a string"})
        else:
            connection.respond(200, honest({**body, "prompt": GREEDY[:2]}, pieces) | {"usage": {}})

    server = serve(routes(pieces, **{"/v1/completions": ids_refused}))
    _, result = generate(spec(server))
    assert result.text == "The cat sat on" and result.fingerprint["flags"]["prompt_sent_as"] == "text"


@pytest.mark.parametrize("body", [
    {"detail": [{"type": "string_type", "loc": ["body", "prompt", "str"], "msg": "Input should be a valid "
                 "string"}]},  # llama-cpp-python's 422
    {"error": {"message": "Invalid type for 'prompt': expected a string, got a list of integers"}},
])
def test_a_refusal_that_names_the_prompt_type_gets_text_prompts(serve, pieces, body):
    def ids_refused(request: Request, connection: Connection) -> None:
        if isinstance(request.json()["prompt"], list):
            connection.respond(422, body)
        else:
            connection.respond(200, honest({**request.json(), "prompt": GREEDY[:2]}, pieces) | {"usage": {}})

    server = serve(routes(pieces, **{"/v1/completions": ids_refused}))
    _, result = generate(spec(server))
    assert result.fingerprint["flags"]["prompt_sent_as"] == "text"


@pytest.mark.parametrize(("status", "body"), [
    (401, {"error": "no"}), (404, {"error": "no"}), (501, {"error": "no"}),
    # D5: a passing failure, or a refusal of something else, never switches the session to text prompts
    (500, {"error": "internal server error"}), (500, "CUDA out of memory"),
    (400, {"error": "invalid api key"}), (422, {"error": "max_tokens must be at most 2048"}),
    (400, {"error": "This model's maximum context length is 2048 tokens; your prompt has 3000"}),
])
def test_another_error_on_the_first_completion_is_raised_not_taken_for_a_refusal_of_token_ids(serve, pieces,
                                                                                              status, body):
    server = serve(routes(pieces, **{"/v1/completions": respond(status, body)}))
    with pytest.raises(EngineError, match=f"answered POST /v1/completions with HTTP {status}"):
        generate(spec(server))
    assert [type(r.json()["prompt"]) for r in server.requests if r.path == "/v1/completions"] == [list]


def _no_tokens(completion, choice, logprobs):
    choice["text"], logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"] = "", [], [], []


def _ids(*replace):
    def lie(completion, choice, logprobs):
        tokens = [f"token_id:{i}" for i in GREEDY[:4]]
        for index, fake in replace:
            tokens[index] = fake
        logprobs["tokens"], logprobs["top_logprobs"] = tokens, [{t: -0.1} for t in tokens]
    return lie


def _parts_of_characters(text):
    """Four steps that each hold part of a character (empty token texts), and ``text``."""
    def lie(completion, choice, logprobs):
        logprobs.update(tokens=[""] * 4, top_logprobs=[{"": -0.1}] * 4)
        choice["text"] = text
    return lie


def _set(field, value):
    def lie(completion, choice, logprobs):
        target = {"completion": completion, "choice": choice, "logprobs": logprobs}[field.partition(".")[0]]
        *path, last = field.split(".")[1:]
        for key in path:
            target = target[key]
        target[last] = value(target[last]) if callable(value) else value
    return lie


LIES = {
    "5x the tokens": (times_five, "choices[0].logprobs.tokens: 20 tokens for max_tokens=4"),
    "no tokens": (_no_tokens,
                  "choices[0].logprobs.tokens: no tokens, yet finish_reason 'length' for max_tokens=4"),
    "one top-k for four tokens": (_set("logprobs.top_logprobs", lambda v: v[:1]),
                                  "choices[0].logprobs.top_logprobs: 1 steps for 4 tokens"),
    "no candidates": (_set("logprobs.top_logprobs", lambda v: [{}] * len(v)),
                      "choices[0].logprobs.top_logprobs[0]: 0 candidates"),
    "nine candidates": (_set("logprobs.top_logprobs", lambda v: [{f"t{i}": -1.0 - i for i in range(9)}] * 4),
                        "choices[0].logprobs.top_logprobs[0]: 9 candidates"),
    "id 100000": (_ids((1, "token_id:100000")),
                  ("choices[0].logprobs.tokens[1]: 'token_id:100000' is no id of the tokenizer's vocabulary "
                   "(0 to 511)")),
    "negative id": (_ids((2, "token_id:-3")), "choices[0].logprobs.tokens[2]: 'token_id:-3' is no id"),
    "huge id": (_ids((0, "token_id:" + "9" * 5000)), "choices[0].logprobs.tokens[0]: 'token_id:999"),
    # under the default 16 MB body limit (the token and its top-k entry): refused as no token, not
    # recorded as a golden's text
    "a 6 MB token": (_ids((1, "a" * 6_000_000)),
                     ("choices[0].logprobs.tokens[1]: a token of 6000000 characters, 'aaaaaaaaaaaaaaaaa...'; "
                      "no tokenizer's token is longer than 1024")),
    # An 8 MB text of 4 tokens, padded with spaces (which spelling ignores, tokenizers differing in
    # them) or under steps that hold part of a character: the server's answer, not the test's
    "an 8 MB text of spaces": (_set("choice.text", lambda t: t + " " * 8_000_000),
                               "choices[0].text: 8,000,014 characters ('The cat sat on   ...') for 4 tokens, "
                               "where no token is longer than 1024 (at most 4,096 in all); #max_response_mb= "
                               "caps the body read"),
    "an 8 MB text under parts of characters": (
        _parts_of_characters("a" * 8_000_000),
        "choices[0].text: 8,000,000 characters ('aaaaaaaaaaaaaaaaa...') for 4 tokens"),
    "NaN": (_set("logprobs.token_logprobs", lambda v: [float("nan")] * len(v)),
            '"token_logprobs": [NaN, NaN'),
    "all -Infinity": (_set("logprobs.top_logprobs", lambda v: [{k: float("-inf") for k in t} for t in v]),
                      '[{"The": -Infinity, " zebra": -Infinity}'),
    "a logprob of the wrong type": (_set("logprobs.token_logprobs", lambda v: [*v[:-1], "-0.1"]),
                                    "got `str` - at `$.choices[0].logprobs.token_logprobs[3]`"),
    "a probability above 1": (_set("logprobs.top_logprobs", lambda v: [dict.fromkeys(t, 0.5) for t in v]),
                              "choices[0].logprobs.top_logprobs[0]['The']: 0.5 is no log-probability"),
    "tokens of the wrong type": (_set("logprobs.tokens", lambda v: list(range(len(v)))),
                                 "Expected `str`, got `int` - at `$.choices[0].logprobs.tokens[0]`"),
    "two choices": (_set("completion.choices", lambda v: v * 2), "choices: 2 choices for n=1"),
    "no logprobs": (_set("choice.logprobs", None), "choices[0].logprobs: none"),
    "a text its tokens do not spell": (_set("choice.text", "The dog ran off"),
                                       ("choices[0].text: 'The dog ran off' is not what its tokens spell "
                                       "('The cat sat on')")),
    "a prompt count of the wrong type": (_set("completion.usage", {"prompt_tokens": "3"}),
                                         "Expected `int | null`, got `str` - at `$.usage.prompt_tokens`"),
    "a logprob of 1e308": (_set("logprobs.top_logprobs", lambda v: [{**t, " zebra": 1e308} for t in v]),
                           "choices[0].logprobs.top_logprobs[0][' zebra']: 1e+308 is no log-probability"),
    "10k top logprobs": (_set("logprobs.top_logprobs",
                              lambda v: [{**t, **{f"w{i}": -5.0 for i in range(10_000)}} for t in v]),
                         "choices[0].logprobs.top_logprobs[0]: 10002 candidates, where the request asked "
                         "for logprobs=5"),
}


@pytest.mark.parametrize("case", list(LIES))
def test_a_completion_that_cannot_be_right_is_refused_naming_the_field(serve, pieces, case):
    lie, says = LIES[case]
    server = serve(routes(pieces, lie))
    with pytest.raises(EngineError) as raised:
        generate(spec(server))
    message = str(raised.value)
    assert f"the server at {server.url}" in message and "POST /v1/completions" in message
    assert says in message and "\n" not in message


def test_a_logprob_of_minus_1e308_is_recorded_at_the_floor(serve, pieces):
    lie = _set("logprobs.top_logprobs", lambda v: [{**t, " zebra": -1e308} for t in v])
    _, result = generate(spec(serve(routes(pieces, lie))))
    assert result.text == "The cat sat on" and result.top_logprobs[0][1][1] == LOGPROB_FLOOR
    assert result.margins[0] == pytest.approx(-LOGPROB_FLOOR - 0.1)


def test_a_completion_for_another_model_is_refused_naming_both(serve, pieces):
    server = serve(routes(pieces, _set("completion.model", "tiny-but-another")))
    with pytest.raises(EngineError) as raised:
        generate(spec(server))
    assert f"the server at {server.url}, answering POST /v1/completions, answered for model " \
           "'tiny-but-another', where the request named 'tiny': it serves another model under that name, " \
           "or sends the request on to another. Nothing was recorded; check the server's models (GET " \
           "/v1/models), and name the one to test with #model=NAME" in str(raised.value)


def test_a_server_of_60000_models_is_named_by_its_first_20(serve, pieces):
    many = {"object": "list", "data": [{"id": f"model-{i:05d}"} for i in range(60_000)]}
    server = serve(routes(pieces, **{"/v1/models": respond(200, many)}))
    with pytest.raises(ConfigurationError) as raised:
        load(spec(server, model="tiny"), dtype="float32", device="cpu")
    message = str(raised.value)
    assert "the server serves ['model-00000', 'model-00001', " in message
    assert "'model-00019', ... and 59980 more]; name one with #model=NAME" in message
    assert "model-00020" not in message and len(message) < 1000


def test_a_number_beyond_a_double_is_named_by_its_field(serve, pieces):
    def answer(request: Request, connection: Connection) -> None:
        text = json.dumps(honest(request.json(), pieces))
        text = text.replace('"token_logprobs": [-0.1', '"token_logprobs": [-1e999')
        connection.respond(200, text)

    server = serve(routes(pieces, **{"/v1/completions": answer}))
    with pytest.raises(EngineError, match=r"Number out of range - at "
                                          r"`\$\.choices\[0\]\.logprobs\.token_logprobs\[0\]`"):
        generate(spec(server))


def _deep_field(kind: str, deep: int = 100_000) -> str:
    return {"array": "[" * deep + "]" * deep, "object": '{"a":' * deep + "1" + "}" * deep}[kind]


@pytest.mark.parametrize("kind", ["array", "object"])
@pytest.mark.parametrize("where", ["/v1/models", "/v1/completions"])
def test_json_nested_too_deep_in_an_unknown_field_is_one_engine_error(serve, pieces, where, kind):
    def deep(request: Request, connection: Connection) -> None:
        good = json.dumps(MODELS if where.endswith("models") else honest(request.json(), pieces))
        connection.respond(200, good[:-1] + f', "extra": {_deep_field(kind)}}}')

    server = serve(routes(pieces, **{where: deep}))
    with pytest.raises(EngineError) as raised:
        generate(spec(server))
    message = str(raised.value)
    method = "GET" if where.endswith("models") else "POST"
    assert f"the server at {server.url} answered {method} {where} with JSON nested too deep to decode " \
           "(maximum recursion depth exceeded" in message
    assert "Is it an OpenAI-compatible server" in message and "\n" not in message


def test_a_version_nested_too_deep_means_no_version(serve, pieces):
    deep = respond(200, f'{{"version": "9", "extra": {_deep_field("array", 30_000)}}}'.encode())  # < 64 KB
    server = serve(routes(pieces, **{"/version": deep}))
    loaded, result = generate(spec(server))
    assert loaded.describe["server_version"] is None and result.text == "The cat sat on"
