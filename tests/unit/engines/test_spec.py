"""The ``llm_model`` spec parsed once (``engines/spec.py``), and the typed values engines share."""

import json
from dataclasses import dataclass

import pytest

from pytest_llmdeterminism.decoding import DecodingConfig, resolve_generation_config
from pytest_llmdeterminism.engines.spec import EngineSpec, engine_of, with_local_paths
from pytest_llmdeterminism.errors import ConfigurationError
from pytest_llmdeterminism.generation import HashDefinition, PromptForm


@dataclass(frozen=True)
class Knobs:
    threads: int = 1
    ratio: float = 0.5
    name: str | None = None
    on: bool = True


def test_a_spec_is_split_into_engine_target_and_options_once():
    spec = EngineSpec.parse("llamacpp:models/m.gguf#threads=2&ratio=0.25&on=off")
    assert (spec.engine, spec.target, spec.params) == ("llamacpp", "models/m.gguf",
                                                      (("threads", "2"), ("ratio", "0.25"), ("on", "off")))
    assert spec.options(Knobs) == Knobs(threads=2, ratio=0.25, name=None, on=False)
    assert EngineSpec.parse("vllm:m").options(Knobs) == Knobs()
    assert spec.given("ratio") == "0.25"


@pytest.mark.parametrize(("text", "message"), [
    ("llamacpp:", "names no model after the engine prefix"),
    ("llamacpp:m#threads", "'threads' after '#' is not key=value"),
])
def test_a_malformed_spec_names_the_fix(text, message):
    with pytest.raises(ConfigurationError, match=message):
        EngineSpec.parse(text)


@pytest.mark.parametrize(("fragment", "message"), [
    ("thread=2", "unknown option 'thread' after '#'; this engine takes: name, on, ratio, threads"),
    ("threads=0", "option threads='0' must be at least 1"),
    ("threads=x", "option threads='x' is not a valid int"),
    ("ratio=x", "option ratio='x' is not a valid float"),
    ("on=maybe", "option on='maybe' is not a valid flag"),
])
def test_a_bad_option_names_the_fix(fragment, message):
    with pytest.raises(ConfigurationError) as raised:
        EngineSpec.parse(f"llamacpp:m#{fragment}").options(Knobs)
    assert message in str(raised.value)


def test_local_paths_are_made_absolute_and_a_malformed_option_is_kept_for_the_load_to_refuse():
    def absolute(path):
        return f"/abs/{path}"

    assert engine_of("models/m") is None and with_local_paths("models/m", absolute) == "/abs/models/m"
    assert with_local_paths("llamacpp:m.gguf#threads=2", absolute) == "llamacpp:/abs/m.gguf#threads=2"
    assert (with_local_paths("openai:http://h:1/v1#tokenizer=tok&model=x&bad", absolute)
            == "openai:http://h:1/v1#tokenizer=/abs/tok&model=x&bad")


def test_the_enums_are_the_names_goldens_store():
    assert json.dumps([HashDefinition.SERVED_TOPK, PromptForm.CHAT]) == '["served-topk", "chat"]'
    assert f"{HashDefinition.VLLM_TOPK}" == "vllm-topk" and HashDefinition("logits") is HashDefinition.LOGITS


def test_the_greedy_config_is_recorded_in_its_field_order():
    config = resolve_generation_config({"eos_token_id": [3, 1]}, max_new_tokens=4, eos_token_ids=[2],
                                       pad_token_id=0)
    assert isinstance(config, DecodingConfig) and config.eos_token_id == (1, 3)
    assert list(config.as_dict().items()) == [
        ("do_sample", False), ("num_beams", 1), ("max_new_tokens", 4), ("min_new_tokens", 0),
        ("repetition_penalty", 1.0), ("no_repeat_ngram_size", 0), ("eos_token_id", [1, 3]),
        ("pad_token_id", 0), ("use_cache", True)]
