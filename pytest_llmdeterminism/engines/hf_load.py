"""The default engine's load, registered as every other engine's (``registry.py``): a local folder
(safetensors) or ``.gguf`` file, ``builtin:NAME``, or a hub id ``ORG/NAME[@REVISION]`` found in the
local Hugging Face cache (``hub.py``; a local path of the same spelling wins), on transformers in the
test process (``hf.py``), with the CPU numerics and the kernels the run asks for in force."""

from __future__ import annotations

from pathlib import Path

from pytest_llmdeterminism.compute import numerics, profiles
from pytest_llmdeterminism.compute.kernels import Kernels
from pytest_llmdeterminism.engines import cached, hf, hub
from pytest_llmdeterminism.engines.loaded import LoadedModel, LoadRequest
from pytest_llmdeterminism.engines.spec import BUILTIN_PREFIX, EngineSpec, how_to_get, hub_id
from pytest_llmdeterminism.errors import ModelLoadError

__all__ = ["BUILTIN_MODELS", "load", "resolve"]

BUILTIN_MODELS = {"tiny": Path(__file__).parent / "tiny"}


def resolve(spec: str) -> tuple[str, Path]:
    """Classify a spec as a folder or a GGUF file, or fail naming the fix."""
    __tracebackhide__ = True
    if spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX):]
        if name not in BUILTIN_MODELS:
            raise ModelLoadError(spec, f"no built-in model {name!r}; built-in models: "
                                 + ", ".join(f"{BUILTIN_PREFIX}{n}" for n in BUILTIN_MODELS))
        return "folder", BUILTIN_MODELS[name]
    path = Path(spec)
    if path.is_file() and path.suffix == ".gguf":
        return "gguf", path
    if path.is_dir():
        return "folder", path
    if path.exists():
        raise ModelLoadError(spec, "expected a folder with safetensors weights or a .gguf file")
    raise ModelLoadError(spec, f"no such folder or .gguf file. The plugin never downloads from a model hub; "
                         f"{how_to_get(spec)}")


def load(spec: EngineSpec, request: LoadRequest) -> LoadedModel:
    """``spec`` on transformers, under the CPU numerics ``request`` names (checked before the load on
    the CPU: a run refused here loads no model), on the kernels ``Kernels.choose`` picks."""
    __tracebackhide__ = True
    text = spec.text
    named = hub_id(text)
    snapshot = hub.find(text, named) if named is not None else None
    kind, path = ("folder", snapshot.folder) if snapshot is not None else resolve(text)
    device = hf.pick_device(text, request.device)
    in_force = {}
    if device == "cpu":  # on a GPU the CPU's kernels do not touch the logits
        # before the load: a run refused here (a CPU without AVX2, torch started first) loads no model
        in_force = numerics.check(request.cpu_numerics, pinned_late=request.pinned_late)
    model, tokenizer, origin = hf.load(text, kind, path, dtype=request.dtype, device=device)
    kernels = Kernels.choose(profiles.profile(request.cpu_numerics), in_force=in_force, dtype=request.dtype,
                             device=device, batch_invariant=request.batch_invariant,
                             recording=request.recording, folder=cached.cache_dir() / "kernels", model=model)
    engine = hf.HFEngine(model, tokenizer, device, kernels=kernels)
    return LoadedModel(spec=text, kind=kind, path=path, model=model, tokenizer=tokenizer, dtype=request.dtype,
                       device=device, engine=engine, cpu_numerics=request.cpu_numerics,
                       hub_commit=snapshot.commit if snapshot is not None else None, origin=origin,
                       slower=kernels.slower)
