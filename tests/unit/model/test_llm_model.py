"""Greedy fixed-shape generation on the real tiny model (in process, no pytest plugin layer)."""

import random
import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pytest_llmdeterminism.errors import ConfigurationError, PromptTooLongError
from pytest_llmdeterminism.shape import MAX_LENGTH, MAX_ROWS, MAX_TOKENS, BatchShape

PROMPT = "The capital of France is"
OTHERS = ["Hello there", "Count: one,", "The weather today is", "x", "def add(a, b):", "Once upon a time"]


def test_checkpoint_sampling_defaults_are_overridden(make_llm, tiny):
    # The tiny checkpoint ships do_sample=True, temperature=0.7, top_p=0.9, top_k=20 on purpose.
    assert tiny.model.generation_config.do_sample is True
    llm = make_llm(max_new_tokens=16)
    first = llm.generate("My favourite food is")
    # Greedy: every chosen token is the argmax of the raw logits the step recorded.
    assert [top[0][0] for top in first.top_logprobs] == list(first.token_ids)
    assert all(m >= 0 for m in first.margins)
    assert first.generation_config["do_sample"] is False
    assert all(llm.generate("My favourite food is") == first for _ in range(3))
    assert tiny.model.generation_config.do_sample is True  # the checkpoint's config is put back


def test_result_is_independent_of_batch_companions_and_row(make_llm):
    llm = make_llm("4x32")
    alone = llm.generate(PROMPT)
    assert "Paris" in alone.text and alone.finish_reason == "eos"
    for row in range(4):
        companions = OTHERS[row:row + 3]
        batch = companions[:row] + [PROMPT] + companions[row:]
        assert llm.generate(batch)[row] == alone, f"row {row} of {batch}"


def test_lists_longer_than_b_run_in_chunks_with_the_same_results(make_llm):
    llm = make_llm("4x32", max_new_tokens=6)
    prompts = [PROMPT, *OTHERS, "Q: What is the capital of Peru? A:", "The cat sat on the"]
    together = llm.generate(prompts)
    assert len(together) == len(prompts) == 9
    assert together == [llm.generate(p) for p in prompts]
    assert [g.prompt for g in together] == prompts


def test_prompt_longer_than_the_shape_names_the_setting(make_llm):
    llm = make_llm("2x8")
    long_prompt = "Once upon a time there was a small model that liked to count."
    with pytest.raises(PromptTooLongError) as info:
        llm.generate(["x", long_prompt])
    message = str(info.value)
    assert "llm_batch_shape '2x8' allows 7 (one position always stays padding)" in message
    assert f'llm_batch_shape = "2x{1 << info.value.n_tokens.bit_length()}"' in message  # pyproject.toml
    assert f'llm_batch_shape = 2x{1 << info.value.n_tokens.bit_length()};' in message  # pytest.ini
    assert info.value.n_tokens > 8


@pytest.mark.parametrize("shape_in_goldens", [True, False], ids=["previous-kernels", "batch-invariant"])
def test_a_too_long_prompt_says_what_a_new_shape_does_to_goldens_under_the_kernels_in_use(shape_in_goldens):
    message = str(PromptTooLongError("a long prompt", 40, "2x8", fitting="2x64",
                                     shape_in_goldens=shape_in_goldens))
    if shape_in_goldens:
        assert "the shape is part of every golden, so re-record them afterwards (--llm-golden-update)" \
            in message
    else:
        assert "The goldens stay valid: under the kernels in use they do not depend on the batch shape" \
            in message
        assert "re-record" not in message


def test_the_model_tells_a_too_long_prompt_whether_its_kernels_put_the_shape_in_goldens(make_llm, tiny):
    with pytest.raises(PromptTooLongError) as info:
        make_llm("2x8").generate("Once upon a time there was a small model that liked to count.")
    invariant = tiny.engine.kernels.batch_invariant
    assert ("re-record" in str(info.value)) is not invariant
    assert ("The goldens stay valid" in str(info.value)) is invariant


def test_rng_consumption_before_generate_changes_nothing(make_llm):
    llm = make_llm()
    reference = llm.generate(PROMPT)
    torch.rand(1000)
    random.random()
    torch.manual_seed(12345)
    assert llm.generate(PROMPT) == reference


def test_train_mode_left_on_by_a_test_is_switched_off(make_llm, tiny):
    llm = make_llm()
    reference = llm.generate("Once upon a time")
    tiny.model.train()
    try:
        assert llm.generate("Once upon a time") == reference
        assert not tiny.model.training
    finally:
        tiny.model.eval()


def test_logit_hash_is_taken_before_logits_processors(make_llm):
    # A repetition penalty rewrites the scores of every step, step 0 included (it penalises the
    # prompt's tokens), but not the model's raw output: the first step's hash must not move.
    llm = make_llm(max_new_tokens=4)
    plain = llm.generate("Count: one,")
    penalised = llm.generate("Count: one,", repetition_penalty=5.0)
    assert penalised.step_hashes[0] == plain.step_hashes[0]
    assert penalised.generation_config["repetition_penalty"] == 5.0
    assert penalised.token_ids != plain.token_ids  # the penalty did act on the processed scores


def test_step_records_are_consistent(make_llm):
    gen = make_llm(max_new_tokens=10).generate("Once upon a time")
    assert gen.finish_reason == "length" and len(gen.token_ids) == 10
    assert len(set(gen.step_hashes)) == 10 and all(len(h) == 16 for h in gen.step_hashes)
    for top, margin in zip(gen.top_logprobs, gen.margins, strict=True):
        assert len(top) == 5
        assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
        assert margin == pytest.approx(top[0][1] - top[1][1], abs=2e-6)
    assert "".join(gen.pieces) == gen.text


def test_tiny_model_has_clear_winners_and_some_near_ties(make_llm):
    llm = make_llm(max_new_tokens=6)
    prompts = [PROMPT, "My favourite colour is", "The weather today is", "The cat sat on the", "Count: one,"]
    margins = [m for g in llm.generate(prompts) for m in g.margins]
    assert sum(m > 2.0 for m in margins) > len(margins) * 0.7
    assert 1 <= sum(m < 0.5 for m in margins) <= 5


def test_bad_prompt_values(make_llm):
    llm = make_llm()
    with pytest.raises(TypeError, match="takes a prompt string, a chat conversation .* or a list of them"):
        llm.generate(42)
    with pytest.raises(TypeError):
        llm.generate([])


def test_top_k_and_margins_describe_the_scores_greedy_picked_from(make_llm):
    # min_new_tokens suppresses EOS: the raw top-1 would be EOS, the processed top-1 is the choice.
    gen = make_llm(max_new_tokens=8).generate("Count: one, two,", min_new_tokens=6)
    assert [top[0][0] for top in gen.top_logprobs] == list(gen.token_ids)
    assert all(token != 2 for token, _ in gen.top_logprobs[0])  # EOS was suppressed, not a candidate


def test_nan_logits_are_a_clear_error(tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from pytest_llmdeterminism.engines import BUILTIN_MODELS, load
    from pytest_llmdeterminism.errors import NonFiniteLogitsError
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    broken = tmp_path / "nan-tiny"
    shutil.copytree(BUILTIN_MODELS["tiny"], broken)
    weights = load_file(broken / "model.safetensors")
    weights["model.norm.weight"] = weights["model.norm.weight"] * float("nan")
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    llm = LLMModel(load(str(broken), dtype="float32", device="cpu"),
                   GenerationSettings(BatchShape(2, 16), 3, 0))
    with pytest.raises(NonFiniteLogitsError, match=r"NaN or infinite logits at step 0 \(row 0"):
        llm.generate(["x", "y"])


def test_a_prompt_one_token_short_of_l_is_batch_invariant_and_l_tokens_are_refused(make_llm):
    # With no padding anywhere the attention mask is dropped and another kernel path runs, which
    # made a prompt of exactly L tokens change with its companions; one position stays padding.
    from pytest_llmdeterminism.strategies import assert_batch_invariant

    llm = make_llm("4x32", max_new_tokens=3)
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
             "twelve", "thirteen", "fourteen"]
    candidates = (" ".join(words[:n]) + " x" * k for n in range(len(words), 0, -1) for k in range(8))
    longest = next(c for c in candidates if len(llm.tokenizer(c)["input_ids"]) == 31)
    assert len(llm.tokenizer(longest)["input_ids"]) == 31
    assert_batch_invariant(llm, longest, ["Q:"])
    assert_batch_invariant(llm, longest, ["Q:", "The sky is", "x"])
    with pytest.raises(PromptTooLongError):
        llm.generate(" ".join(words))  # 32 tokens


CONVERSATION = [{"role": "user", "content": "What is the capital of Japan?"}]


def test_a_conversation_is_rendered_and_tokenised_once_without_a_second_bos(make_llm):
    llm = make_llm(max_new_tokens=4)
    result = llm.generate(CONVERSATION)
    bos = llm.tokenizer.bos_token_id
    rendered = llm.tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert result.prompt == rendered and result.prompt_form == "chat"
    assert result.prompt_token_ids[0] == bos and result.prompt_token_ids[1] != bos
    assert llm.tokenizer(rendered)["input_ids"][:2] == [bos, bos]  # the trap: the usual call adds a second
    assert "Tokyo" in result.text
    # The same ids given directly give the same bits; a list of conversations gives one result each.
    direct = llm.generate(token_ids=list(result.prompt_token_ids))
    assert direct.prompt_form == "token_ids"
    assert (direct.token_ids, direct.step_hashes) == (result.token_ids, result.step_hashes)
    both = llm.generate([CONVERSATION, "The sky is"])
    assert [r.prompt_form for r in both] == ["chat", "text"] and both[0].token_ids == result.token_ids
    assert llm.encode(CONVERSATION) == list(result.prompt_token_ids)


@pytest.mark.parametrize(("call", "problem"), [
    (lambda llm: llm.generate(token_ids=[1, 10**9]),
     r"token_ids=\.\.\.\) = .*expected a list of token ids between 0"),
    (lambda llm: llm.generate("x", token_ids=[1]), "exactly one of the two"),
    (lambda llm: llm.generate([{"content": "no role"}]), "takes prompt strings or chat conversations"),
])
def test_bad_inputs_are_named(make_llm, call, problem):
    with pytest.raises((TypeError, ValueError), match=problem):
        call(make_llm())


def test_a_tokenizer_without_a_chat_template_says_what_to_pass_instead(tmp_path):
    import shutil

    from pytest_llmdeterminism.engines import BUILTIN_MODELS, load
    from pytest_llmdeterminism.errors import ConfigurationError
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    plain = tmp_path / "plain"
    shutil.copytree(BUILTIN_MODELS["tiny"], plain)
    (plain / "chat_template.jinja").unlink()
    llm = LLMModel(load(str(plain), dtype="float32", device="cpu"),
                   GenerationSettings(BatchShape(2, 32), 2, 0))
    with pytest.raises(ConfigurationError, match="has no chat template; pass the prompt as a string, or its "
                                                 r"token ids with token_ids=\[\.\.\.\]"):
        llm.generate(CONVERSATION)


def test_a_prompt_no_accepted_shape_holds_gets_no_shape_the_plugin_would_refuse(make_llm):
    with pytest.raises(PromptTooLongError) as info:
        make_llm("2x8").generate(token_ids=[5] * 600_000)
    message = str(info.value)
    assert "no batch shape the plugin accepts holds it: shorten the prompt" in message
    assert "llm_batch_shape =" not in message


@given(rows=st.integers(1, MAX_ROWS), length=st.integers(1, 4096), n_tokens=st.integers(1, 1 << 21))
def test_the_suggested_shape_holds_the_prompt_and_is_accepted(rows, length, n_tokens):
    fitting = BatchShape(rows, length).holding(n_tokens)
    if fitting is None:
        assert n_tokens >= MAX_LENGTH
        return
    assert BatchShape.parse(str(fitting)) == fitting and fitting.length > n_tokens
    assert fitting.rows == min(rows, MAX_TOKENS // fitting.length)


def test_max_new_tokens_beyond_the_models_context_is_refused_with_the_numbers(make_llm, tiny):
    context = tiny.model.config.max_position_embeddings  # 512
    with pytest.raises(ConfigurationError) as info:
        make_llm("2x32", max_new_tokens=100_000).generate(PROMPT)
    message = str(info.value)
    assert (f"the 2x32 shape's 32 prompt positions plus 100000 new tokens need 100032 positions, beyond the "
            f"model's context of {context}") in message
    assert f"lower max_new_tokens to at most {context - 32}" in message
    with pytest.raises(ConfigurationError, match=f"need {context + 1} positions"):
        make_llm("2x32", max_new_tokens=4).generate(PROMPT, max_new_tokens=context - 31)


@pytest.mark.usefixtures("previous_kernels")
def test_a_lone_prompt_runs_unpadded_and_stops_at_eos_as_a_plain_generate_would(make_llm, tiny):
    """The default shape (1xL) runs the test a user would have written: batch 1, the prompt's own
    length, no filler rows, and no step past the EOS. Counted on the model's forward calls."""
    llm = make_llm("1x128", max_new_tokens=8)
    shapes: list[tuple[int, ...]] = []

    def record(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        shapes.append(tuple(ids.shape))

    handle = tiny.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        full = llm.generate("Once upon a time")
        prompt_length = len(full.prompt_token_ids)
        assert full.finish_reason == "length" and len(full.token_ids) == 8
        assert shapes[0] == (1, prompt_length) and len(shapes) == 8  # prefill unpadded, then one per token
        assert full.batch_shape == f"1x{prompt_length}"
        shapes.clear()
        step = next(i for i, t in enumerate(full.token_ids) if i >= 2 and t not in full.token_ids[:i])
        stopped = llm.generate("Once upon a time", eos_token_id=full.token_ids[step])
    finally:
        handle.remove()
    assert stopped.finish_reason == "eos" and stopped.token_ids == full.token_ids[:step + 1]
    assert len(shapes) == step + 1  # no forward after the EOS
    assert stopped.step_hashes == full.step_hashes[:step + 1]  # the same numerics, only shorter


@pytest.mark.usefixtures("previous_kernels")
def test_a_lone_prompt_gives_the_bits_of_a_plain_generate_of_it(make_llm, tiny):
    """No padding and no mask trick: the captured logits are the ones a bare generate() computes (on
    the kernels the pinned numerics run linears on)."""
    from pytest_llmdeterminism.engines.capture import StepCapture

    gen = make_llm("1x128", max_new_tokens=6).generate(PROMPT)
    encoded = tiny.tokenizer(PROMPT, return_tensors="pt")
    config = dict(gen.generation_config)
    with torch.inference_mode(), StepCapture(tiny.model, rows=1) as capture, \
            tiny.engine.kernels.routed(tiny.model):
        from transformers import GenerationConfig

        tiny.model.generate(**encoded, generation_config=GenerationConfig(**config),
                            logits_processor=capture.logits_processor())
    assert tuple(capture.rows[0].hashes) == gen.step_hashes


def test_a_lone_prompt_longer_than_l_runs_at_its_own_length_up_to_the_models_context(make_llm, tiny):
    """At one row L bounds nothing (a plain generate() has no such limit); the model's context does."""
    long_prompt = "one two three four five six seven eight nine ten " * 20
    n_tokens = len(tiny.tokenizer(long_prompt)["input_ids"])
    assert 16 < n_tokens < tiny.model.config.max_position_embeddings - 4
    gen = make_llm("1x16", max_new_tokens=4).generate(long_prompt)
    assert gen.batch_shape == f"1x{n_tokens}" and len(gen.prompt_token_ids) == n_tokens
    with pytest.raises(PromptTooLongError, match=r"'2x16' allows 15"):
        make_llm("2x16", max_new_tokens=4).generate(long_prompt)  # rows that share a batch are padded to L
    too_long = long_prompt * 4
    with pytest.raises(ConfigurationError, match=r"beyond the model's context of 512.*shorten the prompt"):
        make_llm("1x16", max_new_tokens=4).generate(too_long)


@pytest.mark.parametrize(("conversation", "problem"), [
    ([{"role": "wizard", "content": "Cast a spell"}],
     "llm_model.generate(conversation[0]['role']) = 'wizard': unknown role; expected one of 'system', "
     "'user', 'assistant', 'tool'"),
    ([{"role": "system", "content": "Be brief"}, {"role": "user", "content": None}],
     "llm_model.generate(conversation[1]['content']) = None: expected the message's text as a string, got "
     "NoneType"),
    ([{"role": "user", "content": ["part"]}], "conversation[0]['content']) = ['part']: expected the"),
])
def test_a_chat_message_of_an_unknown_role_or_without_text_is_refused_before_rendering(make_llm, conversation,
                                                                                       problem):
    llm = make_llm()
    with pytest.raises(ConfigurationError) as info:
        llm.generate(conversation)
    assert problem in str(info.value)
    with pytest.raises(ConfigurationError, match=re.escape(problem.replace("conversation[", "prompt[1]["))):
        llm.generate(["The sky is", conversation])  # one of a list, named by its place, before any runs


class _CountingTokenizer:
    """The tokenizer, counting the texts it is asked to tokenise."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("as_chat", [False, True])
def test_a_prompt_too_long_for_any_tokenisation_is_refused_before_it_is_tokenised(tiny, as_chat):
    from pytest_llmdeterminism.model import inputs
    from pytest_llmdeterminism.shape import GenerationSettings

    tokenizer = _CountingTokenizer(tiny.tokenizer)
    huge = "word " * 2_000_000  # 10 MB: seconds and gigabytes to tokenise, only to be refused
    prompt = [{"role": "user", "content": huge}] if as_chat else huge
    with pytest.raises(PromptTooLongError) as info:
        inputs.encoded(prompt, tokenizer=tokenizer, settings=GenerationSettings(BatchShape(2, 64), 2, 0),
                       spec="builtin:tiny")
    assert tokenizer.calls == 0
    assert info.value.at_least and info.value.n_tokens >= 1_000_000
    message = str(info.value)
    assert "has at least " in message and "shorten the prompt" in message
    assert "a text this long is not tokenised) but llm_batch_shape '2x64' allows 63 (one" in message


def test_a_prompt_over_the_length_bound_is_counted_unless_too_long_to_count(tiny):
    """Past the bound, a text a shape could hold is tokenised: the error gives its real count and a
    shape that holds it. A text too long to count (over COUNTED_CHARACTERS) says its count is a bound
    from its length and suggests no shape to paste: one from the bound would be too small."""
    from pytest_llmdeterminism.model import inputs
    from pytest_llmdeterminism.shape import GenerationSettings

    settings = GenerationSettings(BatchShape(2, 4), 2, 0)
    tokenizer = _CountingTokenizer(tiny.tokenizer)
    prompt = "Once upon a time there was a little girl who lived in"
    with pytest.raises(PromptTooLongError) as counted:
        inputs.encoded(prompt, tokenizer=tokenizer, settings=settings, spec="builtin:tiny")
    assert tokenizer.calls == 1 and not counted.value.at_least
    assert counted.value.n_tokens == len(tiny.tokenizer(prompt)["input_ids"]) == 31
    assert "llm_batch_shape = 2x32" in str(counted.value)
    long = "word " * (inputs.COUNTED_CHARACTERS // 5 + 1)  # >= 100,001 tokens: 2x131072 could hold it
    with pytest.raises(PromptTooLongError) as bounded:
        inputs.encoded(long, tokenizer=tokenizer, settings=settings, spec="builtin:tiny")
    assert tokenizer.calls == 1 and bounded.value.at_least
    message = str(bounded.value)
    assert f"has at least {bounded.value.n_tokens} tokens (a bound from its 1,000,005 characters; a text " \
           "this long is not tokenised)" in message
    assert f"raise L above its token count (more than {bounded.value.n_tokens}" in message
    assert "llm_batch_shape =" not in message and "--llm-batch-shape" not in message


def test_the_length_bound_never_refuses_a_prompt_that_fits(make_llm, tiny):
    """The densest text there is: the longest vocabulary entry, over and over, fits in as many tokens."""
    from pytest_llmdeterminism.model import inputs

    vocabulary = tiny.tokenizer.get_vocab()
    longest = max(vocabulary, key=len)
    per_token = inputs.characters_per_token(tiny.tokenizer)
    assert per_token == len(longest)
    densest = tiny.tokenizer.decode([vocabulary[longest]] * 14)
    assert len(densest) == 14 * per_token
    assert len(make_llm("2x16").encode(densest)) == 15  # with the BOS: the most 2x16 allows
    with pytest.raises(PromptTooLongError) as info:
        make_llm("2x16").encode(densest + densest[:per_token])
    assert not info.value.at_least and info.value.n_tokens == 16  # counted, not refused by the bound


@given(text=st.text(min_size=1, max_size=200))
def test_the_length_bound_is_a_true_lower_bound_on_the_tokens(tiny, text):
    from pytest_llmdeterminism.model import inputs

    ids = tiny.tokenizer(text)["input_ids"]
    assert len(ids) * inputs.characters_per_token(tiny.tokenizer) >= len(text)


def test_a_tokenizer_that_may_drop_characters_gets_no_length_bound():
    """Whitespace splitting drops spaces: 100,002 characters are 2 tokens there, and must run."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from pytest_llmdeterminism.model import inputs
    from pytest_llmdeterminism.shape import GenerationSettings

    backend = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    assert inputs.characters_per_token(tokenizer) is None
    given = inputs.encoded("a" + " " * 100_000 + "b", tokenizer=tokenizer,
                           settings=GenerationSettings(BatchShape(2, 8), 2, 0), spec="x")
    assert given.ids == [0, 1]


def test_each_step_hash_is_the_xxh3_hex_digest_of_its_raw_float32_logits_row(tiny):
    """The stored hash definition: 16 lowercase hex digits of xxh3-64 over the little-endian float32
    logits of the row's last position, one per row and step, rows of a batch hashed apart."""
    import numpy as np
    import xxhash

    from pytest_llmdeterminism.engines.capture import StepCapture

    encoded = tiny.tokenizer(["Hello there", "Once upon a time"], return_tensors="pt", padding=True)
    with torch.inference_mode(), StepCapture(tiny.model, rows=2, keep_logits=True) as capture:
        tiny.model.generate(**encoded, do_sample=False, max_new_tokens=5,
                            logits_processor=capture.logits_processor())
    for row, steps in enumerate(capture.rows):
        expected = [xxhash.xxh3_64_hexdigest(np.asarray(step[row], dtype="<f4").tobytes())
                    for step in capture.logits]
        assert steps.hashes == expected and all(len(h) == 16 for h in expected)
    assert capture.rows[0].hashes != capture.rows[1].hashes


def test_no_processor_runs_unless_a_setting_needs_one(make_llm, monkeypatch):
    """The default greedy config runs no logits processor at all: transformers builds none (min_new_tokens
    =0 is left out, or it would run a MinLengthLogitsProcessor that never changes a score), and the
    capture takes the top-k from the raw logits, which are then the scores greedy picks from. Every
    setting that makes transformers add a processor also brings the capture's own, placed last."""
    from transformers.generation.utils import GenerationMixin

    prepared = GenerationMixin._get_logits_processor
    seen: list[list[str]] = []

    def spy(self, *args, **kwargs):
        processors = prepared(self, *args, **kwargs)
        seen.append([type(p).__name__ for p in processors])
        return processors

    monkeypatch.setattr(GenerationMixin, "_get_logits_processor", spy)
    llm = make_llm("1x32", max_new_tokens=8)
    early = llm.generate(PROMPT)  # the tiny model stops after three tokens (the probe's calls too)
    assert seen and all(processors == [] for processors in seen)
    assert early.finish_reason == "eos" and len(early.token_ids) < 6
    held = llm.generate(PROMPT, min_new_tokens=6)
    assert "MinNewTokensLengthLogitsProcessor" in seen[-1] and seen[-1][-1] == "_RecordScores"
    assert len(held.token_ids) >= 6
    for setting in ({"repetition_penalty": 1.3}, {"no_repeat_ngram_size": 2}):
        llm.generate(PROMPT, **setting)
        assert len(seen[-1]) == 2 and seen[-1][-1] == "_RecordScores", (setting, seen[-1])


def test_top_k_from_the_raw_logits_equals_the_processors_where_no_setting_changes_the_scores(tiny):
    """Without processors the capture reads the top-k from the raw logits: the same numbers, bit for bit,
    as its processor records from the scores (which transformers copies from those logits)."""
    from pytest_llmdeterminism.engines.capture import StepCapture

    encoded = tiny.tokenizer(["Hello there", "Once upon a time"], return_tensors="pt", padding=True)
    found = []
    for processed in (True, False):
        with torch.inference_mode(), StepCapture(tiny.model, rows=2, processed=processed) as capture:
            tiny.model.generate(**encoded, do_sample=False, max_new_tokens=6,
                                logits_processor=capture.logits_processor())
        found.append(capture.rows)
    assert found[0] == found[1] and len(found[0][0].top) == 6
