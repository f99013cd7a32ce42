"""Score goldens: how much the model believes a fixed answer, checked on every run.

``llm_model.score(prompt, continuation)`` gives the logprob of each token of the continuation,
teacher-forced (every position conditioned on the given tokens before it), and
``golden_tokens.check`` records and compares it like a generation: position by position, whatever
changed. Run it with `pytest examples`; re-record with `pytest examples --llm-golden-update`.
"""

from pytest_llmdeterminism import deterministic


@deterministic
def test_belief_in_the_reference_answer(llm_model, golden_tokens):
    score = llm_model.score("Q: What is the capital of France? A:", " Paris.")
    golden_tokens.check(score)  # each position's logprob, rank and logit hash
    assert score.total < 0  # the answer's log-likelihood: the sum of its tokens' logprobs


@deterministic
def test_answers_scored_at_once(llm_model, golden_tokens):
    # One call scores several (prompt, continuation) pairs in the fixed shape: each gets the score
    # it would get alone.
    pairs = [("The colour of the sky is", " blue."), ("def add(a, b):", "\n    return a + b")]
    for (_, answer), score in zip(pairs, llm_model.score(pairs), strict=True):
        golden_tokens.check(score, name=answer.strip())
