"""``llm_model.score`` on the serving engines (issue 42): llama.cpp in process and an OpenAI-compatible
server, against the transformers score of the same GGUF file."""

from __future__ import annotations

import pytest

from pytest_llmdeterminism import engines
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: CMAKE_ARGS=-DGGML_NATIVE=OFF "
                    "pip install -e '.[llamacpp]' "
                    "(.ci/run does)")

PAIRS = [("The capital of France is", " Paris. It is known for the Eiffel Tower."),
         ([{"role": "user", "content": "What is 2 + 2?"}], "2 + 2 = 4."),
         ("def fibonacci(n):", "\n    if n < 2:\n        return n")]
SETTINGS = GenerationSettings(BatchShape(2, 64), 8, 0)
# Q4_1 weights with 8-bit activations (llama.cpp) against their float32 dequantisation (transformers):
# measured 0.23 at most per position, 0.55 on a sequence's sum (three pairs).
ENGINE_ATOL = 0.5


@pytest.fixture(scope="module")
def reference(smollm2_gguf):
    """The transformers scores of the GGUF file (float32, dequantised), computed once."""
    return LLMModel(engines.load(str(smollm2_gguf), dtype="float32", device="cpu"), SETTINGS).score(
        PAIRS, prompt_logprobs=True)


def largest_difference(scores, reference) -> float:
    return max(abs(a - b) for mine, theirs in zip(scores, reference, strict=True)
               for a, b in zip(mine.logprobs, theirs.logprobs, strict=True))


def test_llamacpp_scores_the_same_tokens_as_transformers_within_the_engines_tolerance(smollm2_gguf,
                                                                                     reference):
    llm = LLMModel(engines.load(f"llamacpp:{smollm2_gguf}", dtype="float32", device="cpu"), SETTINGS)
    scores = llm.score(PAIRS, prompt_logprobs=True)
    for mine, theirs in zip(scores, reference, strict=True):
        assert (mine.prompt_token_ids, mine.token_ids) == (theirs.prompt_token_ids, theirs.token_ids)
        assert mine.variant == "llamacpp:cpu/Q4_1" and mine.hash_definition == theirs.hash_definition
        assert mine.total == pytest.approx(theirs.total, abs=2 * ENGINE_ATOL)
        assert len(mine.prompt_logprobs) == len(mine.prompt_token_ids)
        assert all(rank is not None and rank >= 1 for rank in mine.ranks)
    largest = largest_difference(scores, reference)
    print(f"llama.cpp vs transformers: largest logprob difference {largest:.3f}")
    assert 0 < largest < ENGINE_ATOL  # two engines' numbers, never identical
    assert [s.step_hashes for s in llm.score(PAIRS)] == [s.step_hashes for s in scores]  # bitwise again
    # A one-token continuation is evaluated as generation evaluates the prompt: its first step, bit for bit.
    first = llm.generate(PAIRS[0][0], max_new_tokens=1)
    one = llm.score(PAIRS[0][0], list(first.token_ids))
    assert (one.step_hashes, one.top_logprobs) == (first.step_hashes, first.top_logprobs)


@pytest.fixture(scope="module")
def server(smollm2_gguf, tmp_path_factory):
    """One llama-cpp-python server for the module's tests."""
    pytest.importorskip("llama_cpp.server", reason="llama-cpp-python[server] is not installed: "
                        "CMAKE_ARGS=-DGGML_NATIVE=OFF pip install -e '.[llamacpp]' (.ci/run does)")
    from tests.helpers.llama_server import LlamaServer

    started = LlamaServer(smollm2_gguf, tmp_path_factory.mktemp("server") / "server.log")
    yield started
    started.stop()


def test_a_server_scores_through_echoed_completions_as_llamacpp_in_process(smollm2_gguf, server):
    """llama-cpp-python's server echoes each token's logprob under the next token's distribution; read
    from the entry before, they are llama.cpp's in process (the same library, the same file). A pair
    with a chat template's special tokens is refused by name: the server leaves them out of its echo."""
    from pytest_llmdeterminism import EngineError

    plain = [PAIRS[0], PAIRS[2]]
    served = LLMModel(engines.load(server.spec(smollm2_gguf), dtype="float32", device="auto"), SETTINGS)
    scores = served.score(plain, top_k=20)
    local = LLMModel(engines.load(f"llamacpp:{smollm2_gguf}", dtype="float32", device="cpu"),
                     SETTINGS).score(plain, top_k=20)
    for mine, theirs in zip(scores, local, strict=True):
        assert mine.token_ids == theirs.token_ids and mine.variant == "openai:served/unknown"
        assert str(mine.hash_definition) == "served-topk"
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)
        assert mine.ranks == theirs.ranks
    assert [s.step_hashes for s in served.score(plain, top_k=20)] == [s.step_hashes for s in scores]
    with pytest.raises(EngineError, match=r"raise llm_model.score\(top_k=...\)"):
        served.score(*PAIRS[0], top_k=1)  # a token outside the top-1 of the position before
    with pytest.raises(EngineError, match="it leaves tokens out of its echo .* special tokens"):
        served.score(*PAIRS[1])


def test_a_server_refuses_a_token_whose_text_another_token_in_its_top_k_shares(smollm2_gguf, server):
    """llama-cpp-python keys its top-k by text: after this prompt, ' ' (true logprob -0.017) and a
    lower token that also reads ' ' share one entry, the lower one's -8.6 in it. Refused by name,
    never recorded as ' ''s logprob."""
    from pytest_llmdeterminism import EngineError

    served = LLMModel(engines.load(server.spec(smollm2_gguf), dtype="float32", device="auto"), SETTINGS)
    with pytest.raises(EngineError, match="named two tokens with the text ' ' in the top-k of position 15"):
        served.score("Q: What is 2 + 2?\nA:", " 2 + 2 = 4.", top_k=20)
