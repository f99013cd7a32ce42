"""The engine seam without an engine: spec parsing, what a server response becomes, hash definitions.

No model, no server: these pin the rules the real-engine tests (test_engines.py) rely on.
"""

from __future__ import annotations

import dataclasses
import json

import msgspec
import pytest
import xxhash
from hypothesis import given

from pytest_llmdeterminism import ConfigurationError, EngineError, ModelLoadError
from pytest_llmdeterminism.decoding import resolve_generation_config
from pytest_llmdeterminism.engines import BUILTIN_MODELS, load
from pytest_llmdeterminism.engines.server.completions import (
    Completion,
    parse_choice,
    request_body,
    text_only_id,
)
from pytest_llmdeterminism.generation import TEXT_ONLY_IDS
from pytest_llmdeterminism.goldens import schema, store
from pytest_llmdeterminism.goldens.files import fallback_variant
from pytest_llmdeterminism.judge.compare import Verdict, compare
from pytest_llmdeterminism.judge.fingerprint import numerics_changes
from pytest_llmdeterminism.reporting.failure import mismatch
from tests.helpers.strategies import generations

IDS = {" Paris": 7042, ".": 30, " the": 260, " London": 4649, ",": 28}


def response(tokens, tops, *, prompt_tokens=5, finish="length"):
    return {"choices": [{"text": "".join(tokens), "finish_reason": finish,
                         "logprobs": {"tokens": tokens, "top_logprobs": tops,
                                      "token_logprobs": [top[t]
                                                         for t, top in zip(tokens, tops, strict=True)]}}],
            "usage": {"prompt_tokens": prompt_tokens}}


def token_id(text):
    return IDS.get(text, text_only_id(text))


def parse(reply, token_id=token_id, tokenizer=None, *, prompt_tokens=5, max_tokens=16, vocab_size=50_000):
    return parse_choice("spec", msgspec.convert(reply, Completion), prompt_tokens=prompt_tokens,
                        max_tokens=max_tokens, vocab_size=vocab_size, token_id=token_id, tokenizer=tokenizer)


def test_a_server_step_is_recorded_as_ids_logprobs_and_a_hash_of_what_was_returned():
    row = parse(response([" Paris", "."], [{" Paris": -0.26, " the": -2.8, " London": -4.4},
                                           {".": -0.37, ",": -1.63}]))
    assert row.tokens == [7042, 30] and row.pieces == [" Paris", "."] and row.text == " Paris."
    assert row.steps.top[0] == ((7042, -0.26), (260, -2.8), (4649, -4.4))
    assert row.steps.margins == [pytest.approx(2.54), pytest.approx(1.26)]
    expected = json.dumps([" Paris", [[" Paris", -0.26], [" the", -2.8], [" London", -4.4]]],
                          separators=(",", ":"))
    assert row.steps.hashes[0] == xxhash.xxh3_64_hexdigest(expected.encode())
    assert row.finish_reason == "length"
    assert parse(response(["."], [{".": -0.1}], finish="stop")).finish_reason == "eos"


def test_a_token_text_with_no_id_gets_a_stable_id_above_any_vocabulary():
    row = parse(response(["\u00e9t"], [{"\u00e9t": -0.5, " the": -1.5}]))
    assert row.tokens[0] >= TEXT_ONLY_IDS and row.tokens[0] == text_only_id("\u00e9t") != text_only_id("x")


def test_a_server_that_did_not_decode_greedily_fails_naming_the_step_and_both_tokens():
    with pytest.raises(EngineError, match=r"did not decode greedily at step 1: it chose '-' \(logprob "
                                          r"-2.3246\) over '\\n' \(-0.7076\)\. A server-side sampler or "
                                          r"penalty is in force"):
        parse(response(["\n", "-"], [{"\n": -1.0}, {"\n": -0.7076, "-": -2.3246}]))


def test_a_server_that_counts_other_prompt_tokens_names_the_tokenizer():
    with pytest.raises(EngineError, match="the server counts 6 prompt tokens where the local tokenizer "
                                          "counts 5: #tokenizer= is not the served model's tokenizer"):
        parse(response(["."], [{".": -0.1}], prompt_tokens=6))


def test_a_response_without_logprobs_says_what_the_server_must_support():
    with pytest.raises(EngineError, match=r"choices\[0\]\.logprobs: none, where the request asked for "
                                          "logprobs=5; the server must support the completions API's "
                                          "per-token logprobs"):
        parse({"choices": [{"text": "x", "logprobs": None}]})


def test_every_request_pins_greedy_decoding_and_neutral_penalties_of_known_servers():
    config = resolve_generation_config({"max_new_tokens": 7}, max_new_tokens=16, eos_token_ids=[2],
                                       pad_token_id=2)
    body = request_body("m", "Hi", config, seed=3)
    assert {k: body[k] for k in ("model", "prompt", "max_tokens", "temperature", "top_p", "n", "seed",
                                 "logprobs", "frequency_penalty", "presence_penalty", "repeat_penalty",
                                 "repetition_penalty")} == {
        "model": "m", "prompt": "Hi", "max_tokens": 7, "temperature": 0.0, "top_p": 1.0, "n": 1, "seed": 3,
        "logprobs": 5, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repeat_penalty": 1.0,
        "repetition_penalty": 1.0}


@pytest.mark.parametrize(("spec", "message"), [
    ("llamacpp:/no/such.gguf", "no such .gguf file: '/no/such.gguf'. llamacpp: takes a local GGUF file"),
    ("llamacpp:/no/such.gguf#threads=0", "option threads='0' must be at least 1"),
    ("llamacpp:/no/such.gguf#threads=two", "option threads='two' is not a valid int"),
    ("llamacpp:/no/such.gguf#thread=2",
     "unknown option 'thread' after '#'; this engine takes: n_batch, n_ctx, n_ubatch, threads"),
    ("llamacpp:/no/such.gguf#threads", "'threads' after '#' is not key=value"),
    ("openai:127.0.0.1:8000/v1#tokenizer=x",
     "'127.0.0.1:8000/v1' is not an http:// or https:// URL; expected "
     "openai:http://HOST:PORT/v1#tokenizer=PATH"),
    ("openai:http://127.0.0.1:9/v1", "name the served model's tokenizer"),
    ("openai:http://127.0.0.1:9/v1#tokenizer=/no/such", "no such tokenizer folder or .gguf file"),
])
def test_a_bad_engine_spec_fails_at_load_naming_the_fix(spec, message):
    with pytest.raises((ConfigurationError, ModelLoadError)) as raised:
        load(spec, dtype="float32", device="auto")
    assert message in str(raised.value)


def test_an_unreachable_server_fails_at_load_with_one_clear_message():
    tokenizer = BUILTIN_MODELS["tiny"]
    with pytest.raises(EngineError, match=r"the server at http://127.0.0.1:9/v1 did not answer GET "
                                          r"/v1/models \(.*\)\. Is it running, at this URL\?"):
        load(f"openai:http://127.0.0.1:9/v1#tokenizer={tokenizer}&timeout=2", dtype="float32", device="auto")


@given(generations())
def test_goldens_of_two_hash_definitions_never_compare_their_hashes(gen):
    served = dataclasses.replace(gen, hash_definition="served-topk")
    comparison = compare(gen, served)
    assert comparison.hash_definitions == ("logits", "served-topk")
    if comparison.divergence is None and comparison.verdict is not Verdict.INPUT_CHANGED:
        assert comparison.verdict is Verdict.LOGIT_DRIFT  # equal tokens: never "identical" across engines
    assert compare(served, served).verdict is Verdict.IDENTICAL


@given(generations())
def test_a_served_golden_keeps_its_hash_definition_through_the_file(gen):
    served = dataclasses.replace(gen, hash_definition="served-topk", fingerprint={"engine": "openai",
                                                                                  "device_class": "served",
                                                                                  "dtype": "unknown"})
    entry = schema.to_entry(served)
    assert entry["step_hash"] == "served-topk" and "step_hash" not in schema.to_entry(gen)
    assert schema.from_entry(json.loads(json.dumps(entry))).hash_definition == "served-topk"
    assert served.variant == "openai:served/unknown" and ":" not in gen.variant


def test_a_cross_engine_report_says_the_hashes_are_not_comparable(make_llm):
    result = make_llm().generate("The cat sat on the")
    served = dataclasses.replace(result, hash_definition="served-topk")
    text = mismatch("golden_tokens.check", "g.json", None, compare(result, served), result, served,
                    lambda t: str(t), profile="exact")
    assert ("LOGIT_DRIFT — same tokens; the step hashes are not comparable (golden hashes raw logits, "
            "this run hashes what a server returned)") in text


def test_an_unknown_hash_definition_in_a_golden_file_is_refused(tmp_path, make_llm):
    path = tmp_path / "test_x.json"
    store.write(path, {"k": {"cpu/float32": schema.to_entry(make_llm().generate("The cat"))}})
    path.write_text(path.read_text().replace('"prompt": ',
                                             '"step_hash": "sha-of-the-moon",\n        "prompt": ', 1))
    with pytest.raises(Exception, match="step_hash"):
        store.read(path)


def test_another_engine_counts_as_changed_numerics_and_falls_back_to_the_transformers_golden():
    hf = {"device_class": "cpu", "dtype": "float32", "torch": "2.13.0"}
    llama = {"engine": "llamacpp", "device_class": "cpu", "dtype": "Q4_1", "threads": 2}
    assert ("engine", None, "llamacpp") in numerics_changes(hf, llama)
    assert numerics_changes(llama, dict(llama)) == []
    assert ("threads", 2, 4) in numerics_changes(llama, dict(llama, threads=4))
    assert fallback_variant("llamacpp:cpu/Q4_1", ["cpu/float32", "cuda/bfloat16"]) == "cpu/float32"


def stopped(tokens, finish, eos=(7, 8), **fingerprint):
    from pytest_llmdeterminism.generation import Generation

    n = len(tokens)
    return Generation(prompt="p", prompt_token_ids=(1,), token_ids=tuple(tokens), text="",
                      step_hashes=("0" * 16,) * n,
                      top_logprobs=tuple(((t, -0.1), (99, -3.0)) for t in tokens), margins=(2.9,) * n,
                      finish_reason=finish, generation_config={"eos_token_id": list(eos)}, batch_shape="4x32",
                      fingerprint=fingerprint)


def test_a_stop_at_eos_is_one_step_whether_or_not_the_engine_returned_the_token():
    returned, bare = stopped([5, 7], "eos"), stopped([5], "eos")
    assert compare(returned, bare).divergence is None and compare(bare, returned).divergence is None
    assert compare(returned, stopped([5, 6], "length")).divergence.step == 1
    # Both returned an EOS token: another EOS id is another token (Llama-3 has two).
    assert compare(returned, stopped([5, 8], "eos")).verdict is Verdict.REGRESSION


def test_the_batch_shape_is_no_input_for_an_engine_that_ran_each_prompt_alone():
    alone = dataclasses.replace(stopped([5], "length", rows_alone=True), batch_shape="1x64")
    assert compare(stopped([5], "length"), alone).verdict is Verdict.IDENTICAL
    assert compare(stopped([5], "length"),
                   dataclasses.replace(stopped([5], "length"), batch_shape="1x64")).verdict \
        is Verdict.INPUT_CHANGED


def byte_tokenizer(text, add_special_tokens=False):
    return {"input_ids": list(text.encode())}


def test_steps_that_returned_part_of_a_character_get_the_ids_of_its_bytes():
    # "ど" is three UTF-8 bytes: a byte-level model generates three tokens, and a server that decodes
    # each alone returns empty text for all three.
    tokens, tops = ["a", "", "", "", "b"], [{"a": -0.1}, {"": -0.2}, {"": -0.3}, {"": -0.1}, {"b": -0.5}]
    reply = response(tokens, tops)
    reply["choices"][0]["text"] = "aどb"
    row = parse(reply, lambda t: ord(t) if len(t) == 1 else text_only_id(t), byte_tokenizer)
    assert row.tokens == [ord("a"), *"ど".encode(), ord("b")]
    assert [top[0][0] for top in row.steps.top] == row.tokens
    unresolved = parse(reply, lambda t: ord(t) if len(t) == 1 else text_only_id(t))
    assert unresolved.tokens[1:4] == [text_only_id("")] * 3  # without a tokenizer: by text, as returned


def test_ids_a_server_returns_as_token_id_text_are_taken_as_they_are(tiny):
    from pytest_llmdeterminism.engines.server.openai import OpenAIEngine

    engine = OpenAIEngine("spec", None, "m", tiny.tokenizer)
    assert engine.token_id("token_id:42") == 42 and engine.token_id("token_id:x") >= TEXT_ONLY_IDS
    reply = response(["token_id:42"], [{"token_id:42": -0.1, "token_id:7": -2.0}])
    reply["choices"][0]["text"] = tiny.tokenizer.decode([42])
    row = parse(reply, engine.token_id, tiny.tokenizer, vocab_size=len(tiny.tokenizer))
    assert row.tokens == [42] and row.steps.top[0] == ((42, -0.1), (7, -2.0))
    assert row.pieces == [tiny.tokenizer.decode([42])]


class FakeClient:
    """Answers like llama-cpp-python's server: a prompt of token ids is refused with HTTP 422."""

    base = "http://fake/v1"
    api_key = None

    def __init__(self):
        self.prompts = []

    def request_line(self, method, path):
        return f"{method} /v1/{path}"

    def redact(self, text):
        return text

    def post(self, path, body, into):
        from pytest_llmdeterminism.engines.server.server_client import HTTPStatusError

        self.prompts.append(body["prompt"])
        if isinstance(body["prompt"], list):
            raise HTTPStatusError("spec", 422, "prompt: Input should be a valid string",
                                  "prompt: Input should be a valid string")
        return msgspec.convert(response([" x"], [{" x": -0.1}], prompt_tokens=2), into)


def test_the_prompt_goes_as_token_ids_where_the_server_takes_them_else_as_text_from_then_on(tiny):
    from pytest_llmdeterminism.engines.server.openai import OpenAIEngine
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    client = FakeClient()
    engine = OpenAIEngine("spec", client, "m", tiny.tokenizer, reset_prefix=False)
    config = resolve_generation_config({}, max_new_tokens=1, eos_token_ids=[2], pad_token_id=0)
    ids = tiny.tokenizer("The cat")["input_ids"][:2]
    chunk = engine.run([ids, ids], config, GenerationSettings(BatchShape(1, 32), 1, 0), False)
    text = tiny.tokenizer.decode(ids)
    assert client.prompts == [ids, text, text] and chunk.flags["prompt_sent_as"] == "text"


@pytest.mark.parametrize("override", [{"repetition_penalty": 1.5}, {"min_new_tokens": 3}])
def test_penalties_a_server_applies_after_its_logprobs_are_refused_by_name(tiny, override):
    from pytest_llmdeterminism.engines.server.openai import OpenAIEngine
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    engine = OpenAIEngine("spec", FakeClient(), "m", tiny.tokenizer)
    config = resolve_generation_config(override, max_new_tokens=4, eos_token_ids=[2], pad_token_id=0)
    with pytest.raises(ConfigurationError, match="a server returns its logprobs from before its penalties"):
        engine.run([[5, 6]], config, GenerationSettings(BatchShape(1, 32), 4, 0), False)


def test_an_api_key_comes_from_the_environment_never_from_the_spec(monkeypatch):
    monkeypatch.delenv("LLMDET_TEST_KEY", raising=False)
    with pytest.raises(ConfigurationError, match="api_key_env=LLMDET_TEST_KEY names an environment variable "
                                                 "that is not set"):
        load(f"openai:http://127.0.0.1:9/v1#tokenizer={BUILTIN_MODELS['tiny']}&api_key_env=LLMDET_TEST_KEY",
             dtype="float32", device="auto")
    with pytest.raises(ConfigurationError, match="unknown option 'api_key'"):
        load(f"openai:http://127.0.0.1:9/v1#tokenizer={BUILTIN_MODELS['tiny']}&api_key=sk-1", dtype="float32",
             device="auto")


def test_what_real_servers_send_passes_the_checks_of_a_server_answer():
    # llama-cpp-python finishes a character that max_tokens cut: a step more, part of a character.
    cut = response(["\u3001", "", ""], [{"\u3001": -0.1}, {"": -0.2}, {"": -0.3}])
    cut["choices"][0]["text"] = "\u3001\u30a2"
    assert len(parse(cut, max_tokens=2).tokens) == 3
    with pytest.raises(EngineError, match=r"choices\[0\]\.logprobs\.tokens: 3 tokens for max_tokens=2"):
        parse(response([" Paris", ".", ","], [{" Paris": -0.1}, {".": -0.1}, {",": -0.1}]), max_tokens=2)
    # Whitespace aside: a text without the leading space its first token has; a logprob rounded above 0.
    spaced = response([" Paris", "."], [{" Paris": 1e-7, " the": -2.8}, {".": -0.37}])
    spaced["choices"][0]["text"] = "Paris."
    assert parse(spaced).text == "Paris."
    # A stop before the first token is a completion of no tokens.
    assert parse(response([], [], finish="stop")).tokens == []


def test_vllm_outputs_beyond_max_tokens_or_the_vocabulary_are_refused():
    from types import SimpleNamespace

    from pytest_llmdeterminism.engines.vllm import chunk_from_outputs

    def output(tokens, candidates):
        steps = [{i: SimpleNamespace(logprob=-0.1 * (rank + 1)) for rank, i in enumerate([t, *candidates])}
                 for t in tokens]
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=tokens, logprobs=steps)])]

    assert chunk_from_outputs(output([5, 6], [7]), spec="vllm:m", max_tokens=2, id_bound=8).tokens == [[5, 6]]
    with pytest.raises(EngineError,
                       match="vLLM returned 3 tokens for prompt 0 where the plugin asked for at most 2"):
        chunk_from_outputs(output([5, 6, 7], [1]), spec="vllm:m", max_tokens=2, id_bound=8)
    with pytest.raises(EngineError, match=r"token id 9 at step 0 of prompt 0, outside the model's vocabulary "
                                          r"\(0 to 7\)"):
        chunk_from_outputs(output([5], [9]), spec="vllm:m", max_tokens=2, id_bound=8)


@pytest.mark.parametrize(("status", "detail", "refused"), [
    (422, '[{"type": "string_type", "loc": ["body", "prompt", "str"], "msg": "Input should be a valid '
          'string"}]', True),
    (400, "prompt must be a string", True),
    (500, "TypeError: prompt: expected str, got list", True),
    (500, "internal server error", False),  # a passing failure says nothing of the prompt
    (400, "invalid api key", False),
    (400, "your prompt has 3000 tokens, above the context of 2048", False),  # the prompt, but no type
    (401, "prompt must be a string", False),  # not a refusal of the request's form
])
def test_only_an_error_that_names_the_prompt_type_refuses_token_ids(status, detail, refused):
    from pytest_llmdeterminism.engines.server.completions import refuses_token_ids

    assert refuses_token_ids(status, detail) is refused
