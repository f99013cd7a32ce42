"""What the tests of `llm-golden perturb` share (tests/unit/cli/test_perturb.py,
tests/pytester/test_perturb_commands.py): the tiny model's files, prompts, and how a copy is read."""

from pytest_llmdeterminism.engines import BUILTIN_MODELS

TINY_FILES = sorted(p.name for p in BUILTIN_MODELS["tiny"].iterdir() if p.suffix != ".safetensors")
PROMPTS = ["The capital of France is", "Count: one,", "The cat sat on the", "def add(a, b):"]


def weights(folder):
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def generations(spec, make_llm):
    from pytest_llmdeterminism.engines import load
    from pytest_llmdeterminism.model.llm_model import LLMModel

    view = make_llm()
    return LLMModel(load(str(spec), dtype="float32", device="cpu"), view.settings).generate(PROMPTS)
