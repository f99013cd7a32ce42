"""llama.cpp's ``llama-server`` answers /v1/completions with its logprobs in the chat API's form
(``content``: a step per token, each with its top candidates as a list): read as the completions
API's form, so a step records what the same answer in that form records."""

from __future__ import annotations

import msgspec
import pytest

from pytest_llmdeterminism.engines.server.completions import Completion, parse_choice

IDS = {" is": 314, "'s": 506, " the": 260, " it": 357}


def step(token, logprob, top):
    return {"id": IDS[token], "token": token, "bytes": list(token.encode()), "logprob": logprob,
            "top_logprobs": [{"id": IDS[t], "token": t, "bytes": list(t.encode()), "logprob": lp}
                             for t, lp in top]}


CONTENT = {"choices": [{"text": " is the", "index": 0, "finish_reason": "length", "logprobs": {"content": [
    step(" is", -1.19, [(" is", -1.19), ("'s", -2.03)]),
    step(" the", -1.02, [(" the", -1.02), (" it", -1.62)])]}}],
    "model": "m.gguf", "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
LEGACY = {"choices": [{"text": " is the", "index": 0, "finish_reason": "length", "logprobs": {
    "tokens": [" is", " the"], "token_logprobs": [-1.19, -1.02],
    "top_logprobs": [{" is": -1.19, "'s": -2.03}, {" the": -1.02, " it": -1.62}]}}],
    "model": "m.gguf", "usage": {"prompt_tokens": 3, "completion_tokens": 2}}


def parse(answer):
    completion = msgspec.json.decode(msgspec.json.encode(answer), type=Completion)
    return parse_choice("spec", completion, prompt_tokens=3, max_tokens=2, vocab_size=1000,
                        token_id=IDS.__getitem__)


def test_llama_servers_content_form_is_recorded_as_the_completions_form_is():
    served, legacy = parse(CONTENT), parse(LEGACY)
    assert served.tokens == legacy.tokens == [314, 260]
    assert served.steps == legacy.steps
    assert served.text == " is the"


def test_logprobs_in_neither_form_are_refused_naming_the_field():
    answer = {"choices": [{"text": "x", "logprobs": {"token_logprobs": [-1.0]}}]}
    with pytest.raises(msgspec.ValidationError,
                       match=r"missing required field `tokens`.* at `\$.choices\[0\]"):
        msgspec.json.decode(msgspec.json.encode(answer), type=Completion)
