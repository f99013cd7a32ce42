"""A toy language model served over the completions API, concurrently: the serving stacks of issue 43
as fakes whose faults are known, so the checks that must find them can be tested without a model.

Each request runs on its own thread (``http.server.ThreadingHTTPServer``) and is held for
:data:`HOLD` seconds, as a continuous-batching server holds requests that are decoded together: the
number of requests in flight while it was held is its *batch*. A request alone has batch 1; one sent
among N concurrent companions has batch N + 1 (the hold makes them overlap). Once a batch of some
size was seen, a round that brings as many requests together is let go at once, not after the
whole hold (the concurrency check's 20 rounds: 0.2 s, not 5 s); fewer wait the hold out as before.

The toy's "model": for each step, logits over :data:`CANDIDATES` (ids of the built-in tiny model's
tokenizer, which the spec names) computed from a hash of the prompt ids, the tokens so far and the
step. Tokens are returned as vLLM returns them (``token_id:N``), so the plugin needs no text to
read them. What each :class:`Behaviour` changes:

- ``batch_changes_token``: greedy; in a batch of more than one, the chosen token at step 1 is the
  runner-up (a stack whose batching changes its output);
- ``batch_drifts``: greedy; in a batch, every logprob moves by 1e-3 (the tokens stay);
- sampled requests (``temperature > 0``, cut to ``top_k``) draw Gumbel-max over the candidates with
  noise keyed by what :class:`Noise` says: ``faithful`` (seed, prompt ids, step, token: per request
  and per prompt); ``shared`` (seed, step, token: one seed gives every prompt the same noise, vLLM
  #50440); ``batched`` (faithful, and the batch size: a sample that depends on its companions);
  ``ignored`` (seed 42 whatever the request says, as SGLang's fallback); or ``uniform``: one uniform
  per (seed, step) through the prompt's sorted distribution (inverse CDF, as llama.cpp's server draws).
  ``seed_modulus``: the server reads only the seed modulo this (0: all of it), e.g. 2 or 16.
- ``hang_up_in_batch``: a request held with others is hung up on without an answer (a server that
  drops connections under load); one alone is answered.

A one-token request that finds no other in flight is answered at once, not held: the seed row's
requests, sent one at a time.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pytest_llmdeterminism.engines import BUILTIN_MODELS

TINY = BUILTIN_MODELS["tiny"]
HOLD = 0.25  # seconds a completion is held, so that concurrent requests overlap (a batch)
# Ids of single tokens of the tiny tokenizer, none special: the toy's vocabulary.
CANDIDATES = tuple(range(300, 316))
TOP = 5  # logprobs returned per step


class Noise(enum.Enum):
    FAITHFUL = "faithful"
    SHARED = "shared"
    BATCHED = "batched"
    IGNORED = "ignored"
    UNIFORM = "uniform"


@dataclass
class Behaviour:
    batch_changes_token: bool = False
    batch_drifts: bool = False
    noise: Noise = Noise.FAITHFUL
    seed_modulus: int = 0
    hang_up_in_batch: bool = False


@dataclass
class Log:
    """What the server saw: each completion's prompt, seed, temperature and batch."""

    completions: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _unit(*parts: object) -> float:
    """A number in (0, 1) from a hash of ``parts``."""
    digest = hashlib.blake2b(json.dumps(parts).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") + 0.5) / 2**64


def _logprobs(prompt: list[int], tokens: list[int]) -> list[tuple[int, float]]:
    """The toy's log-softmax over :data:`CANDIDATES` after ``prompt + tokens``, best first."""
    logits = [4.0 * _unit("logit", prompt, tokens, c) for c in CANDIDATES]
    top = max(logits)
    norm = top + math.log(sum(math.exp(v - top) for v in logits))
    pairs = [(c, v - norm) for c, v in zip(CANDIDATES, logits, strict=True)]
    return sorted(pairs, key=lambda p: (-p[1], p[0]))


def complete(body: dict[str, Any], batch: int, behaviour: Behaviour) -> dict[str, Any]:
    prompt = body["prompt"]
    assert isinstance(prompt, list), "the toy takes prompts as token ids"
    temperature = float(body.get("temperature") or 0.0)
    seed = int(body.get("seed") or 0)
    tokens: list[int] = []
    texts, chosen, tops = [], [], []
    for step in range(int(body["max_tokens"])):
        ranked = _logprobs(prompt, tokens)
        if behaviour.batch_drifts and batch > 1:
            ranked = [(c, v - 1e-3 * (i + 1)) for i, (c, v) in enumerate(ranked)]
        if behaviour.batch_changes_token and batch > 1 and step == 1:  # the runner-up becomes the best
            (first, a), (second, b), *rest = ranked
            ranked = [(second, a), (first, b), *rest]
        if temperature == 0:
            token = ranked[0][0]
        else:
            top_k = int(body.get("top_k") or 0)
            kept = ranked[:top_k] if top_k > 0 else ranked
            read = seed % behaviour.seed_modulus if behaviour.seed_modulus else seed
            token = _draw(kept, temperature, read, prompt, step, batch, behaviour.noise)
        tokens.append(token)
        top = dict(ranked[:TOP])
        texts.append(f"token_id:{token}")
        chosen.append(dict(ranked)[token])
        tops.append({f"token_id:{c}": v for c, v in top.items()})
    return {"id": "cmpl-toy", "object": "text_completion", "model": body["model"],
            "usage": {"prompt_tokens": len(prompt)},
            "choices": [{"index": 0, "finish_reason": "length",
                         "logprobs": {"tokens": texts, "token_logprobs": chosen, "top_logprobs": tops}}]}


def _draw(ranked: list[tuple[int, float]], temperature: float, seed: int, prompt: list[int], step: int,
          batch: int, noise: Noise) -> int:
    def key(token: int) -> tuple[object, ...]:
        if noise is Noise.SHARED:
            return ("noise", seed, step, token)
        if noise is Noise.IGNORED:
            return ("noise", 42, prompt, step, token)
        if noise is Noise.BATCHED:
            return ("noise", seed, prompt, step, token, batch)
        return ("noise", seed, prompt, step, token)

    if noise is Noise.UNIFORM:
        weights = [math.exp(v / temperature) for _, v in ranked]
        left = _unit("uniform", seed, step) * sum(weights)
        for (token, _), weight in zip(ranked, weights, strict=True):
            left -= weight
            if left <= 0:
                return token
        return ranked[-1][0]
    scores = {c: v / temperature - math.log(-math.log(_unit(*key(c)))) for c, v in ranked}
    return max(sorted(scores), key=lambda c: scores[c])


class ToyServer:
    """The toy on a free localhost port, until :meth:`stop`."""

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.log = Log()
        self._in_flight = 0
        self._peak = 0  # the most requests in flight at once since the server was last idle
        self._largest = 0  # the largest batch a request has seen: a round of that many is complete
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    def spec(self, **knobs: object) -> str:
        options = {"tokenizer": TINY, "reset_prefix": 0, **knobs}
        return f"openai:{self.url}#" + "&".join(f"{k}={v}" for k, v in options.items())

    def batches(self) -> list[int]:
        with self.log.lock:
            return [c["batch"] for c in self.log.completions]

    def _held(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The answer, or None to hang up (``hang_up_in_batch``)."""
        with self._lock:
            self._in_flight += 1
            self._peak = batch = max(self._peak, self._in_flight)
        held = int(body["max_tokens"]) > 1 or batch > 1 or self.behaviour.hang_up_in_batch
        ends = time.monotonic() + (HOLD if held else 0.0)
        while time.monotonic() < ends:  # the most requests in flight while this one was held
            time.sleep(0.01)
            with self._lock:
                batch = max(batch, self._peak)
                if batch >= self._largest > 1:  # as many as the largest batch yet: its round is in
                    break
        hang_up = self.behaviour.hang_up_in_batch and batch > 1
        answer = None if hang_up else complete(body, batch, self.behaviour)
        with self._lock:
            self._largest = max(self._largest, batch)
            self._in_flight -= 1
            if self._in_flight == 0:
                self._peak = 0
        with self.log.lock:
            self.log.completions.append({"prompt": body["prompt"], "seed": body.get("seed"),
                                         "temperature": body.get("temperature"), "batch": batch})
        return answer

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        toy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
                pass

            def _send(self, status: int, payload: object) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.startswith("/v1/models"):
                    self._send(200, {"object": "list", "data": [{"id": "toy"}]})
                elif self.path.startswith("/version"):
                    self._send(200, {"version": "toy-1"})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                if not self.path.startswith("/v1/completions"):
                    self._send(404, {"error": "not found"})
                elif not isinstance(body.get("prompt"), list):
                    self._send(400, {"error": "the toy takes token ids"})
                elif (answer := toy._held(body)) is None:
                    self.close_connection = True
                else:
                    self._send(200, answer)

        return Handler

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
