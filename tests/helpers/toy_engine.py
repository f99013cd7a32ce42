"""A throw-away engine for the registry's tests: registered by a test alone (``TOY``, put into
``registry.ENGINES`` for that test), it loads any ``toy:TARGET#version=V`` spec without a model file and
describes its own fingerprint. Nothing outside this module and the test names it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_llmdeterminism.engines.loaded import LoadedModel, LoadRequest
from pytest_llmdeterminism.engines.registry import ANY_NUMERICS, EngineEntry
from pytest_llmdeterminism.engines.spec import EngineSpec
from pytest_llmdeterminism.generation import HashDefinition

TOY = EngineEntry("toy", __name__, {ANY_NUMERICS: ("engine", "toy_version")}, served=True,
                  local_target=False)


@dataclass(frozen=True)
class ToyOptions:
    version: str = "1"


class ToyEngine:
    name = "toy"
    hash_definition = HashDefinition.LOGITS
    runs_rows_alone = True
    owns_sampling = False
    supports_audit = False

    def __init__(self, version: str) -> None:
        self.version = version

    def run(self, *args: Any) -> Any:
        raise NotImplementedError("the toy engine generates nothing")

    def eos_token_ids(self) -> list[int]:
        return []

    def vocab_size(self) -> int:
        return 0

    def fingerprint(self, loaded: LoadedModel) -> dict[str, Any]:
        return {"engine": self.name, "toy_version": self.version, "target": str(loaded.path)}


def load(spec: EngineSpec, request: LoadRequest) -> LoadedModel:
    version = spec.options(ToyOptions).version
    return LoadedModel(spec=spec.text, kind="toy", path=Path(spec.target), model=None, tokenizer=None,
                       dtype=request.dtype, device="toy", engine=ToyEngine(version))
