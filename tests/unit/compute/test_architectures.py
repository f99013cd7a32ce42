"""Batch invariance across architectures and thread counts, under the default (portable) numerics.

Natively, multithreaded CPU SDPA gives the last rows of a batch other bits than the first ones for
most architectures; portable numerics must make every one of these invariant at 1 and 2 threads.
Each model is a small random one of the real transformers class, saved as safetensors beside the
built-in model's real tokenizer, and loaded through the plugin's own loader.
"""

from __future__ import annotations

import shutil

import pytest

from pytest_llmdeterminism.engines import BUILTIN_MODELS, load
from pytest_llmdeterminism.errors import ConfigurationError
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings
from pytest_llmdeterminism.strategies import assert_batch_invariant

_SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
ARCHITECTURES = {
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128},
    "qwen2": {**_SMALL, "num_key_value_heads": 2},
    "qwen3": {**_SMALL, "num_key_value_heads": 2, "head_dim": 16},
    "mistral": {**_SMALL, "num_key_value_heads": 2},
    "phi3": {**_SMALL, "num_key_value_heads": 2},
    "opt": {"hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "word_embed_proj_dim": 64, "max_position_embeddings": 128},
    "gpt_neox": {**_SMALL, "max_position_embeddings": 128},
}
# Classes whose layers the batch-invariant kernels do not route: each falls back at load with a line
# naming the layer (and the fixed-shape probe passes, or fails naming the model as the cause).
UNROUTED = {
    "mixtral": {**_SMALL, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2},
    "mamba": {"hidden_size": 64, "num_hidden_layers": 2, "state_size": 8, "intermediate_size": 128},
    "falcon": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4},
    "gemma3_text": {**_SMALL, "num_key_value_heads": 2, "head_dim": 16},
    "bloom": {"hidden_size": 64, "n_layer": 2, "n_head": 4},
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def save_random(name: str, sizes: dict, folder):
    """A small random model of transformers' class ``name`` in ``folder``, beside the built-in model's
    real tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(name, vocab_size=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                  **sizes)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder, safe_serialization=True)
    for file in TOKENIZER_FILES:
        shutil.copy(BUILTIN_MODELS["tiny"] / file, folder / file)
    return folder


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory):
    folders = {"llama (builtin:tiny)": BUILTIN_MODELS["tiny"]}
    for name, sizes in ARCHITECTURES.items():
        folders[name] = save_random(name, sizes, tmp_path_factory.mktemp(name))
    return folders


@pytest.fixture
def threads():
    import torch

    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("count", [1, 2])
def test_every_architecture_is_batch_invariant_under_portable_numerics(model_folders, threads, count):
    threads(count)
    for name, folder in model_folders.items():
        loaded = load(str(folder), dtype="float32", device="cpu").fresh()
        notes: list[str] = []
        llm = LLMModel(loaded, GenerationSettings(BatchShape(4, 32), 4, 0), note=notes.append)
        llm.generate("The capital of France is")  # the plugin's own probe: raises if rows differ
        # on the batch-invariant kernels, the default where they can run the model, the probe checks the
        # prompt alone (1x6) too; GPT-2's Conv1D layers and Mistral's sliding window keep the previous ones
        invariant = name not in ("gpt2", "mistral")
        assert loaded.engine.kernels.batch_invariant is invariant, name
        against = ", and against 1x6" if invariant else ""
        assert notes == [f"batch invariance: verified at 4x32 (row 0 vs row 3{against}, 3 steps)"], name
        assert_batch_invariant(llm, "The capital of France is",
                               ["The sky is", "Count: one, two,", "def add(a, b):"])


@pytest.mark.parametrize(("name", "why"), [("gpt2", "Conv1D layers"), ("mistral", "a sliding window")])
def test_a_model_the_batch_invariant_kernels_cannot_run_keeps_the_previous_ones_and_true_says_why(
        model_folders, name, why):
    default = load(str(model_folders[name]), dtype="float32", device="cpu")
    assert not default.engine.kernels.batch_invariant and why in default.engine.kernels.describe()
    with pytest.raises(ConfigurationError, match=f"batch-invariant kernels cannot run this model: .*{why}"):
        load(str(model_folders[name]), dtype="float32", device="cpu", batch_invariant=True)


@pytest.mark.parametrize(("name", "layer"), [
    ("mixtral", "its MixtralExperts layers (model.layers.0.mlp.experts and 1 more) and MixtralTopKRouter "
                "layers (model.layers.0.mlp.gate and 1 more) hold weights the batch-invariant kernels do not "
                "route"),
    ("mamba", "its Conv1d layers (backbone.layers.0.mixer.conv1d and 1 more) and MambaMixer layers "
              "(backbone.layers.0.mixer and 1 more) hold weights"),
    ("falcon", "its FalconLinear layers (transformer.h.0.self_attention.query_key_value and 7 more) hold "
               "weights"),
    ("gemma3_text", "its attention uses a sliding window"),
    ("bloom", "its attention (BloomForCausalLM's own) does not go through transformers' attention "
              "interface")])
def test_a_model_with_layers_the_kernels_do_not_route_falls_back_at_load_naming_the_layer(tmp_path, name,
                                                                                         layer):
    """Every module holding a weight matrix of its own that is not a routed ``nn.Linear`` (fused experts,
    a router, a convolution, an ``nn.Linear`` subclass with its own forward) keeps the previous kernels,
    named in the load's line: never "batch-invariant" at load and a probe failure after. A mixture of
    experts' rows still depend on their companions (each expert runs on the tokens routed to it): the
    probe's error names the model's layers as the cause, not the machine. An attention of the model's
    own (BLOOM's), which row-wise attention never replaces, falls back too."""
    from pytest_llmdeterminism.errors import BatchInvarianceProbeError

    loaded = load(str(save_random(name, UNROUTED[name], tmp_path)), dtype="float32", device="cpu")
    described = loaded.engine.kernels.describe()
    assert not loaded.engine.kernels.batch_invariant and layer in described, described
    notes: list[str] = []
    llm = LLMModel(loaded, GenerationSettings(BatchShape(4, 32), 4, 0), note=notes.append)
    if name != "mixtral":
        llm.generate("The capital of France is")
        assert notes == ["batch invariance: verified at 4x32 (row 0 vs row 3, 3 steps)"]
        return
    with pytest.raises(BatchInvarianceProbeError) as raised:
        llm.generate("The capital of France is")
    message = str(raised.value)
    assert "The cause is the model, not this machine: MixtralExperts layers" in message
    assert "a mixture of experts runs each expert on the tokens routed to it" in message
    assert "lscpu" not in message and "one thread" not in message
