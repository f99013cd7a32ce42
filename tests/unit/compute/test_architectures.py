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
    "mistral": {**_SMALL, "num_key_value_heads": 2, "sliding_window": 4},  # shorter than the prompts
    "phi3": {**_SMALL, "num_key_value_heads": 2},
    "opt": {"hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "word_embed_proj_dim": 64, "max_position_embeddings": 128},
    "gpt_neox": {**_SMALL, "max_position_embeddings": 128},
    # a mixture of experts: each expert's rows as many as the tokens its companions routed to it
    "mixtral": {**_SMALL, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2},
}
# Classes whose layers the batch-invariant kernels do not route: each falls back at load with a line
# naming the layer (and the fixed-shape probe passes, or fails naming the model as the cause).
UNROUTED = {
    "gpt_oss": {**_SMALL, "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4,
                "num_experts_per_tok": 2},
    "mamba": {"hidden_size": 64, "num_hidden_layers": 2, "state_size": 8, "intermediate_size": 128},
    "falcon": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4},
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
        # prompt alone (1x6) too; GPT-2's Conv1D layers keep the previous ones
        invariant = name != "gpt2"
        assert loaded.engine.kernels.batch_invariant is invariant, name
        against = ", and against 1x6" if invariant else ""
        assert notes == [f"batch invariance: verified at 4x32 (row 0 vs row 3{against}, 3 steps)"], name
        assert_batch_invariant(llm, "The capital of France is",
                               ["The sky is", "Count: one, two,", "def add(a, b):"])


@pytest.mark.parametrize(("name", "why"), [("gpt2", "Conv1D layers")])
def test_a_model_the_batch_invariant_kernels_cannot_run_keeps_the_previous_ones_and_true_says_why(
        model_folders, name, why):
    default = load(str(model_folders[name]), dtype="float32", device="cpu")
    assert not default.engine.kernels.batch_invariant and why in default.engine.kernels.describe()
    with pytest.raises(ConfigurationError, match=f"batch-invariant kernels cannot run this model: .*{why}"):
        load(str(model_folders[name]), dtype="float32", device="cpu", batch_invariant=True)


@pytest.mark.parametrize(("name", "layer"), [
    ("gpt_oss", "its GptOssExperts layers (model.layers.0.mlp.experts and 1 more) hold weights the "
                "batch-invariant kernels do not route"),
    ("mamba", "its Conv1d layers (backbone.layers.0.mixer.conv1d and 1 more) and MambaMixer layers "
              "(backbone.layers.0.mixer and 1 more) hold weights"),
    ("falcon", "its FalconLinear layers (transformer.h.0.self_attention.query_key_value and 7 more) hold "
               "weights"),
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
    if name != "gpt_oss":
        llm.generate("The capital of France is")
        assert notes == ["batch invariance: verified at 4x32 (row 0 vs row 3, 3 steps)"]
        return
    with pytest.raises(BatchInvarianceProbeError) as raised:
        llm.generate("The capital of France is")
    message = str(raised.value)
    assert "The cause is the model, not this machine: GptOssExperts layers" in message
    assert "a mixture of experts runs each expert on the tokens routed to it" in message
    assert "lscpu" not in message and "one thread" not in message


# One small configuration many transformers decoder classes accept (each reads the names it knows).
_ANY = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "n_embd": 64, "n_layer": 2, "n_head": 4,
        "d_model": 64, "n_positions": 128, "max_position_embeddings": 128, "head_dim": 16, "pad_token_id": 0,
        "bos_token_id": 1, "eos_token_id": 2, "rotary_dim": 8, "partial_rotary_factor": 0.5}
# Classes the batch-invariant kernels run: a position's logits the same bits decoded and prefilled,
# alone and left-padded beside another row.
INVARIANT_CLASSES = ["llama", "qwen2", "qwen3", "gemma", "phi", "phi3", "granite", "olmo", "olmo2", "cohere",
                     "stablelm", "starcoder2", "smollm3", "gpt_neox", "opt", "gptj", "codegen", "gpt_bigcode",
                     "mistral", "gemma2", "gemma3_text", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe"]
# Sliding windows of 8 positions (the sequences are 40): the windowed layers' caches drop keys in decode.
# Gemma 2 soft-caps its scores too; Gemma 3 alternates windowed and full layers.
WINDOWED = {"mistral": {"sliding_window": 8}, "gemma2": {"sliding_window": 8},
            "gemma3_text": {"sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]}}
# State-space models and hybrids, sized to the configuration above.
SSM = {"mamba2": {"num_heads": 8, "n_groups": 1, "state_size": 16}, "jamba": {"num_experts": 4}}
# Classes they cannot run, and the words of the reason the load's line gives.
FALLBACK_CLASSES = {"gpt2": "Conv1D layers",
                    "bloom": "does not go through transformers' attention interface",
                    "xglm": "does not go through transformers' attention interface",
                    "mpt": "does not go through transformers' attention interface",
                    "gpt_oss": "GptOssExperts layers", "mamba": "Conv1d layers", "mamba2": "Conv1d layers",
                    "jamba": "Conv1d layers", "falcon_h1": "Conv1d layers"}


@pytest.mark.parametrize("name", INVARIANT_CLASSES + sorted(FALLBACK_CLASSES))
def test_each_decoder_class_is_batch_and_phase_invariant_or_falls_back_saying_why(name):
    """34 transformers decoder classes, small random models built in this process (sliding windows,
    soft-capping and alternating layers included): the kernels' choice
    (``not_routable``) either leaves a class to the batch-invariant kernels, and then a position's
    logits are the same bits in a decode step as in the prefill and alone as left-padded beside
    another row, or names why it cannot (never the one, and a probe failure after)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

    from pytest_llmdeterminism.compute.kernels import Kernels, Policy, not_routable
    from pytest_llmdeterminism.engines.hf_phases import cache_argument

    torch.manual_seed(0)
    config = AutoConfig.for_model(name, **_ANY, **WINDOWED.get(name, {}), **SSM.get(name, {}))
    model = AutoModelForCausalLM.from_config(config).eval()
    why = not_routable(model)
    if name in FALLBACK_CLASSES:
        assert FALLBACK_CLASSES[name] in why, why
        return
    assert why == ""
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(1))
    other = torch.randint(3, 128, (1, 45), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode(), Kernels(Policy.BATCH_INVARIANT).routed(model):
        once = model(input_ids=ids).logits[0]
        cache = {cache_argument(model): DynamicCache(config=model.config)}
        model(input_ids=ids[:, :39], use_cache=True, **cache)
        step = model(input_ids=ids[:, 39:], use_cache=True, **cache).logits[0, -1]
        padded = torch.cat([torch.cat([torch.zeros(1, 5, dtype=torch.long), ids], 1), other])
        mask = torch.ones_like(padded)
        mask[0, :5] = 0
        beside = model(input_ids=padded, attention_mask=mask,
                       position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits[0, 5:]
    assert torch.equal(step, once[-1]), "decode != prefill"
    assert torch.equal(beside, once), "left-padded beside another row != alone"


def test_an_experts_products_are_what_make_a_mixture_of_experts_batch_invariant(monkeypatch):
    """The negative control: with the experts' and router's ``F.linear`` left stock (no module found
    to route), a Mixtral token's logits change when another row's tokens share its experts."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from pytest_llmdeterminism.compute import experts
    from pytest_llmdeterminism.compute.kernels import Kernels, Policy

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("mixtral", **_ANY)).eval()
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(1))
    others = torch.randint(3, 128, (7, 40), generator=torch.Generator().manual_seed(2))

    def alone_and_beside() -> tuple[torch.Tensor, torch.Tensor]:
        with torch.inference_mode(), Kernels(Policy.BATCH_INVARIANT).routed(model):
            return model(input_ids=ids).logits[0], model(input_ids=torch.cat([ids, others])).logits[0]

    assert torch.equal(*alone_and_beside())
    monkeypatch.setattr(experts, "linear_modules", lambda modules: [])
    assert not torch.equal(*alone_and_beside())


def test_a_mixture_of_experts_on_the_previous_kernels_fails_its_probe_naming_the_model(tmp_path):
    """With llm_batch_invariant = false a Mixtral's experts run stock products, whose rows depend on
    their companions: the fixed-shape probe fails naming the model and the kernels that route its
    experts, not the machine."""
    from pytest_llmdeterminism.errors import BatchInvarianceProbeError

    sizes = {**_SMALL, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2}
    loaded = load(str(save_random("mixtral", sizes, tmp_path)), dtype="float32", device="cpu",
                  batch_invariant=False)
    llm = LLMModel(loaded, GenerationSettings(BatchShape(4, 32), 4, 0))
    with pytest.raises(BatchInvarianceProbeError) as raised:
        llm.generate("The capital of France is")
    message = str(raised.value)
    assert "The cause is the model, not this machine: a mixture of experts runs each expert" in message
    assert "--llm-batch-invariant=true" in message and "lscpu" not in message
