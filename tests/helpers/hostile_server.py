"""Scenarios for the fake OpenAI-compatible server (tests/unit/engines/test_hostile_server.py,
tests/pytester/test_hostile_server_runs.py):
the spec that names it, honest and lying completions, and how a run is started against it."""

from __future__ import annotations

import json

from pytest_llmdeterminism.engines import BUILTIN_MODELS, load
from tests.helpers.fake_openai_server import Connection, FakeServer, Request

TINY = BUILTIN_MODELS["tiny"]
KEY = "sk-hostile-0123456789abcdef"
KEY_ENV = "LLMDET_HOSTILE_TEST_KEY"
GREEDY = [273, 442, 445, 373, 272]  # "The cat sat on the", one token each in the tiny tokenizer
MODELS = {"object": "list", "data": [{"id": "tiny"}]}


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
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    loaded = load(spec_text, dtype="float32", device="cpu")
    settings = GenerationSettings(BatchShape(1, 32), max_new_tokens, 0)
    return loaded, LLMModel(loaded, settings).generate("The cat")


def respond(status: int, body: bytes | dict):
    return lambda request, connection: connection.respond(status, body)


def answer_with(status: int, body: str, headers: dict[str, str]):
    return lambda request, connection: connection.respond(status, body, headers)


# --- answers that cannot be right ---

def times_five(completion, choice, logprobs):
    for key in ("tokens", "token_logprobs", "top_logprobs"):
        logprobs[key] *= 5
    choice["text"] *= 5

