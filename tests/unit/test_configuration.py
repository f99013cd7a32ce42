"""Configuration mistakes refused where they are read, each naming the setting and the fix: an absurd
batch shape (with the memory it would need), CUDA where there is none, a pickle checkpoint."""

from __future__ import annotations

import shutil

import pytest

from pytest_llmdeterminism.engines import BUILTIN_MODELS, load
from pytest_llmdeterminism.errors import ConfigurationError, ModelLoadError
from pytest_llmdeterminism.shape import BatchShape


@pytest.mark.parametrize("shape", ["1x100000000", "100000x8", "4096x4096"])
def test_an_absurd_batch_shape_is_refused_with_the_memory_it_would_need(shape):
    expected = (r"llm_batch_shape = '.*': (B = .* is above 4096; |L = .* is above 131,072; )?[\d,]+ tokens "
                r"per batch: the input ids and attention mask alone would take [\d.,]+ [KMGT]?B")
    with pytest.raises(ConfigurationError, match=expected) as info:
        BatchShape.parse(shape)
    assert ("B = 100,000 is above 4096" in str(info.value)) == (shape == "100000x8")
    assert BatchShape.parse("4096x1024") == BatchShape(4096, 1024)  # large but sane


def test_cuda_on_a_machine_without_cuda_names_the_setting():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    for device in ("cuda", "cuda:1"):
        expected = (rf"llm_device = '{device}' but CUDA is not available here \(torch .*\)\. Use "
                    r"--llm-device=auto \(pytest\.ini: llm_device = auto; pyproject\.toml: "
                    r"llm_device = \"auto\"\) or cpu")
        with pytest.raises(ModelLoadError, match=expected):
            load("builtin:tiny", dtype="float32", device=device)


def test_a_pickle_checkpoint_is_named_even_beside_a_stray_adapter_safetensors(tmp_path):
    folder = tmp_path / "pickled"
    shutil.copytree(BUILTIN_MODELS["tiny"], folder)
    (folder / "model.safetensors").rename(folder / "adapter.safetensors")
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    expected = (r"holds pickle weights \(pytorch_model.bin\), which can run code when loaded and are "
                r"refused\. Convert them to safetensors")
    with pytest.raises(ModelLoadError, match=expected):
        load(str(folder), dtype="float32", device="cpu")
