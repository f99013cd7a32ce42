"""`llm-golden perturb`: the README walkthrough's changed model, made from the installed package."""

import pytest

from pytest_llmdeterminism.compare import Verdict, compare
from pytest_llmdeterminism.engines import BUILTIN_MODELS

from .conftest import perturbed_tiny_copy
from .test_cli import llm_golden

TINY_FILES = sorted(p.name for p in BUILTIN_MODELS["tiny"].iterdir() if p.suffix != ".safetensors")
PROMPTS = ["The capital of France is", "Count: one,", "The cat sat on the", "def add(a, b):"]


def weights(folder):
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def generations(spec, make_llm):
    from pytest_llmdeterminism.engines import load
    from pytest_llmdeterminism.engines.model import LLMModel

    view = make_llm()
    return LLMModel(load(str(spec), dtype="float32", device="cpu"), view.settings).generate(PROMPTS)


def test_perturb_writes_the_test_suites_recipe_and_says_what_it_wrote(tmp_path):
    dest = tmp_path / "changed-tiny"
    result = llm_golden("perturb", "builtin:tiny", dest, "--scale", "0.5", "--seed", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"wrote {dest}: a copy of builtin:tiny with relative noise 0.5 (seed 3)",
        "  model.safetensors: all 20 tensors changed",
        f"  copied unchanged: {', '.join(TINY_FILES)}",
        f"use it with: pytest --llm-model={dest}",
    ]
    reference = weights(perturbed_tiny_copy(tmp_path / "reference", scale=0.5, seed=3))
    copy = weights(dest)
    assert copy.keys() == reference.keys()
    assert all(copy[name].equal(reference[name]) for name in copy)  # bit for bit the same recipe
    assert sorted(p.name for p in tmp_path.iterdir()) == ["changed-tiny", "reference"]  # no scratch left


@pytest.mark.parametrize(("scale", "changed"), [(1e-4, {Verdict.LOGIT_DRIFT}), (0.5, {Verdict.REGRESSION})])
def test_the_copy_loads_and_drifts_or_changes_tokens(tmp_path, make_llm, scale, changed):
    dest = tmp_path / "copy"
    assert llm_golden("perturb", "builtin:tiny", dest, f"--scale={scale}", cwd=tmp_path).returncode == 0
    before = make_llm().generate(PROMPTS)
    after = generations(dest, make_llm)
    verdicts = {compare(golden, now).verdict for golden, now in zip(before, after, strict=True)}
    assert changed <= verdicts and Verdict.IDENTICAL not in verdicts


def test_a_bfloat16_checkpoint_stays_bfloat16(tmp_path):
    import shutil

    import torch
    from safetensors.torch import save_file

    source = tmp_path / "bf16"
    shutil.copytree(BUILTIN_MODELS["tiny"], source)
    save_file({name: tensor.to(torch.bfloat16) for name, tensor in weights(source).items()},
              source / "model.safetensors", metadata={"format": "pt"})
    dest = tmp_path / "noisy"
    result = llm_golden("perturb", source, dest, "--scale=0.01", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    original, noisy = weights(source), weights(dest)
    assert {tensor.dtype for tensor in noisy.values()} == {torch.bfloat16}
    unchanged = [name for name in noisy if noisy[name].equal(original[name])]
    # Norm weights near 1.0 with noise ~5e-4 round back in bfloat16; the summary says so.
    assert 0 < len(unchanged) < 10 and all(name.endswith("norm.weight") for name in unchanged)
    assert (f"  model.safetensors: {20 - len(unchanged)} of 20 tensors changed; {len(unchanged)} unchanged "
            "(integer, scalar or constant, or the noise is below their dtype's resolution: raise --scale)"
            in result.stdout)


def test_perturb_refuses_to_overwrite_and_writes_into_an_empty_folder(tmp_path):
    dest = tmp_path / "taken"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    refused = llm_golden("perturb", "builtin:tiny", dest, "--scale=0.1", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stdout == ""
    assert (f"{str(dest)!r} already exists and is not an empty folder; perturb never overwrites"
            in refused.stderr)
    assert [p.name for p in dest.iterdir()] == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert llm_golden("perturb", "builtin:tiny", empty, "--scale=0.1", cwd=tmp_path).returncode == 0
    assert (empty / "model.safetensors").is_file()


def test_perturb_explains_sources_it_cannot_use(tmp_path):
    gguf = tmp_path / "SmolLM2.gguf"
    gguf.write_bytes(b"GGUF")
    result = llm_golden("perturb", gguf, tmp_path / "out", "--scale=0.1", cwd=tmp_path)
    assert result.returncode == 2
    assert "is a GGUF file: transformers dequantizes GGUF weights" in result.stderr
    assert "Perturb a transformers folder with safetensors weights instead" in result.stderr
    pickles = tmp_path / "pickles"
    pickles.mkdir()
    (pickles / "pytorch_model.bin").write_bytes(b"")
    result = llm_golden("perturb", pickles, tmp_path / "out", "--scale=0.1", cwd=tmp_path)
    assert result.returncode == 2 and "holds no *.safetensors weights" in result.stderr
    result = llm_golden("perturb", tmp_path / "nope", tmp_path / "out", "--scale=0.1", cwd=tmp_path)
    assert result.returncode == 2 and "does not exist: give a transformers model folder" in result.stderr
    result = llm_golden("perturb", "builtin:tiny", tmp_path / "out", "--scale=-1", cwd=tmp_path)
    assert result.returncode == 2 and "give a positive relative noise size" in result.stderr
    result = llm_golden("perturb", "builtin:tiny", tmp_path / "out", cwd=tmp_path)
    assert result.returncode == 2 and "the following arguments are required: --scale" in result.stderr
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = llm_golden("perturb", "builtin:tiny", blocker / "out", "--scale=0.1", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"cannot write into {str(blocker)!r} (a file is in the way)" in result.stderr
    assert not (tmp_path / "out").exists()
