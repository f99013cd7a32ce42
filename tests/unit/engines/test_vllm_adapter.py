"""The vLLM adapter without vLLM or a GPU: the pinned arguments, the step records and hashes, the
greedy check, the refusals, and a whole load and generation against a stand-in ``vllm`` module."""

from __future__ import annotations

import json
import sys
import types
from importlib.machinery import ModuleSpec
from types import SimpleNamespace

import pytest
import xxhash

from pytest_llmdeterminism import engines as backends
from pytest_llmdeterminism.decoding import resolve_generation_config
from pytest_llmdeterminism.engines import BUILTIN_MODELS
from pytest_llmdeterminism.engines import vllm as adapter
from pytest_llmdeterminism.engines.checkpoint import checkpoint_eos_ids
from pytest_llmdeterminism.errors import ConfigurationError, EngineError, ModelLoadError, NonFiniteLogitsError
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

TINY = BUILTIN_MODELS["tiny"]
SETTINGS = GenerationSettings(batch_shape=BatchShape(1, 64), max_new_tokens=3, seed=7)


def request(token_ids, steps):
    """A RequestOutput as vLLM shapes it: per step a dict token id -> Logprob."""
    logprobs = [{i: SimpleNamespace(logprob=value, rank=rank, decoded_token=f"<{i}>")
                 for rank, (i, value) in enumerate(step, start=1)} for step in steps]
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(token_ids), logprobs=logprobs)])


def config(**overrides):
    return resolve_generation_config(overrides, max_new_tokens=4, eos_token_ids=[2, 0], pad_token_id=0)


# --- pure mappings ---

def test_engine_arguments_pin_every_determinism_setting():
    knobs = adapter.VLLMOptions(tensor_parallel_size=2, max_num_seqs=1, gpu_memory_utilization=0.4,
                                max_model_len=1024)
    assert adapter.engine_arguments("models/m", knobs, "bfloat16", 0) == {
        "model": "models/m", "tokenizer": "models/m", "trust_remote_code": False,
        "load_format": "safetensors",
        "dtype": "bfloat16", "seed": 0, "enforce_eager": True, "enable_prefix_caching": False,
        "enable_chunked_prefill": False, "max_num_seqs": 1, "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.4, "max_model_len": 1024, "logprobs_mode": "processed_logprobs",
    }


def test_sampling_arguments_are_greedy_with_the_configs_lengths_penalty_and_stops():
    assert adapter.sampling_arguments(config(min_new_tokens=2, repetition_penalty=1.3), seed=11) == {
        "n": 1, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "presence_penalty": 0.0,
        "frequency_penalty": 0.0, "repetition_penalty": 1.3, "max_tokens": 4, "min_tokens": 2, "logprobs": 5,
        "seed": 11, "stop_token_ids": [0, 2], "ignore_eos": True, "skip_special_tokens": False,
        "detokenize": True,
    }


@pytest.mark.parametrize(("capability", "batch_invariant"), [((8, 0), False), ((8, 9), False), ((9, 0), True),
                                                              ((10, 0), True), (None, False)])
def test_batch_invariance_is_set_from_compute_capability_9_0(capability, batch_invariant):
    env = adapter.environment(capability)
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert ("VLLM_BATCH_INVARIANT" in env) is batch_invariant
    if batch_invariant:
        assert env["VLLM_BATCH_INVARIANT"] == "1"


# --- step records ---

def test_steps_are_ranked_hashed_and_rounded_as_vllm_returned_them():
    outputs = [request([7, 3], [[(3, -1.25), (7, -0.5), (9, -2.0)], [(3, -0.015625), (4, -4.5)]])]
    chunk = adapter.chunk_from_outputs(outputs, spec="vllm:m", flags={"enforce_eager": True})
    assert chunk.tokens == [[7, 3]]
    steps = chunk.steps[0]
    assert steps.hashes == [xxhash.xxh3_64_hexdigest(b"[7,[[7,-0.5],[3,-1.25],[9,-2.0]]]"),
                            xxhash.xxh3_64_hexdigest(b"[3,[[3,-0.015625],[4,-4.5]]]")]
    assert steps.top == [((7, -0.5), (3, -1.25), (9, -2.0)), ((3, -0.015625), (4, -4.5))]
    assert steps.margins == [0.75, 4.484375]
    assert chunk.flags == {"enforce_eager": True}


def test_ties_are_ordered_by_token_id_and_only_the_top_5_are_kept():
    returned = [(12, -1.0), (30, -0.25), (5, -1.0), (8, -3.0), (1, -2.0), (40, -9.0)]
    chunk = adapter.chunk_from_outputs([request([30], [returned])], spec="vllm:m")
    assert [i for i, _ in chunk.steps[0].top[0]] == [30, 5, 12, 1, 8]
    expected = json.dumps([30, [[30, -0.25], [5, -1.0], [12, -1.0], [1, -2.0], [8, -3.0]]],
                          separators=(",", ":"))
    assert chunk.steps[0].hashes == [xxhash.xxh3_64_hexdigest(expected.encode())]


def test_a_tied_choice_is_still_greedy():
    chunk = adapter.chunk_from_outputs([request([9], [[(4, -0.7), (9, -0.7)]])], spec="vllm:m")
    assert chunk.tokens == [[9]]
    assert chunk.steps[0].margins == [0.0]


def test_a_non_greedy_step_fails_naming_the_step_and_both_tokens():
    outputs = [request([5, 6], [[(5, -0.1), (6, -2.0)], [(6, -1.0), (8, -0.2)]])]
    with pytest.raises(EngineError, match=r"did not decode greedily at step 1 of prompt 0: it chose token "
                                          r"6 \(logprob -1\.0000\) over token 8 "
                                          r"\(logprob -0\.2000\)") as raised:
        adapter.chunk_from_outputs(outputs, spec="vllm:models/m")
    assert raised.value.spec == "vllm:models/m"
    assert "logprobs_mode='processed_logprobs'" in str(raised.value)


def test_missing_logprobs_and_nan_logprobs_are_refused():
    with pytest.raises(EngineError, match=r"logprobs for 1 of 2 steps of prompt 0"):
        adapter.chunk_from_outputs([request([5, 6], [[(5, -0.1)]])], spec="vllm:m")
    with pytest.raises(NonFiniteLogitsError) as raised:
        adapter.chunk_from_outputs([request([1], [[(1, -0.1)]]), request([5], [[(5, float("nan"))]])],
                                   spec="vllm:m")
    assert (raised.value.step, raised.value.row) == (0, 1)


# --- refusals at load ---

def test_an_unknown_knob_is_named_with_the_ones_vllm_takes():
    with pytest.raises(ConfigurationError, match=r"unknown option 'foo' after '#'; this engine takes: "
                                                 r"gpu_memory_utilization, max_model_len, max_num_seqs, "
                                                 r"tensor_parallel_size"):
        backends.load("vllm:/nonexistent#foo=1", dtype="float32", device="auto")


@pytest.mark.parametrize(("knob", "message"), [("max_num_seqs=two", r"max_num_seqs='two' is not a valid int"),
                                               ("gpu_memory_utilization=1.5", r"at most 1")])
def test_a_bad_knob_value_is_refused(knob, message):
    with pytest.raises(ConfigurationError, match=message):
        backends.load(f"vllm:/nonexistent#{knob}", dtype="float32", device="auto")


def test_a_missing_folder_is_refused_without_a_download():
    with pytest.raises(ModelLoadError, match=r"no such folder: '/nonexistent'.*never downloads"):
        backends.load("vllm:/nonexistent", dtype="float32", device="auto")


def test_a_folder_without_safetensors_is_refused(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors weights"):
        backends.load(f"vllm:{tmp_path}", dtype="float32", device="auto")


def test_the_cpu_is_refused(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigurationError, match=r"llm_device = 'cpu': vLLM runs on the first visible CUDA"):
        backends.load(f"vllm:{tmp_path}", dtype="float32", device="cpu")


def test_without_vllm_the_install_line_is_named(tmp_path, monkeypatch):
    (tmp_path / "model.safetensors").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "vllm", None)  # find_spec answers None, installed or not
    with pytest.raises(ModelLoadError, match=r"pip install vllm \(needs an NVIDIA GPU\)"):
        backends.load(f"vllm:{tmp_path}", dtype="float32", device="auto")


def test_without_cuda_the_alternatives_are_named(tmp_path, monkeypatch):
    import torch

    (tmp_path / "model.safetensors").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm([]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelLoadError, match=r"needs an NVIDIA GPU.*llamacpp:PATH\.gguf.*transformers "
                                             rf"backend \(--llm-model={tmp_path} \(pytest\.ini: llm_model "
                                             rf"= {tmp_path};"):
        backends.load(f"vllm:{tmp_path}", dtype="float32", device="auto")


# --- a whole load and generation against a stand-in vllm module ---

def fake_vllm(calls):
    """A module with vLLM's surface: ``LLM`` records its arguments and each ``generate`` call, and
    answers token ids 10, 11, ... with a confident top-2 per step."""
    module = types.ModuleType("vllm")
    module.__spec__ = ModuleSpec("vllm", None)
    module.__version__ = "0.0-fake"

    class LLM:
        def __init__(self, **kwargs):
            calls.append(("LLM", kwargs))

        def generate(self, prompts, params, use_tqdm=True):
            calls.append(("generate", [p["prompt_token_ids"] for p in prompts], params))
            tokens = [10 + k for k in range(params.max_tokens)]
            return [request(tokens, [[(t, -0.1), (t + 1, -3.0)] for t in tokens]) for _ in prompts]

    module.LLM = LLM
    module.SamplingParams = lambda **kwargs: SimpleNamespace(**kwargs)
    return module


@pytest.fixture
def on_a_fake_h200(monkeypatch):
    import torch

    calls = []
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm(calls))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H200")
    for key in ("HF_HUB_OFFLINE", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_BATCH_INVARIANT"):
        monkeypatch.delenv(key, raising=False)  # restored after the test, whatever load sets
    return calls


def test_load_pins_the_engine_and_generation_records_vllm_steps(on_a_fake_h200):
    import os

    from pytest_llmdeterminism.model.llm_model import LLMModel

    loaded = backends.load(f"vllm:{TINY}#max_model_len=512", dtype="float32", device="auto")
    (name, kwargs), = on_a_fake_h200
    knobs = adapter.VLLMOptions(tensor_parallel_size=1, max_num_seqs=1, gpu_memory_utilization=0.5,
                                max_model_len=512)
    assert (name, kwargs) == ("LLM", adapter.engine_arguments(str(TINY), knobs, "float32", 0))
    assert os.environ["VLLM_BATCH_INVARIANT"] == "1"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert loaded.engine.runs_rows_alone is True
    assert loaded.engine.eos_token_ids() == [2]
    assert loaded.engine.vocab_size() == 512

    results = LLMModel(loaded, SETTINGS).generate(["Hello", "The cat"])
    generate_calls = [call for call in on_a_fake_h200 if call[0] == "generate"]
    assert [len(prompts) for _, prompts, _ in generate_calls] == [1, 1]  # one prompt per call
    assert generate_calls[0][2].seed == 7  # the test's seed on each request
    first = results[0]
    assert first.token_ids == (10, 11, 12)
    assert first.hash_definition == "vllm-topk"
    assert first.variant == "vllm:cuda/float32"
    assert first.top_logprobs[0] == ((10, -0.1), (11, -3.0))
    fingerprint = first.fingerprint
    assert fingerprint["engine_version"] == "0.0-fake"
    assert fingerprint["device_name"] == "NVIDIA H200"
    assert fingerprint["compute_capability"] == "9.0"
    assert fingerprint["batch_invariant"] is True
    assert fingerprint["env"]["VLLM_BATCH_INVARIANT"] == "1"
    assert fingerprint["weights_hash"] is not None
    assert fingerprint["flags"]["enforce_eager"] is True
    assert fingerprint["flags"]["requests"] == "one at a time"


def test_a_batch_invariance_setting_the_user_chose_is_kept_and_recorded(on_a_fake_h200, monkeypatch):
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    loaded = backends.load(f"vllm:{TINY}#max_model_len=512", dtype="float32", device="auto")
    assert loaded.describe is not None
    assert loaded.describe["batch_invariant"] is False
    assert loaded.describe["env"]["VLLM_BATCH_INVARIANT"] == "0"


def test_several_sequences_share_one_call(on_a_fake_h200):
    loaded = backends.load(f"vllm:{TINY}#max_model_len=512&max_num_seqs=4", dtype="float32", device="auto")
    assert loaded.engine.runs_rows_alone is False
    chunk = loaded.engine.run([[1, 5], [1, 6, 7]], config(), SETTINGS, keep_logits=False)
    assert [call[1] for call in on_a_fake_h200 if call[0] == "generate"] == [[[1, 5], [1, 6, 7]]]
    assert chunk.tokens == [[10, 11, 12, 13], [10, 11, 12, 13]]
    assert chunk.flags["requests"] == "one call per chunk"


@pytest.mark.parametrize(("keep_logits", "overrides", "message"), [
    (True, {}, r"vLLM returns no raw logits; audit on the transformers backend"),
    (False, {"no_repeat_ngram_size": 2}, r"supported by the transformers backend only"),
    (False, {"max_new_tokens": 510},
     r"a 3-token prompt plus max_new_tokens=510 does not fit.*#max_model_len=4096"),
])
def test_what_vllm_cannot_do_is_refused_before_a_request(on_a_fake_h200, keep_logits, overrides, message):
    loaded = backends.load(f"vllm:{TINY}#max_model_len=512", dtype="float32", device="auto")
    with pytest.raises(ConfigurationError, match=message):
        loaded.engine.run([[1, 5, 6]], config(**overrides), SETTINGS, keep_logits=keep_logits)
    assert [call for call in on_a_fake_h200 if call[0] == "generate"] == []


def test_eos_ids_come_from_the_generation_config_first_for_every_engine(tmp_path):
    tokenizer = SimpleNamespace(eos_token_id=9)
    assert checkpoint_eos_ids(tmp_path, tokenizer) == [9]
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 3}))
    assert checkpoint_eos_ids(tmp_path, tokenizer) == [3]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [4, 5]}))
    assert checkpoint_eos_ids(tmp_path, tokenizer) == [4, 5]
