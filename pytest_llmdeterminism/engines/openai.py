"""Any OpenAI-compatible server (``openai:URL#model=NAME&tokenizer=PATH``): the model as it is served.

A server returns tokens as text and the top-k logprobs of each step, never raw logits, so that is
what gets recorded: the step hash is :data:`~generation.SERVED_HASH_DEFINITION` (over the returned
texts and logprobs), and a golden says so; hashes of two definitions are never compared.

The plugin needs the served model's tokenizer locally (``tokenizer=``: a folder or ``.gguf``): it
tokenises prompts and renders chat templates exactly as the transformers backend does, and maps
each returned token text back to its id, so goldens of a server and of an in-process engine line
up. Each request is checked: the server must count the prompt's tokens as the local tokenizer does,
and each step's token must be the best of the returned top-k (greedy), else the test fails naming
what to check.

Pinned per request, one request at a time: ``temperature=0``, ``top_p=1``, no penalties
(``frequency_penalty``/``presence_penalty`` 0, and the llama.cpp and vLLM extensions
``repeat_penalty``/``repetition_penalty`` 1: llama-cpp-python's server defaults to 1.1), ``n=1``,
the test's ``seed``, ``logprobs=5``, ``cache_prompt=false`` (llama.cpp's own server). Recorded: the
served model id, the server's version where it offers ``/version``, and each response's
``system_fingerprint``.

A server may reuse the previous request's prompt cache for a shared prefix, and then evaluates
the rest of the prompt in another split, with other numerics: llama-cpp-python's server always
does (measured on SmolLM2 Q4_1: the same request gives logprob -1.6317 after itself and -1.7045
after another prompt), so a golden would depend on the order tests ran in. Before each request
the plugin therefore sends a one-token request that starts with another token (``reset_prefix=1``,
the default; ``#reset_prefix=0`` turns it off), so every prompt is evaluated whole.

The server is an untrusted peer. Each request goes to the spec's URL only: no redirect is
followed (a 3xx fails naming its ``Location``) and no proxy is used, so the API key (read from the
environment variable ``api_key_env=`` names; a URL with ``USER:PASSWORD@`` is refused) reaches that
origin alone, and it is shown as ``***`` wherever a message quotes the server. Each request has
one total deadline, from connecting to the last byte (``timeout=``, 120 s by default; the DNS
lookup and the TLS handshake aside), and a size limit (``max_response_mb=``, 16 MB by default),
both enforced while reading. Every answer is decoded into typed structures and checked against
the request before anything is recorded: one choice; as many top-k lists as tokens, and no more
tokens than ``max_tokens`` (llama-cpp-python may add up to 3 that finish a character it cut);
1 to ``logprobs + 1`` candidates per step; finite logprobs at most 0; ``token_id:N`` ids inside the
tokenizer's vocabulary; a ``text`` that its tokens spell. Any failure is one :class:`EngineError`
naming the server and the request.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import msgspec

from pytest_llmdeterminism.engines.capture import Chunk, RowSteps
from pytest_llmdeterminism.engines.hf import checkpoint_eos_ids, load_tokenizer
from pytest_llmdeterminism.errors import ConfigurationError, EngineError, ModelLoadError
from pytest_llmdeterminism.generation import TEXT_ONLY_IDS, TOP_K, refuse_beyond
from pytest_llmdeterminism.shape import (
    GenerationSettings,
    engine_params,
    flag,
    refuse_credentials,
    without_credentials,
)

if TYPE_CHECKING:
    import socket

# The API key is read from the environment variable ``api_key_env`` names: a key never sits in a
# spec, which the header, the load line and every error show.
KNOBS: dict[str, tuple[Any, Any]] = {"model": (str, None), "tokenizer": (str, None), "dtype": (str, "unknown"),
                                     "timeout": (float, 120.0), "max_response_mb": (float, 16.0),
                                     "api_key_env": (str, None), "reset_prefix": (flag, True)}
GREEDY_SLACK = 1e-6  # a returned logprob may be rounded: the chosen token may trail the best by this
# A float32 log-softmax of a near-certain token can land a few ulps above 0 (ulp ~1e-5 at logits
# ~100); a logprob further above 0 is a probability above 1, a lie.
POSITIVE_SLACK = 1e-3
VERSION_DEADLINE = 10.0  # seconds for the optional GET /version, within the spec's timeout
VERSION_MAX_BYTES = 64 * 1024
ERROR_BODY_BYTES = 64 * 1024  # of a 4xx/5xx answer, read for its message
SHOWN_CHARS = 300  # of a server's text in a message
UNTRUE = "Nothing was recorded; check the server (its log, its version) and that #tokenizer= is its tokenizer"
_T = TypeVar("_T")


def load(spec: str, target: str, params: dict[str, str], *, dtype: str, device: str) -> dict[str, Any]:
    """The LoadedModel fields for ``openai:URL#...``: the server is asked for its models once."""
    __tracebackhide__ = True
    refuse_credentials(spec)  # before anything prints the spec
    check_url(spec, target)
    knobs = engine_params(spec, params, KNOBS)
    for knob, example in (("timeout", "300"), ("max_response_mb", "64")):
        if not (math.isfinite(knobs[knob]) and knobs[knob] > 0):
            raise ConfigurationError("llm_model", spec, f"option {knob}={params[knob]!r} must be a positive "
                                     f"number, e.g. #{knob}={example}")
    if knobs["tokenizer"] is None:
        raise ConfigurationError("llm_model", spec, "name the served model's tokenizer, a local folder or .gguf "
                                 "file: openai:URL#model=NAME&tokenizer=PATH (the plugin tokenises prompts and "
                                 "maps returned tokens to ids with it; it never downloads one)")
    if dtype != "float32":
        raise ConfigurationError("llm_dtype", dtype, "a server runs in its own dtype; say which in the spec "
                                 f"(openai:URL#tokenizer=PATH&dtype={dtype}: recorded, and it sets the tie margin)")
    tokenizer_path = Path(knobs["tokenizer"])
    if not tokenizer_path.exists():
        raise ModelLoadError(spec, f"no such tokenizer folder or .gguf file: {knobs['tokenizer']!r}")
    api_key = None
    if knobs["api_key_env"] is not None:
        api_key = os.environ.get(knobs["api_key_env"])
        if not api_key:
            raise ConfigurationError("llm_model", spec, f"api_key_env={knobs['api_key_env']} names an environment "
                                     "variable that is not set")
        if not (api_key.isascii() and api_key.isprintable()) or any(c.isspace() for c in api_key):
            raise ConfigurationError("llm_model", spec, f"the key in ${knobs['api_key_env']} holds a space, "
                                     "a line break or a non-ASCII character, which no HTTP header can carry; "
                                     "set it to the key alone")
    client = Client(spec, target, timeout=knobs["timeout"], max_bytes=int(knobs["max_response_mb"] * 1e6),
                    api_key=api_key)
    served = [client.redact(m.id) for m in client.get("models", ModelList).data]
    model = knobs["model"]
    if model is None and len(served) == 1:
        model = served[0]
    if model is None or (served and model not in served):
        raise ConfigurationError("llm_model", spec, f"the server serves {served or 'no models'}; name one "
                                 "with #model=NAME")
    version = client.version()
    tokenizer = load_tokenizer(spec, tokenizer_path)
    describe = {
        "engine": "openai",
        "device_class": "served",
        "dtype": knobs["dtype"],  # what the server runs: unknown to the client unless the spec says
        "server": client.base,
        "server_model": model,
        "server_version": version,
        "reset_prefix": knobs["reset_prefix"],
        "rows_alone": True,  # one request at a time
        "model": model,
        "weights_file": None,
    }
    # A tokenizer folder's generation config names the stop tokens, as it does for transformers.
    eos = checkpoint_eos_ids(tokenizer_path, tokenizer) if tokenizer_path.is_dir() else None
    engine = OpenAIEngine(spec, client, model, tokenizer, reset_prefix=knobs["reset_prefix"], eos=eos)
    return {"kind": "openai", "path": tokenizer_path, "model": client, "tokenizer": tokenizer, "dtype": knobs["dtype"],
            "device": "served", "engine": engine, "describe": describe}


def check_url(spec: str, target: str) -> None:
    """Refuse a server URL that is not plain ``http(s)://HOST[:PORT]/PATH``."""
    __tracebackhide__ = True
    from urllib.parse import urlsplit

    expected = "expected openai:http://HOST:PORT/v1#tokenizer=PATH (and &model=NAME if it serves several)"
    problem = None
    if not target.startswith(("http://", "https://")):
        problem = "is not an http:// or https:// URL"
    else:
        try:
            parts = urlsplit(target)
            parts.port  # noqa: B018 - parsed here, where a bad port can be named
        except ValueError as error:
            problem = f"is not a valid URL ({error})"
        else:
            problem = None if parts.hostname else "names no host"
    if problem is not None:
        raise ConfigurationError("llm_model", spec, f"{target!r} {problem}; {expected}")


class Client:
    """JSON over HTTP with ``http.client``: one origin, no redirects, no proxy, one deadline and one
    size limit per request. The first transport failure is kept: every later request fails at once
    with the same message instead of waiting for a deadline each."""

    def __init__(self, spec: str, url: str, *, timeout: float, max_bytes: int, api_key: str | None) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self.spec, self.timeout, self.max_bytes, self._api_key = spec, timeout, max_bytes, api_key
        self.base = f"{parts.scheme}://{parts.netloc}{parts.path}".rstrip("/")  # what messages show
        self._https, self._host, self._port = parts.scheme == "https", parts.hostname or "", parts.port
        self._path = parts.path.rstrip("/")
        self._query = f"?{parts.query}" if parts.query else ""
        self.down: EngineError | None = None

    def get(self, path: str, into: type[_T]) -> _T:
        return self._request("GET", path, None, into)

    def post(self, path: str, body: dict[str, Any], into: type[_T]) -> _T:
        return self._request("POST", path, body, into)

    def request_line(self, method: str, path: str) -> str:
        return f"{method} {self._path}/{path}"

    def redact(self, text: str) -> str:
        """``text`` with the API key, as sent and as JSON escapes it, shown as ``***``."""
        if self._api_key:
            for form in {self._api_key, json.dumps(self._api_key)[1:-1]}:
                text = text.replace(form, "***")
        return text

    def version(self) -> str | None:
        """The server's own version where it offers one (vLLM: ``GET /version``, beside ``/v1``); no key
        is sent, and any failure means "none"."""
        import http.client

        root = self._path.removesuffix("/v1")
        try:
            status, _, payload = self._exchange("GET", f"{root}/version", None,
                                                {"Accept": "application/json"}, request="GET /version",
                                                seconds=min(self.timeout, VERSION_DEADLINE),
                                                max_bytes=VERSION_MAX_BYTES)
            version = msgspec.json.decode(payload, type=ServerVersion).version if status == 200 else ""
        except (OSError, ValueError, EngineError, http.client.HTTPException):
            return None
        return self.redact(version) or None

    def _request(self, method: str, path: str, body: dict[str, Any] | None, into: type[_T]) -> _T:
        __tracebackhide__ = True
        import http.client  # here, not at module level: pytest loads the plugin on every run

        if self.down is not None:
            raise self.down.with_traceback(None)
        request = self.request_line(method, path)
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        data = None if body is None else json.dumps(body).encode()
        try:
            status, location, payload = self._exchange(method, f"{self._path}/{path}{self._query}", data,
                                                       headers, request=request, seconds=self.timeout,
                                                       max_bytes=self.max_bytes)
        except (OSError, ValueError, http.client.HTTPException) as error:
            self.down = EngineError(self.spec, f"the server at {self.base} did not answer {request} "
                                    f"{self._transport_problem(error)}; every later test that uses it fails "
                                    "with this message")
            raise self.down.with_traceback(None) from None
        answered = f"the server at {self.base} answered {request} with"
        if 300 <= status < 400:
            shown = self.redact(without_credentials(location or "nowhere"))[:SHOWN_CHARS]
            raise EngineError(self.spec, f"{answered} HTTP {status}, a redirect to {shown!r}. Redirects "
                              "are not followed (the request and its API key go to the spec's URL only): put "
                              "the final URL in the spec")
        if not 200 <= status < 300:
            detail = self.redact(payload.decode(errors="replace"))[:SHOWN_CHARS]
            hint = " (an OpenAI-compatible API lives under /v1: does the URL end in /v1?)"
            hint = hint if status == 404 else ""
            raise HTTPStatusError(self.spec, status, f"{answered} HTTP {status}{hint}: {detail!r}")
        try:
            return msgspec.json.decode(payload, type=into)
        except msgspec.MsgspecError as error:
            logprobs = (" with the completions API's per-token logprobs (llama-cpp-python: logits_all, the "
                        "default)" if path == "completions" else "")
            raise EngineError(self.spec, f"{answered} {self._decode_problem(payload, error)}. Is it an "
                              f"OpenAI-compatible server{logprobs}, at this URL?") from None

    def _exchange(self, method: str, target: str, data: bytes | None, headers: dict[str, str], *,
                  request: str, seconds: float, max_bytes: int) -> tuple[int, str | None, bytes]:
        """One request on a fresh connection: ``(status, Location, body)``, the body read within
        ``max_bytes`` (a 4xx/5xx body is cut at ERROR_BODY_BYTES) and all of it within ``seconds``."""
        __tracebackhide__ = True
        import http.client

        deadline = time.monotonic() + seconds
        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        connection = kind(self._host, self._port, timeout=seconds)
        raw: socket.socket | None = None
        try:
            connection.connect()
            raw = connection.sock
            # Every later send and read waits only until the deadline, however the server trickles.
            connection.sock = _DeadlineSocket(raw, deadline)
            connection.request(method, target, body=data, headers=headers)
            response = connection.getresponse()
            if 300 <= response.status < 400:
                return response.status, response.getheader("Location"), b""
            success = 200 <= response.status < 300
            declared = response.length  # None where chunked or not given
            if success and declared is not None and declared > max_bytes:
                raise self._too_large(request, declared, max_bytes)
            chunks, total = [], 0
            while chunk := response.read(64 * 1024):
                total += len(chunk)
                chunks.append(chunk)
                if not success and total >= ERROR_BODY_BYTES:
                    break
                if total > max_bytes:
                    raise self._too_large(request, None, max_bytes)
            if success and declared is not None and total < declared:
                raise http.client.IncompleteRead(b"", declared - total)
            return response.status, None, b"".join(chunks)
        finally:
            connection.close()
            if raw is not None:
                raw.close()

    def _too_large(self, request: str, declared: int | None, max_bytes: int) -> EngineError:
        size = "a body" if declared is None else f"a body of {declared / 1e6:,.1f} MB"
        return EngineError(self.spec, f"the server at {self.base} answered {request} with {size} "
                           f"above the {max_bytes / 1e6:g} MB limit (#max_response_mb=); refused without "
                           "reading it all. A completion is a few KB: check the URL, and raise the limit "
                           "only for a server that really sends more")

    def _transport_problem(self, error: BaseException) -> str:
        detail = self.redact(str(error))[:SHOWN_CHARS]
        if isinstance(error, TimeoutError):
            return (f"within its {self.timeout:g} s deadline (#timeout=, the whole request from connecting "
                    "to the last byte). Is it overloaded or stuck? If it is only slow, raise the deadline, "
                    "e.g. #timeout=600")
        if isinstance(error, OSError):
            return f"({type(error).__name__}: {detail}). Is it running, at this URL? If it was, check its log"
        kind = type(error).__name__
        shown = detail if detail.startswith(kind) else f"{kind}: {detail!r}"
        return f"with valid HTTP ({shown}). Is it an HTTP server, at this URL? Check its log"

    def _decode_problem(self, payload: bytes, error: msgspec.MsgspecError) -> str:
        """What is wrong with a 2xx body: msgspec names the field of a wrong type; for malformed JSON,
        the bytes around where decoding stopped."""
        if isinstance(error, msgspec.ValidationError):
            return f"an answer of the wrong shape ({error})"
        offset = re.search(r"\(byte (\d+)\)", str(error))
        if offset is None:
            return f"malformed JSON ({error})"
        at = int(offset[1])
        excerpt = self.redact(payload[max(at - 40, 0):at + 40].decode(errors="replace"))
        why = "; JSON has no NaN or Infinity" if "NaN" in excerpt or "Infinity" in excerpt else ""
        return f"malformed JSON ({error}, near {excerpt!r}{why})"


class _DeadlineSocket:
    """The connection's socket as ``http.client`` uses it (``sendall``, ``makefile``, ``close``):
    before each send and each read, the socket's timeout is set to what is left of the deadline.
    The socket itself is closed by the request once the response is read."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock, self._deadline = sock, deadline

    def arm(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline passed")
        self._sock.settimeout(left)

    def sendall(self, data: bytes) -> None:
        self.arm()
        self._sock.sendall(data)

    def recv_into(self, buffer: Any) -> int:
        self.arm()
        return self._sock.recv_into(buffer)

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self))

    def close(self) -> None:
        pass  # http.client closes it as soon as the headers say "close"; the body is still to read


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock: _DeadlineSocket) -> None:
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._sock.recv_into(buffer)


class HTTPStatusError(EngineError):
    def __init__(self, spec: str, status: int, message: str) -> None:
        self.status = status
        super().__init__(spec, message)


# What a server's answers are decoded into: a field of another type fails decoding, naming it.
class ServedModel(msgspec.Struct):
    id: Annotated[str, msgspec.Meta(max_length=SHOWN_CHARS)]


class ModelList(msgspec.Struct):
    data: list[ServedModel]


class ServerVersion(msgspec.Struct):
    version: Annotated[str, msgspec.Meta(max_length=100)]


class Logprobs(msgspec.Struct):
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]
    token_logprobs: list[float | None] | None = None


class Choice(msgspec.Struct):
    logprobs: Logprobs | None = None
    text: str | None = None
    finish_reason: str | None = None


class Usage(msgspec.Struct):
    prompt_tokens: int | None = None


class Completion(msgspec.Struct):
    choices: list[Choice]
    usage: Usage | None = None
    system_fingerprint: Annotated[str, msgspec.Meta(max_length=SHOWN_CHARS)] | None = None


class OpenAIEngine:
    name = "openai"
    hash_definition = "served-topk"
    runs_rows_alone = True  # one request at a time

    def __init__(self, spec: str, client: Client, model: str, tokenizer: Any, *, reset_prefix: bool = True,
                 eos: list[int] | None = None) -> None:
        self._spec, self._client, self._model, self._tokenizer = spec, client, model, tokenizer
        self._reset_prefix = reset_prefix
        self._eos = eos if eos is not None else ([] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)])
        self._send_ids: bool | None = None  # unknown until the first request
        self._zero: list[int] | None = None  # the first token of "0", once
        self._ids: dict[str, int] | None = None

    def _other_start(self, ids: list[int]) -> str:
        """A one-token prompt that shares no first token with ``ids`` (past a BOS both would have)."""
        first = next((t for t in ids if t != self._tokenizer.bos_token_id), None)
        if self._zero is None:
            self._zero = list(self._tokenizer("0", add_special_tokens=False)["input_ids"][:1])
        return "1" if self._zero == [first] else "0"

    def eos_token_ids(self) -> list[int]:
        return list(self._eos)

    def vocab_size(self) -> int:
        return len(self._tokenizer)

    def run(self, rows: list[list[int]], config: dict[str, Any], settings: GenerationSettings,
            keep_logits: bool) -> Chunk:
        __tracebackhide__ = True
        refuse_beyond("an OpenAI-compatible server", config, keep_logits=keep_logits, has_logits=False,
                      logprobs_after_penalties=False)
        out = Chunk(tokens=[], steps=[], texts=[], pieces=[], finish_reasons=[])
        request = self._client.request_line("POST", "completions")
        source = f"the server at {self._client.base}, answering {request},"
        for ids in rows:
            if self._reset_prefix:
                self._client.post("completions", {"model": self._model, "prompt": self._other_start(ids),
                                                  "max_tokens": 1, "temperature": 0.0}, object)
            response = self._complete(ids, config, settings.seed)
            row = parse_choice(self._spec, response, prompt_tokens=len(ids),
                               max_tokens=config["max_new_tokens"], vocab_size=self.vocab_size(),
                               token_id=self.token_id, tokenizer=self._tokenizer, source=source)
            out.tokens.append(row.tokens)
            out.steps.append(row.steps)
            assert out.texts is not None and out.pieces is not None and out.finish_reasons is not None
            out.texts.append(row.text)
            out.pieces.append(row.pieces)
            out.finish_reasons.append(row.finish_reason)
            fingerprint = response.system_fingerprint and self._client.redact(response.system_fingerprint)
            out.flags = {"system_fingerprint": fingerprint, "temperature": 0, "requests": "one at a time",
                         "prompt_sent_as": "token ids" if self._send_ids else "text"}
        return out

    def _complete(self, ids: list[int], config: dict[str, Any], seed: int) -> Completion:
        """The completion, the prompt sent as its token ids where the server takes them (the API allows
        it; vLLM does), else as text, which the server tokenises (llama-cpp-python)."""
        __tracebackhide__ = True
        if self._send_ids is not False:
            try:
                response = self._client.post("completions", request_body(self._model, ids, config, seed),
                                             Completion)
            except HTTPStatusError:
                if self._send_ids:
                    raise
                self._send_ids = False  # refused (llama-cpp-python answers 500 to a list): text it is
            else:
                self._send_ids = True
                return response
        text = self._tokenizer.decode(ids)
        return self._client.post("completions", request_body(self._model, text, config, seed), Completion)

    def token_id(self, text: str) -> int:
        """The local tokenizer's id for a returned token text: ``token_id:N`` as vLLM returns it (asked
        with ``return_tokens_as_token_ids``), else the one token that decodes to it (the lowest id if
        several do), else a stable id above the vocabulary (``TEXT_ONLY_IDS``)."""
        exact = _exact_id(text)
        if exact is not None:
            return exact
        if self._ids is None:
            pieces = self._tokenizer.batch_decode([[i] for i in range(len(self._tokenizer))])
            self._ids = {}
            for index, piece in enumerate(pieces):
                self._ids.setdefault(piece, index)
        return self._ids.get(text, text_only_id(text))


def _exact_id(text: str) -> int | None:
    """N of ``token_id:N``; None for any other text."""
    digits = text[9:] if text.startswith("token_id:") else ""
    return int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 12 else None


def text_only_id(text: str) -> int:
    import xxhash

    return TEXT_ONLY_IDS + xxhash.xxh32_intdigest(text.encode())


def request_body(model: str, prompt: str | list[int], config: dict[str, Any], seed: int) -> dict[str, Any]:
    """One greedy completion request: every sampler knob a known server reads, set to neutral."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": config["max_new_tokens"],
        "min_tokens": config["min_new_tokens"],  # vLLM and llama-cpp-python; others ignore it
        "temperature": 0.0,
        "top_p": 1.0,
        "n": 1,
        "stream": False,
        "echo": False,
        "logprobs": TOP_K,
        "seed": seed,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "repeat_penalty": config["repetition_penalty"],  # llama-cpp-python (its default is 1.1)
        "repetition_penalty": config["repetition_penalty"],  # vLLM
        "cache_prompt": False,  # llama.cpp's server: evaluate the whole prompt, whatever came before
        "return_tokens_as_token_ids": True,  # vLLM: tokens as "token_id:N", exact where text is not
    }


def implausible(completion: Completion, *, max_tokens: int, vocab_size: int) -> str | None:
    """What makes ``completion`` impossible as the answer to a request for ``max_tokens`` greedy
    tokens with ``logprobs=TOP_K``, as ``field: problem``; None where nothing does."""
    if len(completion.choices) != 1:
        return f"choices: {len(completion.choices)} choices for n=1"
    choice = completion.choices[0]
    logprobs = choice.logprobs
    field = "choices[0].logprobs"
    if logprobs is None:
        return (f"{field}: none, where the request asked for logprobs={TOP_K}; the server must support the "
                "completions API's per-token logprobs (llama-cpp-python: logits_all, the default)")
    steps = len(logprobs.tokens)
    # llama-cpp-python finishes a character that max_tokens cut: up to 3 more steps, each a part of it.
    beyond = logprobs.tokens[max_tokens:]
    if len(beyond) > 3 or not all(map(_part_of_character, beyond)):
        return f"{field}.tokens: {steps} tokens for max_tokens={max_tokens}"
    if steps == 0 and choice.finish_reason != "stop":
        return (f"{field}.tokens: no tokens, yet finish_reason {choice.finish_reason!r} for "
                f"max_tokens={max_tokens} (only a stop ends a completion before its first token)")
    if len(logprobs.top_logprobs) != steps:
        return f"{field}.top_logprobs: {len(logprobs.top_logprobs)} steps for {steps} tokens"
    chosen = logprobs.token_logprobs
    if chosen is not None and len(chosen) != steps:
        return f"{field}.token_logprobs: {len(chosen)} steps for {steps} tokens"
    for step, (text, top) in enumerate(zip(logprobs.tokens, logprobs.top_logprobs)):
        candidates = top or {}
        if not 1 <= len(candidates) <= TOP_K + 1:
            return (f"{field}.top_logprobs[{step}]: {len(candidates)} candidates, where the request asked "
                    f"for logprobs={TOP_K} (1 to {TOP_K + 1} with the chosen token)")
        values = [(f"top_logprobs[{step}][{_short(t)!r}]", v) for t, v in candidates.items()]
        own = None if chosen is None else chosen[step]
        if own is not None:
            values.append((f"token_logprobs[{step}]", own))
        elif text not in candidates:
            return f"{field}.tokens[{step}]: {_short(text)!r} has no logprob, here or in its top_logprobs"
        for where, value in values:
            if not (math.isfinite(value) and value <= POSITIVE_SLACK):
                return f"{field}.{where}: {value!r} is no log-probability (finite, at most 0)"
        for where, token in [(f"tokens[{step}]", text), *((f"top_logprobs[{step}]", t) for t in candidates)]:
            exact = _exact_id(token)
            if token.startswith("token_id:") and (exact is None or exact >= vocab_size):
                return (f"{field}.{where}: {_short(token)!r} is no id of the tokenizer's vocabulary "
                        f"(0 to {vocab_size - 1})")
    return None


class ParsedRow:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.steps = RowSteps()
        self.pieces: list[str] = []
        self.exact: list[bool] = []  # the server returned the id itself, not only text
        self.text = ""
        self.finish_reason = "length"


def parse_choice(spec: str, response: Completion, *, prompt_tokens: int, max_tokens: int, vocab_size: int,
                 token_id: Callable[[str], int], tokenizer: Any = None,
                 source: str = "the server") -> ParsedRow:
    """One completion response as recorded steps, checked first (:func:`implausible`), then against the
    prompt's token count, greedy choice and its text. With ``tokenizer``, steps that returned part of a
    character are given their ids (see :func:`resolve_partial_characters`)."""
    __tracebackhide__ = True
    import xxhash

    problem = implausible(response, max_tokens=max_tokens, vocab_size=vocab_size)
    if problem is not None:
        raise EngineError(spec, f"{source} sent a completion that cannot be right: {problem}. {UNTRUE}")
    choice = response.choices[0]
    assert choice.logprobs is not None  # implausible() refuses a choice without them
    texts, tops, chosen = choice.logprobs.tokens, choice.logprobs.top_logprobs, choice.logprobs.token_logprobs
    counted = response.usage.prompt_tokens if response.usage is not None else None
    if counted is not None and counted != prompt_tokens:
        raise EngineError(spec, f"{source} counts {counted} prompt tokens where the local tokenizer counts "
                          f"{prompt_tokens}: #tokenizer= is not the served model's tokenizer (or the server adds "
                          "a BOS of its own)")
    row = ParsedRow()
    for step, (text, top) in enumerate(zip(texts, tops)):
        ranked = sorted((top or {}).items(), key=lambda p: (-p[1], p[0]))[:TOP_K]
        if text not in dict(ranked):  # implausible() made sure it has a logprob
            own = chosen[step] if chosen is not None else None
            ranked = ([(text, (top or {})[text] if own is None else own)] + ranked)[:TOP_K]
        logprob = dict(ranked)[text]
        if logprob < ranked[0][1] - GREEDY_SLACK:
            raise EngineError(spec, f"{source} did not decode greedily at step {step}: it chose "
                              f"{_short(text)!r} (logprob {logprob:.4f}) over {_short(ranked[0][0])!r} "
                              f"({ranked[0][1]:.4f}). A server-side sampler or penalty is in force; check "
                              "the server's defaults")
        step_hash = xxhash.xxh3_64_hexdigest(json.dumps([text, ranked], separators=(",", ":"),
                                                         ensure_ascii=False).encode())
        row.steps.append(step_hash, [token_id(t) for t, _ in ranked], [lp for _, lp in ranked])
        row.tokens.append(token_id(text))
        exact = _exact_id(text) is not None  # vLLM's exact ids: the piece is the tokenizer's text
        row.pieces.append(str(tokenizer.decode([row.tokens[-1]])) if exact and tokenizer is not None else text)
        row.exact.append(exact)
    row.text = "".join(row.pieces) if choice.text is None else choice.text
    if not _spelled(row, tokenizer):
        raise EngineError(spec, f"{source} sent a completion that cannot be right: choices[0].text: "
                          f"{_short(row.text)!r} is not what its tokens spell "
                          f"({_short(''.join(row.pieces))!r}). {UNTRUE}")
    row.finish_reason = "eos" if choice.finish_reason == "stop" else "length"
    if tokenizer is not None:
        resolve_partial_characters(row, tokenizer)
    return row


def _part_of_character(piece: str) -> bool:
    """Whether a returned token text is what servers return for part of a multi-byte character."""
    return piece == "" or "\ufffd" in piece or piece.startswith("bytes:")


def _short(text: str, chars: int = 80) -> str:
    return text if len(text) <= chars else f"{text[:chars - 3]}..."


def _spelled(row: ParsedRow, tokenizer: Any) -> bool:
    """Whether the row's pieces spell its text, whitespace aside (tokenizers differ in leading spaces and
    clean-up), as a pattern spells a glob: the pieces in order, each step whose text is unknown a ``*``
    (part of a character: ``""``, U+FFFD or vLLM's ``bytes:``; a special token, which the text leaves
    out; an exact id without a tokenizer to spell it)."""
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    segments = [""]
    for step, piece in enumerate(row.pieces):
        if _part_of_character(piece) or (row.exact[step] and (tokenizer is None or row.tokens[step] in special)):
            segments.append("")
        else:
            segments[-1] += "".join(piece.split())
    text = "".join(row.text.split())
    if len(segments) == 1:
        return text == segments[0]
    first, *middle, last = segments
    if len(first) + len(last) > len(text) or not (text.startswith(first) and text.endswith(last)):
        return False
    cursor, end = len(first), len(text) - len(last)
    for segment in middle:  # the earliest place of each is never worse for those after it
        found = text.find(segment, cursor, end)
        if found < 0:
            return False
        cursor = found + len(segment)
    return True


def _partial(row: ParsedRow, step: int) -> bool:
    return not row.exact[step] and (row.pieces[step] == "" or "\ufffd" in row.pieces[step])


def resolve_partial_characters(row: ParsedRow, tokenizer: Any) -> None:
    """A token that holds part of a multi-byte character (CJK, emoji) comes back from a server as
    empty text or U+FFFD, so its id is unknown. A run of such steps spans the characters of the
    completion text between the known pieces around it; where the tokenizer encodes that span to
    exactly as many tokens, those are the ids (greedy output is the tokenizer's own encoding there).
    Otherwise the steps keep their text-only ids, and compare by what the server returned."""
    cursor, step = 0, 0
    steps = len(row.pieces)
    while step < steps:
        piece = row.pieces[step]
        if not _partial(row, step):
            if not row.text.startswith(piece, cursor):
                return  # the pieces do not tile the text: nothing can be placed safely
            cursor, step = cursor + len(piece), step + 1
            continue
        end = step
        while end < steps and _partial(row, end):
            end += 1
        following = row.pieces[end] if end < steps else ""
        stop = row.text.find(following, cursor) if following else len(row.text)
        if stop < cursor:
            return
        ids = list(tokenizer(row.text[cursor:stop], add_special_tokens=False)["input_ids"])
        if len(ids) == end - step:
            for index, resolved in zip(range(step, end), ids):
                unknown = row.tokens[index]
                row.tokens[index] = resolved
                row.steps.top[index] = tuple((resolved if t == unknown else t, lp) for t, lp in row.steps.top[index])
        cursor, step = stop, end
