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
from pytest_llmdeterminism.engines import BUILTIN_MODELS, load
from pytest_llmdeterminism.engines.secret import RUN
from pytest_llmdeterminism.generation import LOGPROB_FLOOR

from .fake_openai_server import Connection, FakeServer, Request

TINY = BUILTIN_MODELS["tiny"]
KEY = "sk-hostile-0123456789abcdef"
KEY_ENV = "LLMDET_HOSTILE_TEST_KEY"
GREEDY = [273, 442, 445, 373, 272]  # "The cat sat on the", one token each in the tiny tokenizer
MODELS = {"object": "list", "data": [{"id": "tiny"}]}
MODELS_JSON = json.dumps(MODELS).encode()  # 44 bytes


@pytest.fixture
def serve():
    """Start fake servers with ``serve(answer)``; each stops when the test ends."""
    servers: list[FakeServer] = []

    def start(answer) -> FakeServer:
        servers.append(FakeServer(answer))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def pieces():
    from pytest_llmdeterminism.engines.hf import load_tokenizer

    tokenizer = load_tokenizer("tiny", TINY)
    return {i: tokenizer.decode([i]) for i in GREEDY}


def spec(server: FakeServer, **knobs: object) -> str:
    options = {"tokenizer": TINY, "reset_prefix": 0, **knobs}
    return f"openai:{server.url}#" + "&".join(f"{k}={v}" for k, v in options.items())


def honest(body: dict, pieces: dict[int, str]) -> dict:
    """A greedy completion of ``body``'s request, as llama-cpp-python's server shapes one."""
    texts = [pieces[i] for i in GREEDY[:body["max_tokens"]]]
    usage = {"prompt_tokens": len(body["prompt"])} if isinstance(body["prompt"], list) else {}
    return {"id": "cmpl-1", "object": "text_completion", "system_fingerprint": "fp-1", "usage": usage,
            "model": body["model"],
            "choices": [{"index": 0, "text": "".join(texts), "finish_reason": "length",
                         "logprobs": {"tokens": texts, "token_logprobs": [-0.1] * len(texts),
                                      "top_logprobs": [{t: -0.1, " zebra": -3.0} for t in texts]}}]}


def routes(pieces, lie=None, **special):
    """An answer that serves /v1/models, /version and honest completions, except that ``lie`` edits
    each completion and ``special`` maps a path to an answer of its own."""

    def answer(request: Request, connection: Connection) -> None:
        path = request.path.partition("?")[0]
        if path in special:
            special[path](request, connection)
        elif path == "/v1/models":
            connection.respond(200, MODELS)
        elif path == "/version":
            connection.respond(200, {"version": "fake-1.0"})
        elif path == "/v1/completions":
            completion = honest(request.json(), pieces)
            if lie is not None:
                lie(completion, completion["choices"][0], completion["choices"][0]["logprobs"])
            connection.respond(200, json.dumps(completion))  # NaN and Infinity as Python writes them
        else:
            connection.respond(404, "not found")

    return answer


def generate(spec_text: str, max_new_tokens: int = 4):
    from pytest_llmdeterminism.engines.model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    loaded = load(spec_text, dtype="float32", device="cpu")
    settings = GenerationSettings(BatchShape(1, 32), max_new_tokens, 0)
    return loaded, LLMModel(loaded, settings).generate("The cat")


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


def test_no_frame_on_the_request_path_holds_the_key_as_text(serve, pieces, monkeypatch):
    """``pytest -l`` prints every local of every frame of a failure: none may be the key, the header
    or a dict holding it. Every line run in the plugin and in ``http.client`` is watched, through a
    whole load, a generation and a failing request; bytes on their way to the socket aside."""
    import http.client
    import sys
    from pathlib import Path

    import pytest_llmdeterminism

    monkeypatch.setenv(KEY_ENV, KEY)
    failing = {"/v1/completions": _answer(500, {"error": "overloaded"})}
    good, bad = serve(routes(pieces)), serve(routes(pieces, **failing))
    package = Path(pytest_llmdeterminism.__file__).parent
    watched, box = (str(package), http.client.__file__), str(package / "engines" / "secret.py")
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


def _answer(status: int, body: bytes | dict):
    return lambda request, connection: connection.respond(status, body)


def _answer_with(status: int, body: str, headers: dict[str, str]):
    return lambda request, connection: connection.respond(status, body, headers)


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
    "not JSON": (_answer(200, b"<html>hello</html>"), "malformed JSON"),
    "not UTF-8": (_answer(200, b'{"data": [{"id": "\xff"}]}'), "malformed JSON"),
    "wrong shape": (_answer(200, {"data": "tiny"}),
                    "an answer of the wrong shape (Expected `array`, got `str` - at `$.data`)"),
    "wrong type": (_answer(200, {"data": [{"id": 7}]}), "Expected `str`, got `int` - at `$.data[0].id`"),
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
    "a gzip bomb": (_answer(200, gzip.compress(b"[" * 10_000_000)), "malformed JSON (JSON is malformed: "
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
    server = serve(routes(pieces, **{"/v1/models": _answer_with(503, "busy", {"Retry-After": "5"})}))
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
    limited = _answer_with(429, "rate limit reached", {"Retry-After": "0"})
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


@pytest.mark.parametrize("status", [401, 404, 501])
def test_another_error_on_the_first_completion_is_raised_not_taken_for_a_refusal_of_token_ids(serve, pieces,
                                                                                              status):
    server = serve(routes(pieces, **{"/v1/completions": _answer(status, {"error": "no"})}))
    with pytest.raises(EngineError, match=f"answered POST /v1/completions with HTTP {status}"):
        generate(spec(server))
    assert [type(r.json()["prompt"]) for r in server.requests if r.path == "/v1/completions"] == [list]


# --- answers that cannot be right ---

def _times_five(completion, choice, logprobs):
    for key in ("tokens", "token_logprobs", "top_logprobs"):
        logprobs[key] *= 5
    choice["text"] *= 5


def _no_tokens(completion, choice, logprobs):
    choice["text"], logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"] = "", [], [], []


def _ids(*replace):
    def lie(completion, choice, logprobs):
        tokens = [f"token_id:{i}" for i in GREEDY[:4]]
        for index, fake in replace:
            tokens[index] = fake
        logprobs["tokens"], logprobs["top_logprobs"] = tokens, [{t: -0.1} for t in tokens]
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
    "5x the tokens": (_times_five, "choices[0].logprobs.tokens: 20 tokens for max_tokens=4"),
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
    server = serve(routes(pieces, **{"/v1/models": _answer(200, many)}))
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


# --- the whole run ---

SUITE = """
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=4)
def test_cat(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The cat"))
"""


@pytest.mark.parametrize("lying", [False, True], ids=["honest", "lying"])
def test_an_update_run_records_an_honest_server_and_nothing_of_a_lying_one(pytester, serve, pieces, lying):
    server = serve(routes(pieces, _times_five if lying else None))
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

@deterministic(max_new_tokens=16)
def test_echo(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The cat"))
"""
# How a served completion can carry the key: whole in one token, split over two, or over tokens of
# three characters each, none of which holds enough of it to be recognised alone.
KEY_TOKENS = {
    "one token": [f" {KEY}"],
    "two tokens": [f" {KEY[:13]}", KEY[13:]],
    "tokens of 3 characters": [" "] + [KEY[i:i + 3] for i in range(0, len(KEY), 3)],
}


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
def test_a_key_the_server_generates_is_in_no_golden_candidate_report_or_output(pytester, serve, pieces,
                                                                              monkeypatch, split):
    monkeypatch.setenv(KEY_ENV, KEY)
    says = {"first": "The"}
    server = serve(routes(pieces, **{"/v1/completions": lambda r, c: _echoing(split, says["first"])(r, c)}))
    pytester.makeini(f"[pytest]\nllm_model = {spec(server, api_key_env=KEY_ENV)}\nllm_batch_shape = 1x32\n")
    pytester.makepyfile(test_served=KEY_SUITE)
    reports = ["--llm-report=r.json", "--llm-report=r.md", "--llm-report=r.html"]
    recorded = pytester.runpytest("--llm-golden-update", "-p", "no:randomly", "-rA", *reports)
    recorded.assert_outcomes(passed=1)
    golden = (pytester.path / "__golden__" / "test_served.json").read_text()
    assert '"text": "The ***"' in golden and '"system_fingerprint": "fp-***"' in golden
    says["first"] = " A"  # a changed model: the check fails, and its candidate and reports are written
    failed = pytester.runpytest("-p", "no:randomly", "-l", "--llm-golden-artifacts=artifacts", *reports)
    failed.assert_outcomes(failed=1)
    assert "REGRESSION at step 0" in failed.stdout.str()
    written = {path: path.read_text() for path in pytester.path.rglob("*")  # Python's bytecode aside
               if path.is_file() and "__pycache__" not in path.parts}
    assert any("artifacts" in path.parts for path in written)
    assert {path.name for path in written} >= {"r.json", "r.md", "r.html", "test_served.json"}
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
    server = serve(routes(pieces, **{where: _answer(500, {"error": "overloaded"})}))
    pytester.makeini(f"[pytest]\nllm_model = {spec(server, api_key_env=KEY_ENV)}\nllm_batch_shape = 1x32\n")
    pytester.makepyfile(test_served=SUITE)
    result = pytester.runpytest("--full-trace", "-l", "--junitxml=junit.xml", "-p", "no:randomly")
    output = result.stdout.str() + result.stderr.str()
    xml = (pytester.path / "junit.xml").read_text()
    assert result.ret != pytest.ExitCode.OK
    assert f"answered {'GET' if where.endswith('models') else 'POST'} {where} with HTTP 500" in output
    assert KEY not in output and KEY not in xml


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
    deep = _answer(200, f'{{"version": "9", "extra": {_deep_field("array", 30_000)}}}'.encode())  # < 64 KB
    server = serve(routes(pieces, **{"/version": deep}))
    loaded, result = generate(spec(server))
    assert loaded.describe["server_version"] is None and result.text == "The cat sat on"
