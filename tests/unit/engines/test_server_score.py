"""What a server's echoed completion means as a score (``engines/server/server_score.py``): pure functions of
the answer, each rule against a hand-written answer."""

from __future__ import annotations

import msgspec
import pytest

from pytest_llmdeterminism import EngineError
from pytest_llmdeterminism.engines.capture import rank_and_margin
from pytest_llmdeterminism.engines.server.completions import Completion
from pytest_llmdeterminism.engines.server.server_score import score_request, scored_row

IDS = {"A": 1, "B": 2, "C": 3, "D": 4, "E": 5}


def completion(tokens, top, chosen=None, text=None) -> Completion:
    logprobs = {"tokens": tokens, "top_logprobs": top}
    if chosen is not None:
        logprobs["token_logprobs"] = chosen
    return msgspec.convert({"choices": [{"logprobs": logprobs, "text": text}]}, Completion)


def scored(response, prompt=(1, 2), continuation=(3, 4), top_k=2, prompt_logprobs=False):
    return scored_row("openai:x", response, prompt=list(prompt), continuation=list(continuation), top_k=top_k,
                      token_id=IDS.__getitem__, prompt_logprobs=prompt_logprobs)


def test_the_request_echoes_the_prompt_with_logprobs_and_generates_one_token():
    body = score_request("m", [1, 2, 3], 7)
    assert (body["echo"], body["logprobs"], body["max_tokens"], body["temperature"]) == (True, 7, 1, 0.0)


def test_an_echo_with_an_entry_per_token_reads_each_tokens_own_logprob():
    """vLLM's layout: the prompt's entries, then the generated token's; position t's entry is the
    distribution that predicts token t, with its own logprob."""
    response = completion(["A", "B", "C", "D", "E"],
                          [None, {"B": -0.5, "A": -1.0}, {"A": -0.1, "C": -0.2}, {"D": -0.3, "E": -2.0},
                           {"E": -0.1, "A": -3.0}],
                          [None, -0.5, -0.2, -0.3, -0.1])
    row = scored(response, prompt_logprobs=True)
    assert row.logprobs == [-0.2, -0.3] and row.ranks == [2, 1]
    assert row.rank_margins == [None, 1.7]  # C is the last of the top-2: the token after it is unknown
    assert row.top == [((1, -0.1), (3, -0.2)), ((4, -0.3), (5, -2.0))]
    assert row.prompt_logprobs == [None, -0.5]
    assert len(set(row.hashes)) == 2


def test_an_echo_without_the_generated_tokens_entry_reads_each_logprob_from_the_entry_before():
    """llama-cpp-python's layout: one entry per given token, each the distribution after it."""
    response = completion(["A", "B", "C", "D"],
                          [None, {"A": -0.1, "C": -0.2}, {"D": -0.3, "E": -2.0}, {"E": -0.1, "A": -3.0}],
                          [None, -9.0, -9.0, -9.0])
    row = scored(response)
    assert row.logprobs == [-0.2, -0.3] and row.ranks == [2, 1]
    with pytest.raises(EngineError, match=r"token 'D' at position 3 .*raise llm_model.score\(top_k=...\)"):
        scored(completion(["A", "B", "C", "D"], [None, {"C": -0.2, "A": -0.5}, {"E": -0.3, "A": -1.0},
                                                 {"E": -0.1, "A": -2.0}]))


def test_two_tokens_with_one_text_in_a_text_keyed_top_k_are_never_read_as_one():
    """llama-cpp-python keys the top-k by text: a later token with the same text overwrites the first's
    logprob in the first's place (measured: ' 2 + 2 = 4.' after 'Q: What is 2 + 2?\\nA:', where ' ' was
    read as -8.6 for its true -0.017). The given token's text collapsed is refused by name; another
    collapsed text leaves the top-k (and the rank where it was above the given token)."""
    served = completion(["A", "B", "C", "D"],
                        [None, {"C": -3.0, "A": -0.5, "E": -1.0}, {"D": -0.3, "E": -2.0, "A": -2.5},
                         {"E": -0.1}], [None, -9.0, -9.0, -9.0])
    with pytest.raises(EngineError, match=r"two tokens with the text 'C' in the top-k of position 1: it keys "
                                          r"its top_logprobs by token text.*'C' at position 2"):
        scored(served, top_k=3)
    row = scored(served, prompt=(1, 2, 3), continuation=(4,), top_k=3, prompt_logprobs=True)
    assert row.prompt_logprobs == [None, None, None]  # C's -3.0 is another token's: not said
    assert row.logprobs == [-0.3]
    after = completion(["A", "B", "C", "D"],
                       [None, {"C": -0.2, "A": -4.0, "E": -1.0}, {"D": -0.3, "E": -2.0, "A": -2.5},
                        {"E": -0.1}], [None, -9.0, -9.0, -9.0])
    row = scored(after, top_k=3)
    assert row.logprobs == [-0.2, -0.3] and row.ranks == [1, 1]
    assert row.top[0] == ((3, -0.2), (5, -1.0))  # A's -4.0 is another token's: left out
    assert row.rank_margins[0] is None  # the token after C lost its logprob
    above = completion(["A", "B", "C", "D"],
                       [None, {"A": -4.0, "C": -0.5, "E": -1.0}, {"D": -0.3, "E": -2.0, "A": -2.5},
                        {"E": -0.1}], [None, -9.0, -9.0, -9.0])
    assert scored(above, top_k=3).ranks == [None, 1]  # a token above C lost its logprob: C's rank unknown
    adjacent = completion(["A", "B", "C", "D"],
                          [None, {"C": -0.2, "A": -1.0}, {"D": -0.3, "E": -2.0, "A": -2.5}, {"E": -0.1}],
                          [None, -9.0, -9.0, -9.0])
    with pytest.raises(EngineError, match=r"one text \(its top-k has fewer than k entries\)"):
        scored(adjacent, top_k=3)  # three asked, two served, none out of order: which text is unknown


def test_a_rank_is_known_inside_the_top_k_and_a_margin_where_both_neighbours_are():
    ranked = [("A", -0.1), ("B", -0.5), ("C", -0.6)]
    assert rank_and_margin("B", -0.5, ranked, 3) == (2, 0.1)
    assert rank_and_margin("C", -0.6, ranked, 3) == (3, None)  # the last of the k: the next one is unknown
    assert rank_and_margin("C", -0.6, ranked, 5) == (3, 0.1)  # the server had only 3 to give
    assert rank_and_margin("D", -4.0, ranked, 3) == (None, None)


@pytest.mark.parametrize("response, match", [
    (msgspec.convert({"choices": [{"text": "x"}]}, Completion), "sent no logprobs for the echoed prompt"),
    (completion(["E"], [{"E": -0.1}]), "echoed 1 tokens .* does not echo the prompt"),
    (completion(["A", "C", "C", "D", "E"], [None, {}, {}, {}, {}]),
     "echoed token 'C' .* at position 1 where the prompt has id 2"),
    (completion(["A", "B", "C", "D", "E"], [None, {"A": 0}, {"C": 5.0}, {"D": -1}, {"E": -1}]),
     "5.0 at position 2, which is no log-probability"),
])
def test_an_answer_that_cannot_be_a_score_names_what_the_server_lacks(response, match):
    with pytest.raises(EngineError, match=match):
        scored(response)


@pytest.mark.parametrize(("top", "chosen", "says"), [
    ({"A": -0.1, "C": -0.2}, -0.9, "the token 'C''s logprob -0.9 is not its own entry in the top-k, -0.2"),
    ({"A": -0.1, "E": -2.0}, -0.5, "the token 'C''s logprob -0.5 is above the lowest of the top-2 (-2.0), "
                                   "which yet leaves the token out of the k most likely"),
])
def test_a_logprob_that_contradicts_its_own_top_k_is_refused(top, chosen, says):
    """A score's logprob and its top-k come from one distribution: a server whose two disagree is lying
    in one of them, and nothing of the answer is recorded."""
    response = completion(["A", "B", "C", "D", "E"], [None, {"B": -0.5}, top, {"D": -0.3, "E": -2.0},
                                                      {"E": -0.1}], [None, -0.5, chosen, -0.3, -0.1])
    with pytest.raises(EngineError) as raised:
        scored(response)
    assert f"sent logprobs that contradict each other at position 2: {says}." in str(raised.value)


def test_a_top_k_that_agrees_within_rounding_is_taken():
    response = completion(["A", "B", "C", "D", "E"], [None, {"B": -0.5}, {"A": -0.1, "C": -0.20001},
                                                      {"D": -0.3, "E": -2.0}, {"E": -0.1}],
                          [None, -0.5, -0.2, -0.3, -0.1])
    assert scored(response).logprobs == [-0.2, -0.3]


def test_a_score_whose_top_k_ids_spell_the_key_is_refused_with_the_key_masked():
    """D14 for scores: the runner-up at each position is a digit of the key (one token each in the tiny
    tokenizer): the top-k ids a golden records would decode to it."""
    from pytest_llmdeterminism.engines import BUILTIN_MODELS
    from pytest_llmdeterminism.engines.checkpoint import load_tokenizer
    from pytest_llmdeterminism.engines.server.secret import Secret
    from tests.helpers.hostile_server import KEY

    tokenizer = load_tokenizer("tiny", BUILTIN_MODELS["tiny"])
    ids = {str(tokenizer.decode([i])): i for i in range(len(tokenizer))}
    digits = "0123456789"
    texts = ["a"] * (len(digits) + 2)  # the prompt's, the continuation's, and the generated token's
    response = completion(texts, [None, *({"a": -0.1, d: -3.0} for d in digits), {"a": -0.1}],
                          [None, *[-0.1] * (len(digits) + 1)])
    with pytest.raises(EngineError) as raised:
        scored_row("openai:x", response, prompt=[ids["a"]], continuation=[ids["a"]] * len(digits), top_k=2,
                   token_id=ids.__getitem__, prompt_logprobs=False, secret=Secret(KEY), tokenizer=tokenizer)
    assert "sent a top-k that spells the API key (the ids of rank 2 of its top-k" in str(raised.value)
