"""`llm-golden perturb` run as a command, in a child Python as the README's walkthrough runs it: the
changed model it writes (the suite's recipe, bit for bit), a copy that drifts or changes tokens, a
bfloat16 checkpoint kept bfloat16, the file modes of the copy, a hub id read from the cache, and every
source or destination it refuses. Each command imports torch and loads a model: the subprocess tier
(what runs in process: tests/unit/cli/test_perturb.py)."""

import pytest

from pytest_llmdeterminism.engines import BUILTIN_MODELS
from pytest_llmdeterminism.judge.compare import Verdict, compare
from tests.helpers.models import perturbed_tiny_copy
from tests.helpers.perturb import PROMPTS, TINY_FILES, generations, weights
from tests.helpers.projects import llm_golden

pytestmark = pytest.mark.subprocess


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
    gguf.write_bytes(b"GGUF")  # cut short: its float32 conversion fails, as a load of it would
    result = llm_golden("perturb", gguf, tmp_path / "out", "--scale=0.1", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"llm-golden perturb: cannot load llm_model {str(gguf)!r}: " in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["SmolLM2.gguf"]  # no DEST, no scratch
    pickles = tmp_path / "pickles"
    pickles.mkdir()
    (pickles / "pytorch_model.bin").write_bytes(b"")
    result = llm_golden("perturb", pickles, tmp_path / "out", "--scale=0.1", cwd=tmp_path)
    assert result.returncode == 2 and "holds no *.safetensors weights" in result.stderr
    result = llm_golden("perturb", tmp_path / "nope", tmp_path / "out", "--scale=0.1", cwd=tmp_path)
    assert result.returncode == 2 and "does not exist: give a transformers model folder" in result.stderr
    result = llm_golden("perturb", "Org/NotCached", tmp_path / "out", "--scale=0.1", cwd=tmp_path)
    assert result.returncode == 2 and "the Hugging Face cache holds no Org/NotCached" in result.stderr
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


def test_the_copy_gets_the_modes_new_files_get_and_copied_files_keep_theirs(tmp_path):
    """safetensors writes its files 0600 whatever the umask; the copy's weights get the umask's mode."""
    import os
    import subprocess
    import sys

    source = tmp_path / "source"
    source.mkdir()
    for file in BUILTIN_MODELS["tiny"].iterdir():
        (source / file.name).write_bytes(file.read_bytes())
        (source / file.name).chmod(0o644)
    (source / "tokenizer.json").chmod(0o444)  # a read-only file stays read-only in the copy
    for umask, weights_mode in ((0o022, 0o644), (0o002, 0o664)):
        dest = tmp_path / f"copy-{umask:o}"
        done = subprocess.run([sys.executable, "-c", f"import os, sys; os.umask({umask}); "
                               "from pytest_llmdeterminism.cli import main; "
                               f"sys.exit(main(['perturb', {str(source)!r}, {str(dest)!r}, '--scale=0.1']))"],
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        modes = {path.name: os.stat(path).st_mode & 0o777 for path in dest.iterdir()}
        assert modes.pop("model.safetensors") == weights_mode
        assert modes.pop("tokenizer.json") == 0o444
        assert set(modes.values()) == {0o644}


def test_perturb_reads_a_hub_id_from_the_hugging_face_cache(tmp_path, hub_cache):
    from tests.helpers.models import in_hub_cache

    commit = "0123456789abcdef0123456789abcdef01234567"
    in_hub_cache(hub_cache, "Org/Tiny", commit)
    reference = weights(perturbed_tiny_copy(tmp_path / "reference", scale=0.5, seed=3))
    for spec in ("Org/Tiny", f"Org/Tiny@{commit[:8]}"):
        dest = tmp_path / spec.replace("/", "-")
        result = llm_golden("perturb", spec, dest, "--scale", "0.5", "--seed", "3", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[0] == \
            f"wrote {dest}: a copy of {spec} with relative noise 0.5 (seed 3)"
        copy = weights(dest)
        assert copy.keys() == reference.keys() and all(copy[name].equal(reference[name]) for name in copy)
        # The snapshot's links are copied as the files they point to.
        assert not any(path.is_symlink() for path in dest.iterdir())
        assert sorted(p.name for p in dest.iterdir()) == sorted([*TINY_FILES, "model.safetensors"])


@pytest.mark.parametrize("linked", ["file", "folder"])
def test_perturb_refuses_a_model_folder_whose_link_leads_out_of_it(tmp_path, linked):
    """A checkout's model folder with ``tokenizer.json`` linked to a key: its copy would carry the key."""
    secret = tmp_path / "home" / ".ssh" / "id_ed25519"
    secret.parent.mkdir(parents=True)
    secret.write_text("PRIVATE KEY")
    source = tmp_path / "model"
    source.mkdir()
    for file in BUILTIN_MODELS["tiny"].iterdir():
        if file.name != "tokenizer.json" or linked == "folder":
            (source / file.name).write_bytes(file.read_bytes())
    link = source / ("tokenizer.json" if linked == "file" else "extra")
    link.symlink_to(secret if linked == "file" else secret.parent)
    result = llm_golden("perturb", source, tmp_path / "out", "--scale=0.1", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    target = secret if linked == "file" else secret.parent
    assert (f"llm-golden perturb: {link} is a symbolic link to {target}, outside {source}: perturb copies "
            "only the model's own files") in result.stderr
    assert not (tmp_path / "out").exists()
    inside = source / "tokenizer-link.json"  # a link that stays in the folder is the model's own file
    link.unlink()
    (source / "tokenizer.json").write_bytes((BUILTIN_MODELS["tiny"] / "tokenizer.json").read_bytes())
    inside.symlink_to(source / "tokenizer.json")
    assert llm_golden("perturb", source, tmp_path / "out", "--scale=0.1", cwd=tmp_path).returncode == 0
    assert (tmp_path / "out" / "tokenizer-link.json").read_text() == (source / "tokenizer.json").read_text()
