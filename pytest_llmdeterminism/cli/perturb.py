"""``llm-golden perturb``: a copy of a safetensors model with relative Gaussian noise on its weights.

The changed model of the README's upgrade walkthrough, and of this project's own tests: every
floating tensor with more than one element gets ``scale * std(tensor) * N(0, 1)`` added, drawn
from one seeded generator in file and tensor order, so a seed gives the same copy everywhere. The
source is named as ``llm_model`` names a model: a folder, ``builtin:NAME``, a hub id found offline in
the Hugging Face cache (``engines/hub.py``), or a ``.gguf`` file, read through the float32 copy the
plugin converts it to (``engines/hf.float32_folder``). Copied files keep the source's modes; the
weights files it writes get the mode any new file gets under the umask (safetensors alone gives 0600).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pytest_llmdeterminism.engines import cached, hf, hub, resolve
from pytest_llmdeterminism.engines.spec import BUILTIN_PREFIX, hub_id
from pytest_llmdeterminism.errors import LLMDeterminismError
from pytest_llmdeterminism.goldens import atomic

SUMMARY = "copy a model with relative noise on its weights"
HELP = """\
Write a copy of a model with Gaussian noise of relative size S on every floating weight:
w + S * std(w) * N(0, 1), drawn from one generator seeded with N. SRC names a model as llm_model
does: a transformers folder (safetensors weights), builtin:tiny, a hub id ORG/NAME[@REVISION]
found offline in the Hugging Face cache, or a .gguf file, read through the float32 copy the
plugin converts it to (the copy is float32 safetensors). Copied files keep their modes; the
weights files written get the mode of any new file under the umask. A symbolic link in SRC that
leads out of its folder is refused (its copy would carry whatever file it names).

Measured (benchmarks/perturb_scales.py: 8 prompts x 8 greedy tokens, seed 0, float32, CPU AMD
EPYC). Even 1e-6 moves the logits, so no check stays IDENTICAL:
                  builtin:tiny                   SmolLM2-135M-Instruct (GGUF)
  drift only      1e-6 to 3e-2: 8 LOGIT_DRIFT    1e-6 to 3e-3: 8 LOGIT_DRIFT
  a few changed   0.1: 3 of 8 REGRESSION         5e-3: 2 of 8; 1e-2: 3 of 8 REGRESSION
  everything      2: 8 of 8 REGRESSION           0.2: 8 of 8 REGRESSION

exit status: 0 written; 2 a usage error (a missing or unreadable source, DEST exists and is not
empty) or a DEST that cannot be written."""


class PerturbError(LLMDeterminismError):
    """The copy cannot be made; nothing was written."""


@dataclass(frozen=True)
class Perturbed:
    """What ``perturb`` wrote: each weights file with (tensors changed, tensors in it), the rest copied."""

    dest: Path
    weights: tuple[tuple[str, int, int], ...]
    copied: tuple[str, ...]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SRC", help="a transformers folder with safetensors weights, "
                        "builtin:tiny, a hub id ORG/NAME[@REVISION] in the Hugging Face cache, or a "
                        ".gguf file")
    parser.add_argument("dest", type=Path, metavar="DEST", help="a new (or empty) folder for the copy")
    parser.add_argument("--scale", type=float, required=True, metavar="S",
                        help="relative noise size, e.g. 1e-3")
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="noise seed (default 0)")


def run(args: argparse.Namespace) -> int:
    """The command: perturb, then say what was written and how to use it."""
    source: str = args.source
    scale: float = args.scale
    seed: int = args.seed
    try:
        written = perturb(source, args.dest, scale=scale, seed=seed)
    except (LLMDeterminismError, OSError) as error:  # OSError: DEST cannot be written; none of it is left
        print(f"llm-golden perturb: {error}", file=sys.stderr)
        return 2
    print(f"wrote {written.dest}: a copy of {source} with relative noise {scale:g} (seed {seed})")
    for name, changed, total in written.weights:
        print(f"  {name}: all {total} tensors changed" if changed == total else
              f"  {name}: {changed} of {total} tensors changed; {total - changed} unchanged (integer, scalar "
              "or constant, or the noise is below their dtype's resolution: raise --scale)")
    if written.copied:
        print(f"  copied unchanged: {', '.join(written.copied)}")
    print(f"use it with: pytest --llm-model={written.dest}")
    return 0


def perturb(source: str, dest: Path, *, scale: float, seed: int = 0) -> Perturbed:
    """Write the noisy copy of ``source`` (a folder, ``builtin:NAME``, a hub id in the local Hugging
    Face cache, or a ``.gguf`` file) to ``dest``, all or nothing."""
    if not math.isfinite(scale) or scale <= 0:
        raise PerturbError(f"--scale {scale!r}: give a positive relative noise size, e.g. 1e-3 "
                           "(logit drift on the tiny model) or 0.5 (changed tokens)")
    kind, found, home = _source(source)
    if kind == "folder":
        _weight_files(found)  # refused before anything is written
        _refuse_links_out(found, home)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise PerturbError(f"{str(dest)!r} already exists and is not an empty folder; perturb never "
                           "overwrites. Give a new folder, or remove that one first.")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.perturb-"))
    except OSError as error:
        why = "a file is in the way" if isinstance(error, FileExistsError) else error.strerror or str(error)
        raise PerturbError(f"cannot write into {str(dest.parent)!r} ({why}); give a DEST in a folder you "
                           "can write to") from None
    try:
        # A .gguf file is read through its float32 conversion: the weights transformers loads from it.
        folder = hf.float32_folder(source, found, scratch=scratch) if kind == "gguf" else found
        _refuse_links_out(folder, folder if kind == "gguf" else home)
        weight_files = _weight_files(folder)
        copy = scratch / "copy"
        skipped = ["*.safetensors", cached.DIGEST] if kind == "gguf" else ["*.safetensors"]
        shutil.copytree(folder, copy, ignore=shutil.ignore_patterns(*skipped))
        weights = _write_noisy(folder, copy, weight_files, scale=scale, seed=seed)
        if dest.exists():
            dest.rmdir()  # empty, checked above
        os.replace(copy, dest)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    copied = sorted(str(p.relative_to(dest)) for p in dest.rglob("*")
                    if p.is_file() and p.suffix != ".safetensors")
    return Perturbed(dest, weights, tuple(copied))


def _source(source: str) -> tuple[str, Path, Path]:
    """("folder", the folder) or ("gguf", the file), resolved as ``llm_model`` resolves a spec, and the
    folder its links may lead into: a hub snapshot's repository folder (its files are links to its
    blobs), else the model's own folder."""
    named = hub_id(source)
    try:
        if named is not None:
            folder = hub.find(source, named).folder
            return "folder", folder, folder.parent.parent  # <repository>/snapshots/<commit>
        if not source.startswith(BUILTIN_PREFIX) and not Path(source).exists():
            raise PerturbError(f"SRC {source!r} does not exist: give a transformers model folder with "
                               f"safetensors weights, a .gguf file, a hub id ORG/NAME[@REVISION] in the "
                               f"Hugging Face cache, or {BUILTIN_PREFIX}tiny")
        kind, found = resolve(source)
        return kind, found, found
    except PerturbError:
        raise
    except LLMDeterminismError as error:
        raise PerturbError(str(error)) from None


def _refuse_links_out(folder: Path, home: Path) -> None:
    """Refuses a model folder holding a symbolic link that leads out of ``home``: its copy would
    carry whatever file the link names (a key, a config) into DEST."""
    real_home = Path(os.path.realpath(home))
    for top, folders, files in os.walk(folder):
        for name in sorted(folders + files):
            path = Path(top, name)
            real = Path(os.path.realpath(path))
            if path.is_symlink() and not atomic.inside(real, real_home):
                raise PerturbError(f"{path} is a symbolic link to {real}, outside {home}: perturb copies "
                                   "only the model's own files (a link could carry any file into DEST). "
                                   "Replace the link with the file it names, or remove it.")


def _weight_files(folder: Path) -> list[Path]:
    weight_files = sorted(p.relative_to(folder) for p in folder.rglob("*.safetensors"))
    if not weight_files:
        raise PerturbError(f"{str(folder)!r} holds no *.safetensors weights; perturb reads only "
                           "safetensors (pickled checkpoints such as pytorch_model.bin are never loaded)")
    return weight_files


def _write_noisy(source: Path, dest: Path, files: list[Path], *, scale: float,
                 seed: int) -> tuple[tuple[str, int, int], ...]:
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    generator = torch.Generator().manual_seed(seed)
    written = []
    for relative in files:
        with safe_open(source / relative, framework="pt") as opened:
            metadata = opened.metadata() or {"format": "pt"}
        weights = load_file(source / relative)
        changed = 0
        for name, tensor in weights.items():
            if tensor.is_floating_point() and tensor.numel() > 1:
                # Noise in float32, stored in the tensor's own dtype: a bf16 checkpoint stays bf16.
                original = tensor.float()
                noise = torch.randn(tensor.shape, generator=generator)
                weights[name] = (original + scale * original.std() * noise).to(tensor.dtype)
                # Counted by result: noise below the dtype's resolution, or a constant tensor, changes
                # nothing.
                changed += not weights[name].equal(tensor)
        (dest / relative).parent.mkdir(parents=True, exist_ok=True)
        save_file(weights, dest / relative, metadata=metadata)
        os.chmod(dest / relative, atomic.new_file_mode())  # safetensors writes 0600, whatever the umask
        written.append((str(relative), changed, len(weights)))
    return tuple(written)
