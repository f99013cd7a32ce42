"""``llm_model.score`` on the transformers engine (issue 42): the model's own teacher-forced logprobs,
in the fixed shape, on the kernels generation runs on."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import xxhash

from pytest_llmdeterminism import ConfigurationError
from pytest_llmdeterminism.generation import PromptForm, Score
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

PAIRS = [("The capital of France is", " Paris, and the capital of Italy is Rome."),
         ("def add(a, b):", "\n    return a + b"),
         ("Once upon a time", " there was a tiny model")]


def llm_at(tiny, shape: str) -> LLMModel:
    return LLMModel(tiny, GenerationSettings(BatchShape.parse(shape), 8, 0))


def plain_logprobs(tiny, ids: list[int]) -> torch.Tensor:
    """transformers' own: ``log_softmax(model(ids).logits)``, one unpadded row, default kernels."""
    with torch.inference_mode():
        return torch.log_softmax(tiny.model(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_a_score_is_plain_transformers_log_softmax_at_the_continuations_positions(tiny):
    scores = llm_at(tiny, "4x32").score(PAIRS, prompt_logprobs=True)
    assert [s.continuation for s in scores] == [c for _, c in PAIRS]
    for score in scores:
        prompt, tokens = list(score.prompt_token_ids), list(score.token_ids)
        expected = plain_logprobs(tiny, prompt + tokens)
        before = len(prompt) - 1  # the row that predicts the first continuation token
        for t, token in enumerate(tokens):
            row = expected[before + t]
            assert score.logprobs[t] == pytest.approx(row[token].item(), abs=1e-5)
            assert score.ranks[t] == 1 + int((row > row[token]).sum())
            others = torch.cat([row[:token], row[token + 1:]])
            assert score.rank_margins[t] == pytest.approx((others - row[token]).abs().min().item(), abs=1e-5)
            best = torch.topk(row, 5)
            assert [i for i, _ in score.top_logprobs[t]] == best.indices.tolist()
            assert [v for _, v in score.top_logprobs[t]] == pytest.approx(best.values.tolist(), abs=1e-5)
        assert score.prompt_logprobs[0] is None
        assert score.prompt_logprobs[1:] == pytest.approx(
            [expected[i - 1, prompt[i]].item() for i in range(1, len(prompt))], abs=1e-5)
        assert score.total == pytest.approx(sum(score.logprobs))
        assert score.kind == "score" and score.variant == "cpu/float32"


def test_a_string_continuation_is_tokenised_on_its_own_and_its_pieces_kept(tiny):
    llm = llm_at(tiny, "4x32")
    score = llm.score("Hello", " world again")
    assert list(score.token_ids) == tiny.tokenizer(" world again", add_special_tokens=False)["input_ids"]
    assert "".join(score.pieces) == " world again"
    assert list(score.prompt_token_ids) == llm.encode("Hello")
    assert score.prompt_logprobs == ()  # not asked for
    by_ids = llm.score(list(score.prompt_token_ids), list(score.token_ids))
    assert by_ids.prompt_form is PromptForm.TOKEN_IDS
    assert by_ids.step_hashes == score.step_hashes and by_ids.logprobs == score.logprobs


def test_a_chat_prompt_is_rendered_as_generate_renders_it(tiny):
    llm = llm_at(tiny, "4x64")
    chat = [{"role": "user", "content": "Say hi"}]
    score = llm.score(chat, "Hi!")
    assert score.prompt_form is PromptForm.CHAT
    assert list(score.prompt_token_ids) == llm.encode(chat)


def test_scoring_the_greedy_continuation_gives_rank_one_and_its_first_token_is_the_first_step(tiny):
    """A one-token continuation's forward is the generation's first (prefill) forward: the same hash
    (of the float32 logits row) and top-k; a greedy token is the model's own choice everywhere (rank
    1, the top-1 of its position)."""
    llm = llm_at(tiny, "4x32")
    generation = llm.generate("The capital of France is")
    first = llm.score("The capital of France is", list(generation.token_ids[:1]))
    assert first.step_hashes == generation.step_hashes[:1]
    assert first.top_logprobs == generation.top_logprobs[:1]
    assert first.logprobs[0] == generation.top_logprobs[0][0][1]
    score = llm.score("The capital of France is", list(generation.token_ids))
    assert len(generation.token_ids) > 2 and all(rank == 1 for rank in score.ranks)
    assert [top[0][0] for top in score.top_logprobs] == list(generation.token_ids)


def test_the_step_hash_is_xxh3_of_the_float32_logits_row_that_predicts_the_token(tiny):
    """Of the forward over the prompt and the continuation but its last token (which predicts nothing)."""
    llm = llm_at(tiny, "1x8")  # one row, unpadded: the engine's forward is the plain one, on its kernels
    score = llm.score("Hello", " there my friend")
    ids = list(score.prompt_token_ids) + list(score.token_ids[:-1])
    with torch.inference_mode(), tiny.engine.kernels.routed(tiny.model):
        logits = tiny.model(torch.tensor([ids])).logits[0].float()
    before = len(score.prompt_token_ids) - 1
    assert list(score.step_hashes) == [xxhash.xxh3_64_hexdigest(logits[before + t].numpy().tobytes())
                                       for t in range(len(score.token_ids))]


def test_a_scores_bits_do_not_depend_on_the_batch_shape_under_the_default_kernels(tiny):
    assert tiny.engine.kernels.batch_invariant  # the suite's portable numerics: the default kernels
    found = {shape: llm_at(tiny, shape).score(PAIRS) for shape in ("1x8", "4x32", "8x64")}
    alone = found["1x8"]  # one row: each pair alone, unpadded, at its own length
    for shape, scores in found.items():
        for mine, other in zip(alone, scores, strict=True):
            assert other.step_hashes == mine.step_hashes, shape
            assert (other.logprobs, other.ranks, other.rank_margins, other.top_logprobs) == \
                (mine.logprobs, mine.ranks, mine.rank_margins, mine.top_logprobs), shape
    assert {s.batch_shape for s in found["8x64"]} == {"8x64"}
    assert found["4x32"][0].step_hashes != found["4x32"][1].step_hashes[:len(found["4x32"][0].step_hashes)]


def test_more_pairs_than_rows_run_in_chunks_of_the_shape(tiny):
    pairs = PAIRS * 2  # 6 pairs at 4 rows: two chunks
    scores = llm_at(tiny, "4x32").score(pairs)
    assert [s.step_hashes for s in scores[3:]] == [s.step_hashes for s in scores[:3]]


@pytest.mark.parametrize("continuation, match", [
    ("", "encodes to no tokens"),
    ([], "encodes to no tokens"),
    ([10 ** 9], "token ids between 0 and"),
    (3.5, "as a string or a list of token ids"),
    (" and so on" * 10, r"need \d+ positions but llm_batch_shape '4x32' allows 31.*raise L, e.g. "
                        r"--llm-batch-shape=4x64"),
])
def test_a_continuation_that_cannot_be_scored_is_refused_naming_the_fix(tiny, continuation, match):
    with pytest.raises(ConfigurationError, match=match):
        llm_at(tiny, "4x32").score("Hello", continuation)


def test_a_special_tokens_text_in_a_string_continuation_is_refused_and_its_ids_are_scored(tiny):
    """The docs say a string continuation is tokenised without special tokens; the tokenizer reads
    ``<|bos|>`` as its special id even so, so the text is refused, and the ids score it on purpose."""
    llm = llm_at(tiny, "4x32")
    with pytest.raises(ConfigurationError) as raised:
        llm.score("Hello", " the<|bos|> end")
    assert str(raised.value) == (
        "llm_model.score(continuation) = ' the<|bos|> end': holds '<|bos|>', the text of the tokenizer's "
        "special token 1, which it would read as that token; a string continuation is scored as text, "
        "without special tokens. To score the special token, give the continuation as token ids (with 1 "
        "where it goes); else remove '<|bos|>' from the text")
    assert llm.score("Hello", [1]).token_ids == (1,)


def test_a_pair_beyond_the_models_context_is_refused_naming_it(tiny):
    context = tiny.model.config.max_position_embeddings
    with pytest.raises(ConfigurationError, match=f"beyond the model's context of {context} .*shorten the"):
        llm_at(tiny, "1x8").score("Hello", [5] * context)


def test_a_list_without_continuations_and_bad_settings_are_refused(tiny):
    llm = llm_at(tiny, "4x32")
    with pytest.raises(TypeError, match=r"list of \(prompt, continuation\) pairs"):
        llm.score(["a", "b", "c"])
    with pytest.raises(ConfigurationError, match="top_k"):
        llm.score("Hello", " there", top_k=0)


def test_an_engine_that_cannot_score_is_refused_by_name(tiny):
    @dataclasses.dataclass
    class Generating:  # the generation protocol only
        name: str = "someengine"
        runs_rows_alone: bool = True

    llm = LLMModel(dataclasses.replace(tiny, engine=Generating()), GenerationSettings(BatchShape(4, 32), 8,
                                                                                      0))
    with pytest.raises(ConfigurationError, match="the someengine engine cannot score a continuation; score "):
        llm.score("Hello", " there")


def test_a_score_record_refuses_inconsistent_lengths():
    with pytest.raises(ValueError, match="at least one continuation token"):
        Score(prompt="a", prompt_token_ids=(1,), continuation="", token_ids=(), logprobs=(), ranks=(),
              step_hashes=(), top_logprobs=(), rank_margins=(), batch_shape="4x32")


def test_decode_vs_prefill_compares_each_generated_step_with_the_score_of_its_tokens(tiny):
    from pytest_llmdeterminism.model.decode_prefill import decode_vs_prefill

    llm = llm_at(tiny, "4x32")
    one = llm.generate("The capital of France is", max_new_tokens=1)
    found = decode_vs_prefill(llm, one)  # one step: the score's forward is the generation's prefill
    assert (found.steps, found.identical, found.first_different, found.max_logprob_delta) == (1, 1, None, 0.0)
    assert found.bitwise and found.ok and "bitwise (phase-invariant kernels) holds" in found.lines()[0]
    generation = llm.generate("The capital of France is", max_new_tokens=6)
    found = decode_vs_prefill(llm, generation)
    score = llm.score(list(generation.prompt_token_ids), list(generation.token_ids))
    same = [a == b for a, b in zip(generation.step_hashes, score.step_hashes, strict=True)]
    assert found.identical == sum(same)
    assert found.first_different == (None if all(same) else same.index(False))
    pairs = [(dict(mine), dict(theirs)) for mine, theirs in
             zip(generation.top_logprobs, score.top_logprobs, strict=True)]
    shared = [abs(mine[i] - theirs[i]) for mine, theirs in pairs for i in mine.keys() & theirs.keys()]
    chosen = [abs(top[0][1] - lp) for top, lp in zip(generation.top_logprobs, score.logprobs, strict=True)]
    assert found.max_logprob_delta == max(shared + chosen)
    assert found.ok is (found.identical == found.steps)  # bitwise is asked under phase-invariant kernels
    assert found.ok and found.identical == found.steps and found.max_logprob_delta == 0.0  # the same bits
    assert found.row().source == "decode-vs-prefill" and found.to_json()["ok"] is found.ok


def test_decode_vs_prefill_asks_the_tolerance_on_other_kernels(tiny, previous_kernels):
    from pytest_llmdeterminism.model.decode_prefill import decode_vs_prefill

    llm = llm_at(tiny, "4x32")
    found = decode_vs_prefill(llm, llm.generate("Once upon a time", max_new_tokens=6))
    assert not found.bitwise and found.tolerance == 1e-3
    assert found.ok and found.max_logprob_delta <= 1e-3
    strict = decode_vs_prefill(llm, llm.generate("Once upon a time", max_new_tokens=6), tolerance=-1.0)
    assert not strict.ok and "does NOT hold" in strict.lines()[0]


def test_the_opt_in_check_asks_bitwise_on_phase_invariant_kernels(tiny, monkeypatch):
    """``assert_decode_matches_prefill`` under the default kernels (portable, batch-invariant): every step
    bitwise the score's position; a step that differs in its bits alone, within the tolerance, fails
    it, with the lines."""
    from pytest_llmdeterminism import DecodePrefillMismatchError, assert_decode_matches_prefill
    from pytest_llmdeterminism.model import decode_prefill

    llm = llm_at(tiny, "4x32")
    generation = llm.generate("Once upon a time", max_new_tokens=6)
    found = assert_decode_matches_prefill(llm, generation)
    assert found == decode_prefill.decode_vs_prefill(llm, generation)
    assert (found.bitwise, found.identical, found.steps, found.max_logprob_delta) == (True, 6, 6, 0.0)
    # the score's third position in other bits (its hash), the same logprobs: bitwise fails, tolerance holds
    score = llm.score(list(generation.prompt_token_ids), list(generation.token_ids))
    hashes = list(score.step_hashes)
    hashes[2] = "0" * len(hashes[2])
    monkeypatch.setattr(LLMModel, "score", lambda self, *a, **k: dataclasses.replace(score,
                                                                                    step_hashes=tuple(hashes)))
    with pytest.raises(DecodePrefillMismatchError, match="bitwise \\(phase-invariant kernels\\) does NOT "
                       "hold, within 0.001 holds: 5 of 6 steps bitwise identical, first different at step 2"):
        assert_decode_matches_prefill(llm, generation)


def test_the_opt_in_check_asks_the_tolerance_on_kernels_that_are_not_phase_invariant(tiny, previous_kernels):
    """On the previous kernels decode and prefill take other linears and attention lengths: the check
    asks the dtype's tolerance, reports how many steps were bitwise, and fails beyond the tolerance."""
    from pytest_llmdeterminism import DecodePrefillMismatchError, assert_decode_matches_prefill

    llm = llm_at(tiny, "4x32")
    generation = llm.generate("Once upon a time", max_new_tokens=6)
    found = assert_decode_matches_prefill(llm, generation)
    assert not found.bitwise and found.within_tolerance and found.max_logprob_delta <= found.tolerance == 1e-3
    print(f"decode vs prefill (tiny, previous kernels): {found.identical} of {found.steps} steps bitwise, "
          f"largest |Δlogprob| {found.max_logprob_delta:.3g}")
    with pytest.raises(DecodePrefillMismatchError, match="within -1 does NOT hold") as raised:
        assert_decode_matches_prefill(llm, generation, tolerance=-1.0)
    assert raised.value.found.max_logprob_delta == found.max_logprob_delta


def test_the_audit_has_a_decode_vs_prefill_row_where_the_engine_can_score(tiny):
    from pytest_llmdeterminism.model.audit import audit
    from pytest_llmdeterminism.model.decode_prefill import decode_vs_prefill

    llm = llm_at(tiny, "4x32").with_settings(max_new_tokens=6)
    found = audit(llm, "Once upon a time", repeats=1)
    rows = {row.source: row for row in found.rows}
    expected = decode_vs_prefill(llm, llm.generate("Once upon a time"))
    row = rows["decode-vs-prefill"]
    assert (row.max_logit_delta, row.first_step, row.tokens_changed) == (
        expected.max_logprob_delta, expected.first_different, False)
    assert row.change == f"6 steps, {expected.identical} bitwise"
    assert any(line.lstrip().startswith("decode-vs-prefill") for line in found.lines())

    class Unscoring:  # the same engine without ``score``: the audit has no row for it
        def __init__(self, engine):
            self._engine = engine

        def __getattr__(self, name):
            if name == "score":
                raise AttributeError(name)
            return getattr(self._engine, name)

    unscoring = LLMModel(dataclasses.replace(tiny, engine=Unscoring(tiny.engine)), llm.settings)
    others = audit(unscoring, "Once upon a time", repeats=1)
    assert [r.source for r in others.rows] == [r.source for r in found.rows
                                               if r.source != "decode-vs-prefill"]
