"""HTTP for a server the plugin does not trust: JSON over ``http.client`` to one origin, with no
redirect followed and no proxy, one deadline per request from connecting to the last byte (the
socket's timeout re-armed before each send and read), and a size limit enforced while reading.
A transient answer (429, 502, 503, 504) is retried a few times within that deadline, waiting as
the server's ``Retry-After`` asks up to a cap, then fails with its status: it never passes for
the server's answer to the request. An informational answer (1xx, e.g. ``103 Early Hints``) is
skipped, and a response whose ``Content-Length`` headers disagree is refused (RFC 9112 §6.3).

Each failure is one :class:`EngineError` that names the server, the request and what to check, a
malformed or undecodable answer included; the API key is a :class:`~secret.Secret`, shown as
``***`` in every frame's locals and wherever a message quotes the server, and written only into
the request's ``Authorization`` header. What goes into a request and what an answer means is
``completions.py``'s business.
"""

from __future__ import annotations

import copy as copy_module
import io
import json
import re
import time
from functools import cache
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import msgspec

from pytest_llmdeterminism.engines.server.completions import SHOWN_CHARS, ServerVersion
from pytest_llmdeterminism.engines.server.secret import Secret
from pytest_llmdeterminism.engines.spec import without_credentials
from pytest_llmdeterminism.errors import ConfigurationError, EngineError

if TYPE_CHECKING:
    import http.client
    import socket

VERSION_DEADLINE = 10.0  # seconds for the optional GET /version, within the spec's timeout
VERSION_MAX_BYTES = 64 * 1024
ERROR_BODY_BYTES = 64 * 1024  # of a 4xx/5xx answer, read for its message
# Overloaded, rate-limited or a gateway between: the same request may succeed a moment later.
TRANSIENT_STATUSES = frozenset({429, 502, 503, 504})
ATTEMPTS = 4  # of a request answered with a transient status, the first included
BACKOFF = (0.5, 1.0, 2.0)  # seconds before each retry where the server sends no Retry-After
RETRY_AFTER_CAP = 30.0  # seconds: the longest wait a server's Retry-After gets; a longer one fails at once
INFORMATIONAL_MOST = 20  # 1xx answers skipped before one request's final answer
_T = TypeVar("_T")


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


def retry_wait(retry_after: str | None, attempt: int, left: float) -> tuple[float | None, str]:
    """After attempt ``attempt`` (from 1) got a transient status: the seconds to wait before the next
    one (``Retry-After`` in seconds or as an HTTP date, else :data:`BACKOFF`), or None and why not:
    every attempt made, a wait above :data:`RETRY_AFTER_CAP`, or one that ends past the deadline,
    ``left`` seconds away."""
    asked = _seconds_after(retry_after)
    wait = BACKOFF[min(attempt, len(BACKOFF)) - 1] if asked is None else asked
    if attempt >= ATTEMPTS:
        return None, f"the same {attempt} times in a row, with a wait before each retry"
    if wait > RETRY_AFTER_CAP:
        return None, (f"its Retry-After asks for {wait:g} s, above the {RETRY_AFTER_CAP:g} s the plugin "
                      "waits")
    if wait >= left:
        return None, (f"a retry in {wait:g} s would end past the request's deadline (#timeout=, retries "
                      "included; e.g. #timeout=600 gives it longer)")
    return wait, ""


def _seconds_after(retry_after: str | None) -> float | None:
    """``Retry-After``'s wait in seconds (RFC 9110 §10.2.3: digits, or an HTTP date); None if neither."""
    if retry_after is None:
        return None
    value = retry_after.strip()
    if value.isascii() and value.isdigit():
        return float(min(int(value[:12]), 10**9))
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(when.timestamp() - time.time(), 0.0)


class _Reply(NamedTuple):
    status: int
    body: bytes
    location: str | None = None  # of a 3xx
    retry_after: str | None = None  # of a transient status


class Client:
    """JSON over HTTP with ``http.client``: one origin, no redirects, no proxy, one deadline and one
    size limit per request. The first transport failure is kept: every later request fails at once
    with the same message instead of waiting for a deadline each. A copy made by :meth:`apart` (the
    requests sent among concurrent companions) keeps none: its failure is its request's alone."""

    def __init__(self, spec: str, url: str, *, timeout: float, max_bytes: int,
                 api_key: Secret | None) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self.spec, self.timeout, self.max_bytes, self._api_key = spec, timeout, max_bytes, api_key
        self.base = f"{parts.scheme}://{parts.netloc}{parts.path}".rstrip("/")  # what messages show
        self._https, self._host, self._port = parts.scheme == "https", parts.hostname or "", parts.port
        self._path, self._query = parts.path.rstrip("/"), (f"?{parts.query}" if parts.query else "")
        self.down: EngineError | None = None
        self._latches = True  # a transport failure marks the server down for every later request

    def apart(self) -> Client:
        """This client for requests whose transport failure is theirs alone (among concurrent companions,
        under the load the check makes): it fails that request and marks nothing down."""
        copy = copy_module.copy(self)
        copy._latches = False
        return copy

    @property
    def api_key(self) -> Secret | None:
        """The key, as a :class:`Secret` (it prints as ``***``): what masks it in served text."""
        return self._api_key

    def get(self, path: str, into: type[_T]) -> _T:
        return self._request("GET", path, None, into)

    def post(self, path: str, body: dict[str, Any], into: type[_T]) -> _T:
        return self._request("POST", path, body, into)

    def request_line(self, method: str, path: str) -> str:
        return f"{method} {self._path}/{path}"

    def redact(self, text: str) -> str:
        """``text`` with the API key shown as ``***``, in any form :meth:`Secret.mask` recognises."""
        return text if self._api_key is None else self._api_key.mask(text)

    def version(self) -> str | None:
        """The server's own version where it offers one (vLLM: ``GET /version``, beside ``/v1``); no key
        is sent, and any failure means "none"."""
        import http.client

        root = self._path.removesuffix("/v1")
        try:
            reply = self._exchange("GET", f"{root}/version", None, {"Accept": "application/json"}, None,
                                   request="GET /version", seconds=min(self.timeout, VERSION_DEADLINE),
                                   max_bytes=VERSION_MAX_BYTES)
            ok = reply.status == 200
            version = msgspec.json.decode(reply.body, type=ServerVersion).version if ok else ""
        except (OSError, ValueError, RecursionError, MemoryError, EngineError, http.client.HTTPException):
            return None
        return self.redact(version) or None

    def _request(self, method: str, path: str, body: dict[str, Any] | None, into: type[_T]) -> _T:
        __tracebackhide__ = True
        import http.client  # here, not at module level: pytest loads the plugin on every run

        if self.down is not None:
            raise self.down.with_traceback(None)
        request = self.request_line(method, path)
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers |= {"Content-Type": "application/json", "Content-Length": str(len(data))}
        deadline = time.monotonic() + self.timeout  # one for the request, its retries included
        retried = ""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                reply = self._exchange(method, f"{self._path}/{path}{self._query}", data, headers,
                                       self._api_key, request=request, max_bytes=self.max_bytes,
                                       seconds=max(deadline - time.monotonic(), 1e-3))
            except (OSError, ValueError, http.client.HTTPException) as error:
                said = f"the server at {self.base} did not answer {request} {self._transport_problem(error)}"
                if not self._latches:
                    raise EngineError(self.spec, said) from None
                self.down = EngineError(self.spec, f"{said}; every later test that uses it fails with this "
                                        "message")
                raise self.down.with_traceback(None) from None
            if reply.status not in TRANSIENT_STATUSES:
                break
            wait, retried = retry_wait(reply.retry_after, attempt, deadline - time.monotonic())
            if wait is None:
                break
            time.sleep(wait)
        status, payload = reply.status, reply.body
        answered = f"the server at {self.base} answered {request} with"
        if 300 <= status < 400:
            shown = self.redact(without_credentials(reply.location or "nowhere"))[:SHOWN_CHARS]
            raise EngineError(self.spec, f"{answered} HTTP {status}, a redirect to {shown!r}. Redirects "
                              "are not followed (the request and its API key go to the spec's URL only): put "
                              "the final URL in the spec")
        if not 200 <= status < 300:
            detail = self.redact(payload.decode(errors="replace"))[:SHOWN_CHARS]
            hint = " (an OpenAI-compatible API lives under /v1: does the URL end in /v1?)" * (status == 404)
            if status in TRANSIENT_STATUSES:
                hint = (f" ({retried}; it is overloaded, rate-limited or behind a failing gateway: run again "
                        "when it has capacity)")
            raise HTTPStatusError(self.spec, status, f"{answered} HTTP {status}{hint}: {detail!r}", detail)
        try:
            return msgspec.json.decode(payload, type=into)
        except (ValueError, RecursionError, MemoryError) as error:  # msgspec's errors are ValueErrors
            logprobs = (" with the completions API's per-token logprobs (llama-cpp-python: logits_all, the "
                        "default)" if path == "completions" else "")
            raise EngineError(self.spec, f"{answered} {self._decode_problem(payload, error)}. Is it an "
                              f"OpenAI-compatible server{logprobs}, at this URL?") from None

    def _exchange(self, method: str, target: str, data: bytes | None, headers: dict[str, str],
                  api_key: Secret | None, *, request: str, seconds: float,
                  max_bytes: int) -> _Reply:
        """One request on a fresh connection: its final answer (1xx skipped), the body read within
        ``max_bytes`` (a 4xx/5xx body is cut at ERROR_BODY_BYTES) and all of it within ``seconds``.
        ``api_key`` goes into the ``Authorization`` header as bytes that print as ``***``, so the
        key is never a plain string in a frame (``pytest -l`` prints every frame's locals)."""
        __tracebackhide__ = True
        import http.client

        deadline = time.monotonic() + seconds
        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        connection = kind(self._host, self._port, timeout=seconds)
        connection.response_class = _response_class()
        raw: socket.socket | None = None
        try:
            connection.connect()
            raw = connection.sock
            # Every later send and read waits only until the deadline, however the server trickles.
            connection.sock = _DeadlineSocket(raw, deadline)
            connection.putrequest(method, target)
            for name, value in headers.items():
                connection.putheader(name, value)
            if api_key:
                connection.putheader("Authorization", api_key.authorization())
            connection.endheaders(data)
            response = connection.getresponse()
            if 300 <= response.status < 400:
                return _Reply(response.status, b"", location=response.getheader("Location"))
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
            return _Reply(response.status, b"".join(chunks), retry_after=response.getheader("Retry-After"))
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

    def _decode_problem(self, payload: bytes, error: Exception) -> str:
        """What is wrong with a 2xx body: msgspec names the field of a wrong type; for malformed JSON,
        the bytes around where decoding stopped; JSON nested too deep or too big to decode, as such."""
        if isinstance(error, msgspec.ValidationError):
            return f"an answer of the wrong shape ({error})"
        if isinstance(error, RecursionError):
            return (f"JSON nested too deep to decode ({error}; an answer of the API is a few levels "
                    "deep)")
        if isinstance(error, MemoryError):
            return (f"JSON of {len(payload) / 1e6:,.1f} MB that did not fit in memory once decoded (a "
                    "completion is a few KB; #max_response_mb= caps a body: lower it)")
        if not isinstance(error, msgspec.DecodeError):
            detail = self.redact(str(error))[:SHOWN_CHARS]
            return f"JSON that could not be decoded ({type(error).__name__}: {detail})"
        offset = re.search(r"\(byte (\d+)\)", str(error))
        if offset is None:
            return f"malformed JSON ({error})"
        at = int(offset[1])
        excerpt = self.redact(payload[max(at - 40, 0):at + 40].decode(errors="replace"))
        why = "; JSON has no NaN or Infinity" if "NaN" in excerpt or "Infinity" in excerpt else ""
        return f"malformed JSON ({error}, near {excerpt!r}{why})"


@cache
def _response_class() -> type[http.client.HTTPResponse]:
    """``http.client``'s response, stricter where HTTP/1.1 says so: it skips every informational
    answer (``http.client`` skips only ``100 Continue``, and would take ``103 Early Hints`` for the
    answer), at most :data:`INFORMATIONAL_MOST`, and refuses ``Content-Length`` headers that disagree
    or do not hold a length (a body framed two ways can be read two ways: RFC 9112 §6.3)."""
    import http.client

    class StrictResponse(http.client.HTTPResponse):
        def _read_status(self) -> tuple[str, int, str]:
            for _ in range(INFORMATIONAL_MOST):
                # Not in typeshed: the status line reader that begin() loops on, private but stable.
                version, status, reason = super()._read_status()  # type: ignore[misc]
                if not (100 <= status < 200) or status == 101:  # 101: a protocol switch, never asked for
                    return version, status, reason
                http.client.parse_headers(self.fp)  # an informational answer's headers: skipped
            raise http.client.HTTPException(f"more than {INFORMATIONAL_MOST} informational (1xx) answers "
                                            "before the answer")

        def begin(self) -> None:
            super().begin()
            given = self.headers.get_all("Content-Length") or []
            lengths = {value.strip() for header in given for value in header.split(",")}
            if given and not self.chunked and (len(lengths) > 1 or not all(map(_is_length, lengths))):
                shown = ", ".join(map(repr, given))[:SHOWN_CHARS]
                raise http.client.HTTPException(f"Content-Length headers {shown} that do not give one "
                                                "length: a body HTTP/1.1 cannot frame (RFC 9112 §6.3)")
            if given and not self.chunked and self.length is None and self.status not in (204, 304):
                self.length = int(lengths.pop())  # "44, 44": one length, which http.client cannot parse

    return StrictResponse


def _is_length(value: str) -> bool:
    return value.isascii() and value.isdigit() and len(value) <= 18


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
    """A server answered a request with an HTTP error status (kept in ``status``), and ``detail``, the
    start of its body as text (the key masked)."""

    def __init__(self, spec: str, status: int, message: str, detail: str = "") -> None:
        self.status, self.detail = status, detail
        super().__init__(spec, message)

