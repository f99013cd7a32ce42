"""A fake OpenAI-compatible server, as hostile as a test asks: raw sockets, standard library only.

One thread serves one connection at a time on 127.0.0.1 (a free port), reads each request and
hands it to the test's ``answer``, which writes whatever bytes it likes: a good completion, a lie,
a redirect, a trickle, a flood. Every loop is bounded in count and in time, and ``stop`` ends it.
``FakeServer(answer, concurrent=True)`` answers each connection in a thread of its own instead, and
keeps count of the requests in flight (each request's ``in_flight``: the most at once while it was
being answered, itself included), so a test can see requests overlap.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LIFETIME = 120.0  # seconds: a server stops by itself after this, whatever the test does
MAX_CONNECTIONS = 200


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    in_flight: int = 1  # concurrent=True: the most requests in flight while this one was answered

    def json(self) -> Any:
        return json.loads(self.body)


class Connection:
    """What an answer writes to; writes stop quietly once the client has hung up or the server stops."""

    def __init__(self, sock: socket.socket, stopping: threading.Event) -> None:
        self.sock, self.stopping = sock, stopping
        self.sent = 0

    def send(self, data: bytes) -> bool:
        if self.stopping.is_set():
            return False
        try:
            self.sock.sendall(data)
        except OSError:
            return False
        self.sent += len(data)
        return True

    def respond(self, status: int, body: bytes | dict[str, Any] | str = b"",
                headers: dict[str, str] | None = None, *, reason: str = "X") -> None:
        if isinstance(body, dict):
            body = json.dumps(body)
        data = body.encode() if isinstance(body, str) else body
        lines = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(data)}", "Connection: close",
                 *(f"{k}: {v}" for k, v in (headers or {}).items())]
        self.send(("\r\n".join(lines) + "\r\n\r\n").encode() + data)

    def reset(self) -> None:
        """Hang up with a TCP reset (RST) instead of an answer: the client reads ``ECONNRESET``."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def trickle(self, data: bytes, every: float, *, most: int = 40) -> None:
        """``data`` one byte at a time, ``every`` seconds apart, at most ``most`` bytes."""
        for byte in data[:most]:
            if not self.send(bytes([byte])) or self.stopping.wait(every):
                return

    def flood(self, piece: bytes, *, most: int) -> None:
        """``piece`` again and again until the client hangs up, at most ``most`` times."""
        for _ in range(most):
            if not self.send(piece):
                return


Answer = Callable[[Request, Connection], None]


class FakeServer:
    def __init__(self, answer: Answer, *, concurrent: bool = False) -> None:
        self.requests: list[Request] = []
        self.concurrent = concurrent
        self.most_in_flight = 0
        self._in_flight: list[Request] = []
        self._lock = threading.Lock()
        self.connections: list[Connection] = []
        self._stopping = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self.origin = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.origin}/v1"
        self._thread = threading.Thread(target=self._serve, args=(answer,), daemon=True)
        self._thread.start()

    def _serve(self, answer: Answer) -> None:
        ends = time.monotonic() + LIFETIME
        served = 0
        with self._listener:
            while served < MAX_CONNECTIONS and not self._stopping.is_set() and time.monotonic() < ends:
                try:
                    sock, _ = self._listener.accept()
                except OSError:  # the accept timed out: look at the clock and the stop flag again
                    continue
                served += 1
                if self.concurrent:
                    threading.Thread(target=self._answer, args=(sock, answer), daemon=True).start()
                else:
                    self._answer(sock, answer)

    def _answer(self, sock: socket.socket, answer: Answer) -> None:
        with sock:
            sock.settimeout(5)
            connection = Connection(sock, self._stopping)
            self.connections.append(connection)
            try:
                request = read_request(sock)
            except (OSError, ValueError):
                return
            with self._lock:
                self.requests.append(request)
                self._in_flight.append(request)
                self.most_in_flight = max(self.most_in_flight, len(self._in_flight))
                for other in self._in_flight:
                    other.in_flight = max(other.in_flight, len(self._in_flight))
            try:
                answer(request, connection)
            finally:
                with self._lock:
                    self._in_flight.remove(request)

    def in_flight_now(self) -> int:
        """The requests being answered at this moment (concurrent=True), the caller's own included."""
        with self._lock:
            return len(self._in_flight)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)


def read_request(sock: socket.socket) -> Request:
    data = b""
    for _ in range(1000):
        if b"\r\n\r\n" in data or len(data) > 65536:
            break
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    first, *lines = head.decode("latin-1").split("\r\n")
    method, path, _ = first.split(" ", 2)
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    for _ in range(1000):
        if len(body) >= length:
            break
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return Request(method, path, headers, body)
