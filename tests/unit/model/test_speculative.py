"""Speculative decoding (``engines/hf_speculative.py``) on the tiny model: transformers' own prompt
lookup (2 and 5 tokens) and the model as its own draft give plain greedy decoding's tokens and every
step's hash, bit for bit, so a speculated call is IDENTICAL to the plain call's golden; the model as
its own draft accepts every draft; a planted verification bug is a REGRESSION with its margin; the
arguments speculation cannot take, and kernels whose verify pass is not decode's, are refused with
the reason; the audit's ``speculative`` row. SmolLM2: ``tests/real_model/test_smollm2_speculative.py``."""

from __future__ import annotations

import pytest

from pytest_llmdeterminism.errors import ConfigurationError, SamplingRefusedError
from pytest_llmdeterminism.judge.compare import Verdict, compare
from pytest_llmdeterminism.model.audit import audit
from pytest_llmdeterminism.shape import BatchShape
from tests.helpers.phases import PHASE_PROMPTS
from tests.helpers.speculation import LOOKUPS, first_draft_unverified, ways

STEPS = 32


@pytest.fixture
def llm(make_llm, tiny):
    """The tiny model at 4x64, 32 steps whatever it generates: its EOS is not what ends a generation
    here (the last id of its vocabulary, which it does not generate, is)."""
    model = make_llm("4x64", max_new_tokens=STEPS)
    never = len(tiny.tokenizer) - 1
    return model, {"eos_token_id": never}


def test_speculation_gives_plain_greedy_decodings_bits(llm):
    model, no_eos = llm
    plain = model.generate(PHASE_PROMPTS, **no_eos)
    assert {len(g.token_ids) for g in plain} == {STEPS}
    for way in ways(model):
        speculated = model.generate(PHASE_PROMPTS, **no_eos, **way)
        for expected, got in zip(plain, speculated, strict=True):
            assert got.token_ids == expected.token_ids, way
            assert got.step_hashes == expected.step_hashes, way
            assert (got.top_logprobs, got.margins) == (expected.top_logprobs, expected.margins)
            assert compare(expected, got).verdict is Verdict.IDENTICAL
            assert got.generation_config == expected.generation_config  # speculation is not recorded
            assert got.speculation is not None and got.speculation.passes >= 1
        assert all(g.speculation is None for g in plain)


def test_the_model_as_its_own_draft_accepts_every_draft(llm):
    model, no_eos = llm
    for got in model.generate(PHASE_PROMPTS, **no_eos, assistant_model=model):
        found = got.speculation
        # each verify pass commits its drafts and the model's next token: fewer forwards than steps
        assert found.drafted + found.passes >= STEPS > found.passes
        assert found.acceptance_rate == 1.0
    # its transformers model is the same draft
    assert model.generate(PHASE_PROMPTS[0], **no_eos, assistant_model=model.model).speculation.accepted > 0


def test_prompt_lookup_accepts_some_drafts_and_rejects_others(llm):
    """Prompt lookup drafts n-grams of the prompt and generation so far: once the tiny model repeats
    itself some are accepted, others rejected (a rejected pass still commits the model's own token)."""
    model, no_eos = llm
    found = model.generate(PHASE_PROMPTS[1], **no_eos, prompt_lookup_num_tokens=5).speculation
    assert 0 < found.accepted < found.drafted
    # each pass commits its accepted drafts and the model's next token (the last one, cut by the
    # length limit, may commit drafts alone)
    assert STEPS <= found.passes + found.accepted <= STEPS + 1


def test_a_planted_verification_bug_is_a_regression_with_its_margin(llm):
    """The first draft of each verify pass committed unverified: where the draft was not the model's
    token, the check is a REGRESSION at that step naming the golden's margin."""
    model, no_eos = llm
    plain = model.generate(PHASE_PROMPTS[1], **no_eos)
    with first_draft_unverified(model.model) as planted:
        broken = model.generate(PHASE_PROMPTS[1], **no_eos, prompt_lookup_num_tokens=2)
    assert planted
    found = compare(plain, broken)
    assert found.verdict is Verdict.REGRESSION
    step = next(t for t, (a, b) in enumerate(zip(plain.token_ids, broken.token_ids, strict=False)) if a != b)
    assert found.divergence is not None and found.divergence.step == step
    assert found.divergence.golden_margin == plain.margins[step] > found.tie_margin


def test_acceptance_reads_the_drafts_against_the_generation():
    """A pass accepts up to its first draft that is not the generated token; a draft an EOS or the
    length cut off (past the generation) is not counted (transformers' own count also drops one that
    was generated)."""
    from pytest_llmdeterminism.engines.hf_speculative import acceptance

    tokens = [5, 6, 7, 2]  # 2: the EOS
    found = acceptance("prompt_lookup", 3, tokens, [(3, [5, 9]), (4, []), (5, [7, 2, 8])])
    # the draft 8, past the EOS, was never up for acceptance
    assert (found.passes, found.drafted, found.accepted) == (3, 4, 3)
    assert found.acceptance_rate == 3 / 4
    assert acceptance("prompt_lookup", 3, tokens, [(3, [])]).acceptance_rate is None
    # the length limit cuts drafts too
    assert acceptance("prompt_lookup", 3, [5, 6], [(3, [5, 6, 7, 8])]).acceptance_rate == 1.0


@pytest.mark.parametrize(("overrides", "error", "says"), [
    ({"prompt_lookup_num_tokens": 2, "do_sample": True}, SamplingRefusedError, "greedy only"),
    ({"prompt_lookup_num_tokens": 2, "use_cache": False}, ConfigurationError, "leave use_cache on"),
    ({"prompt_lookup_num_tokens": -1}, ConfigurationError, "integer >= 1"),
    ({"prompt_lookup_num_tokens": "2"}, ConfigurationError, "integer >= 1"),
    ({"prompt_lookup_num_tokens": True}, ConfigurationError, "integer >= 1"),
    ({"prompt_lookup_num_tokens": 2, "assistant_model": "x"}, ConfigurationError, "one way of drafting"),
    ({"assistant_model": object()}, ConfigurationError, "the model itself"),
])
def test_what_speculation_cannot_take_is_refused_with_the_fix(llm, overrides, error, says):
    model, _ = llm
    with pytest.raises(error, match=says):
        model.generate("Hello", **overrides)


def test_no_speculation_is_plain_greedy(llm):
    model, no_eos = llm
    for none in ({"prompt_lookup_num_tokens": 0}, {"prompt_lookup_num_tokens": None},
                 {"assistant_model": None}):
        assert model.generate("Hello", **no_eos, **none).speculation is None


@pytest.mark.usefixtures("previous_kernels")
def test_kernels_whose_verify_pass_is_not_decodes_refuse_speculation(llm):
    """On the previous kernels (SDPA, other decode linears) a verify pass computes otherwise than a
    decode step: speculation is refused, naming why and the kernels that make it lossless."""
    model, _ = llm
    for way in LOOKUPS:
        with pytest.raises(ConfigurationError, match="lossless only where a verify pass") as raised:
            model.generate("Hello", **way)
        assert "llm_batch_invariant = true" in str(raised.value)


def test_the_audit_speculates_with_the_model_as_its_own_draft(llm):
    model, no_eos = llm
    found = audit(model, PHASE_PROMPTS[0], repeats=1, **no_eos)
    row = {row.source: row for row in found.rows}["speculative"]
    assert row.ran and not row.moved
    assert "own draft" in row.change and "100% of drafts accepted" in row.change
    given = {row.source: row for row in audit(model, PHASE_PROMPTS[0], repeats=1, **no_eos,
                                                 prompt_lookup_num_tokens=2).rows}["speculative"]
    assert given.ran and not given.moved and "prompt lookup of 2" in given.change


@pytest.mark.usefixtures("previous_kernels")
def test_the_audit_row_says_why_it_did_not_run_on_other_kernels(llm):
    model, _ = llm
    row = {row.source: row for row in audit(model, "Hello", repeats=1).rows}["speculative"]
    assert not row.ran and "verify pass is not a decode step's" in row.change


@pytest.mark.usefixtures("previous_kernels")
def test_why_it_is_refused_there_a_verify_pass_moves_the_bits(llm, monkeypatch):
    """The negative control: on the previous kernels, let through, the model as its own draft gives
    other step hashes than plain greedy decoding (a verify pass of k + 1 positions is not k + 1
    decode steps there)."""
    from pytest_llmdeterminism.engines import hf_speculative

    model, no_eos = llm
    monkeypatch.setattr(hf_speculative, "refuse_unless_lossless", lambda kernels, speculation: None)
    plain = model.with_settings(batch_shape=BatchShape(1, 64)).generate(
        PHASE_PROMPTS, **no_eos)
    speculated = model.generate(PHASE_PROMPTS, **no_eos, assistant_model=model)
    assert any(a.step_hashes != b.step_hashes for a, b in zip(plain, speculated, strict=True))


def test_no_prompt_lookup_beside_an_assistant_is_the_assistant(llm):
    """``prompt_lookup_num_tokens=0`` means no prompt lookup, also beside ``assistant_model``; the audit
    given 0 speculates with the model as its own draft, not with nothing."""
    model, no_eos = llm
    found = model.generate(PHASE_PROMPTS[0], **no_eos, prompt_lookup_num_tokens=0, assistant_model=model)
    assert found.speculation is not None and found.speculation.method == "assistant"
    row = {row.source: row for row in audit(model, PHASE_PROMPTS[0], repeats=1, **no_eos,
                                               prompt_lookup_num_tokens=0).rows}["speculative"]
    assert "own draft" in row.change


def test_what_speculation_patches_is_put_back_even_when_the_model_raises(llm, monkeypatch):
    """A forward that raises mid-speculation leaves the model's generation config, its candidate
    generator (an instance's own included) and ``F.linear`` as they were."""
    import torch

    model, no_eos = llm
    transformers_model = model.model
    config, own = transformers_model.generation_config, transformers_model._get_candidate_generator
    transformers_model._get_candidate_generator = own  # an instance's own (a bound method here)
    calls = []

    def broken(module, args, kwargs, output):
        calls.append(1)
        if len(calls) > 3:
            raise RuntimeError("a forward that fails")

    handle = transformers_model.register_forward_hook(broken, with_kwargs=True)
    try:
        with pytest.raises(RuntimeError, match="a forward that fails"):
            model.generate(PHASE_PROMPTS[0], **no_eos, assistant_model=model)
    finally:
        handle.remove()
    assert transformers_model.generation_config is config
    assert vars(transformers_model)["_get_candidate_generator"] is own
    del transformers_model._get_candidate_generator
    assert torch.nn.functional.linear is torch._C._nn.linear


def test_kept_logits_are_one_vocabulary_row_a_step_as_the_plain_paths(tiny):
    """With ``keep_logits`` (the audit's) each step is one row of the vocabulary, as plain decoding
    keeps it, the same numbers."""
    import dataclasses

    from pytest_llmdeterminism.decoding import Speculation, resolve_generation_config
    from pytest_llmdeterminism.shape import GenerationSettings

    ids = tiny.tokenizer(PHASE_PROMPTS[0])["input_ids"]
    config = resolve_generation_config({}, max_new_tokens=6, eos_token_ids=[], pad_token_id=0)
    settings = GenerationSettings(BatchShape(1, 64), 6, 0)
    plain = tiny.engine.run([ids], config, settings, True)
    lookup = dataclasses.replace(config, speculation=Speculation("prompt_lookup", 2))
    speculated = tiny.engine.run([ids], lookup, settings, True)
    assert [step.shape for step in speculated.logits[0]] == [step.shape for step in plain.logits[0]]
    assert all((a == b).all() for a, b in zip(plain.logits[0], speculated.logits[0], strict=True))
