"""Greedy decoding unless do_sample=True asks for the plugin's seeded sampler: sampling arguments
without it are refused naming do_sample=True, neutral values accepted."""

import numpy as np
import pytest

from pytest_llmdeterminism.decoding import resolve_generation_config
from pytest_llmdeterminism.errors import ConfigurationError, SamplingRefusedError


def resolve(**overrides):
    return resolve_generation_config(overrides, max_new_tokens=8, eos_token_ids=[2], pad_token_id=0)


@pytest.mark.parametrize(
    ("argument", "value", "why"),
    [
        ("temperature", 0.7, "only matters when sampling"),
        ("temperature", 1e-8, "even 1e-8 is sampling"),
        ("temperature", 1.0, "only matters when sampling"),
        ("top_p", 0.9, "nucleus sampling"),
        ("top_k", 50, "top-k is a sampling filter"),
        ("top_k", 1, "even top_k=1"),
        ("min_p", 0.05, "min-p"),
        ("typical_p", 0.9, "typical sampling"),
        ("epsilon_cutoff", 3e-4, "epsilon sampling"),
        ("eta_cutoff", 3e-4, "eta sampling"),
        ("num_beams", 4, "beam search is not greedy"),
        ("num_beam_groups", 2, "group beam search"),
        ("diversity_penalty", 0.5, "diverse beam search"),
        ("penalty_alpha", 0.6, "contrastive search"),
        ("num_return_sequences", 2, "several sequences"),
        ("generation_config", object(), "pass single arguments"),
        ("logits_processor", [], "not recorded"),
        ("streamer", object(), "streamers"),
        ("guidance_scale", 1.5, "not a recorded greedy setting"),
    ],
)
def test_sampling_argument_is_refused_with_its_name_and_reason(argument, value, why):
    with pytest.raises(SamplingRefusedError) as info:
        resolve(**{argument: value})
    message = str(info.value)
    assert f"llm_model.generate({argument}=" in message
    assert why in message
    assert f"remove {argument!r}" in message
    assert info.value.argument == argument


@pytest.mark.parametrize(
    "overrides",
    [{"do_sample": False}, {"temperature": None}, {"temperature": 0}, {"top_p": 1.0}, {"top_k": None},
     {"num_beams": 1}, {"num_return_sequences": 1}],
)
def test_neutral_values_mean_greedy_and_are_not_recorded(overrides):
    assert resolve(**overrides) == resolve()


def test_do_sample_zero_is_not_mistaken_for_false():
    with pytest.raises(SamplingRefusedError):
        resolve(num_beams=True)


def test_accepted_overrides_are_recorded():
    config = resolve(max_new_tokens=3, repetition_penalty=1.3, no_repeat_ngram_size=2, eos_token_id=5)
    assert config.max_new_tokens == 3
    assert config.repetition_penalty == 1.3
    assert config.no_repeat_ngram_size == 2
    assert config.eos_token_id == (5,)
    assert config.do_sample is False and config.num_beams == 1
    assert config.as_dict()["eos_token_id"] == [5]  # as a golden records it


def test_do_sample_true_takes_the_samplers_settings_and_records_them():
    config = resolve(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, seed=[3, 4])
    assert config.as_dict()["do_sample"] is True
    assert {k: config.as_dict()[k] for k in ("temperature", "top_k", "top_p", "min_p", "seed")} == \
        {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.05, "seed": 3}
    assert config.as_dict()["sampler"].startswith("gumbel-")
    assert [config.seed_of(0), config.seed_of(1)] == [3, 4]
    assert "sampler" not in resolve().as_dict() and resolve().as_dict()["do_sample"] is False
    # what a generation reads back as its sampling settings (reports, audit) is what was recorded
    from pytest_llmdeterminism.sampling import RECORDED_SETTINGS

    assert tuple(config.sampling.as_dict()) == RECORDED_SETTINGS
    for bad, expected in (({"temperature": 0}, "temperature=0 with do_sample=True is an error"),
                          ({"seed": -1}, "an integer from 0"), ({"top_p": 0}, "0 < top_p <= 1")):
        with pytest.raises(ConfigurationError, match=expected):
            resolve(do_sample=True, **bad)
    with pytest.raises(SamplingRefusedError, match="pass do_sample=True to sample with it"):
        resolve(seed=3)


def test_sampling_defaults_are_transformers_generate_defaults_and_none_means_not_given():
    """do_sample=True alone: temperature 1.0, top_k 50 (transformers' default; 0 is no cut), top_p 1.0,
    min_p 0; an argument given as None takes the default, as transformers' generate() treats it."""
    expected = {"temperature": 1.0, "top_k": 50, "top_p": 1.0, "min_p": 0.0, "seed": 0}
    for call in ({}, {"temperature": None, "top_k": None, "top_p": None, "min_p": None, "seed": None}):
        recorded = resolve(do_sample=True, **call).as_dict()
        assert {k: recorded[k] for k in expected} == expected, call
    assert resolve(do_sample=True, top_k=0).as_dict()["top_k"] == 0


@pytest.mark.parametrize(("argument", "value", "expected"), [
    ("max_new_tokens", 0, "an integer >= 1"),
    ("max_new_tokens", "5", "an integer >= 1"),
    ("min_new_tokens", -1, "an integer >= 0"),
    ("repetition_penalty", 0, "a finite number > 0"),
    ("repetition_penalty", float("inf"), "a finite number > 0"),
    ("eos_token_id", None, "a token id or a non-empty list"),
    ("eos_token_id", [], "a token id or a non-empty list"),
    ("use_cache", 1, "True or False"),
])
def test_bad_accepted_override_values_fail_early_and_clearly(argument, value, expected):
    from pytest_llmdeterminism.errors import ConfigurationError

    with pytest.raises(ConfigurationError,
                       match=rf"llm_model.generate\({argument}=...\) = .*expected {expected}"):
        resolve(**{argument: value})


@pytest.mark.parametrize("eos", [-1, 10**6, 512, [2, 512], [2, -3]])
def test_an_eos_token_id_outside_the_vocabulary_is_refused_naming_the_range(eos):
    with pytest.raises(ConfigurationError, match=r"llm_model.generate\(eos_token_id=...\) = .* is no token "
                       r"id: ids are from 0 to 511, the model's vocabulary") as info:
        resolve_generation_config({"eos_token_id": eos}, max_new_tokens=8, eos_token_ids=[2], pad_token_id=0,
                                  vocab_size=512)
    assert info.value.setting == "llm_model.generate(eos_token_id=...)"
    assert resolve_generation_config({"eos_token_id": 511}, max_new_tokens=8, eos_token_ids=[2],
                                     pad_token_id=0, vocab_size=512).eos_token_id == (511,)


def test_generate_refuses_an_eos_token_id_outside_the_models_vocabulary(make_llm):
    llm = make_llm(max_new_tokens=2)
    for eos in (-1, 10**6):
        with pytest.raises(ConfigurationError, match=f"{eos} is no token id: ids are from 0 to 511"):
            llm.generate("hello", eos_token_id=eos)


def test_numpy_and_other_real_numbers_are_taken_as_plain_python_numbers():
    import json
    from fractions import Fraction

    np = pytest.importorskip("numpy")
    config = resolve(max_new_tokens=np.int64(3), min_new_tokens=np.int32(1),
                     repetition_penalty=np.float32(1.5), no_repeat_ngram_size=np.uint8(2),
                     eos_token_id=[np.int64(5), 7], temperature=np.float64(0), top_p=np.float32(1.0))
    assert config == resolve(max_new_tokens=3, min_new_tokens=1, repetition_penalty=1.5,
                             no_repeat_ngram_size=2, eos_token_id=[5, 7])
    sampled = resolve(do_sample=True, temperature=np.float32(0.5), top_k=np.int64(20),
                      top_p=Fraction(9, 10), min_p=np.float16(0), seed=np.int64(3))
    assert sampled.sampling is not None and sampled.sampling.seed == 3 and sampled.sampling.top_k == 20
    per_prompt = resolve(do_sample=True, temperature=0.5, seed=[np.int64(3), np.uint32(4)])
    assert per_prompt.seeds == (3, 4)
    for record in (config.as_dict(), sampled.as_dict(), {"seed": per_prompt.seed_of(1)}):
        # plain int and float only, so that a golden and a report hold them as JSON
        assert all(type(v) in (bool, int, float, str, list) for v in record.values()), record
        json.dumps(record)
    assert sampled.as_dict()["temperature"] == 0.5 and sampled.as_dict()["top_p"] == 0.9


@pytest.mark.parametrize(("argument", "value"), [("max_new_tokens", True), ("seed", True),
                                                  ("max_new_tokens", 3.0), ("temperature", "0.7")])
def test_a_bool_or_a_non_integer_is_still_no_number_for_a_setting(argument, value):
    with pytest.raises(ConfigurationError, match=rf"llm_model.generate\({argument}=...\) = "):
        resolve(do_sample=True, **{argument: value})


def test_speculation_is_how_a_call_runs_not_what_its_golden_records():
    """transformers' speculation arguments resolve to a ``Speculation`` kept out of ``as_dict()``: a
    speculated call's recorded config is the plain call's (its golden applies); 0 and None are none."""
    from pytest_llmdeterminism.decoding import Speculation

    plain = resolve()
    lookup = resolve(prompt_lookup_num_tokens=np.int64(3))
    assert lookup.speculation == Speculation("prompt_lookup", 3)
    assert lookup.as_dict() == plain.as_dict()
    draft = object()
    assisted = resolve(assistant_model=draft, max_new_tokens=4)
    assert assisted.speculation is not None and assisted.speculation.assistant is draft
    assert assisted.as_dict() == resolve(max_new_tokens=4).as_dict()
    assert resolve(prompt_lookup_num_tokens=0).speculation is None
    assert resolve(prompt_lookup_num_tokens=None, assistant_model=None) == plain
