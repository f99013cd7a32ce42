"""The engine seam (engines/registry.py): an engine registered in a test alone is chosen by its prefix,
loaded, fingerprinted, judged on its own compared fields and asked whether it is served, with no edit
anywhere else; the four engines' entries say what the callers used to test their names for."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from pytest_llmdeterminism import engines
from pytest_llmdeterminism.engines import registry
from pytest_llmdeterminism.engines.registry import entry_of, recorded_by
from pytest_llmdeterminism.engines.spec import EngineSpec, engine_of, with_local_paths
from pytest_llmdeterminism.judge.fingerprint import numerics_changes
from pytest_llmdeterminism.model.fingerprint import fingerprint
from pytest_llmdeterminism.reporting.hints import serving_note
from tests.helpers.toy_engine import TOY


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(registry.ENGINES, TOY.name, TOY)
    return TOY


def test_a_registered_engine_is_chosen_loaded_and_fingerprinted_by_itself(toy):
    assert entry_of("toy:models/m") is toy and engine_of("toy:models/m") == "toy"
    loaded = engines.load("toy:models/m#version=2", dtype="float32", device="auto")
    assert (loaded.engine.name, loaded.device, loaded.cpu_numerics) == ("toy", "toy", "portable")
    assert fingerprint(loaded, flags={}) == {"engine": "toy", "toy_version": "2", "target": "models/m",
                                             "flags": {}}


def test_an_unregistered_prefix_names_the_default_engine():
    assert engine_of("toy:models/m") is None and entry_of("toy:models/m").name == "transformers"
    with pytest.raises(ValueError, match="names no engine prefix"):
        EngineSpec.parse("toy:models/m")


def test_its_own_compared_fields_decide_its_numerics(toy):
    recorded = {"engine": "toy", "toy_version": "1", "python": "3.12.1", "machine": "x86_64"}
    assert numerics_changes(recorded, {**recorded, "python": "3.13.0", "machine": "aarch64"}) == []
    assert numerics_changes(recorded, {**recorded, "toy_version": "2"}) == [("toy_version", "1", "2")]
    # a golden of the default engine judged on this one: its fields, "engine" first among them
    assert numerics_changes({"device_class": "cpu"}, recorded)[0] == ("engine", None, "toy")


def test_whether_its_goldens_are_served_is_asked_of_its_entry(toy, monkeypatch):
    decision = SimpleNamespace(passed=False, expected=SimpleNamespace(fingerprint={"engine": "toy"}))
    assert serving_note(decision).startswith("its golden was recorded without verifying how the server")
    monkeypatch.setitem(registry.ENGINES, TOY.name, dataclasses.replace(toy, served=False))
    assert serving_note(decision) == ""


def test_its_target_is_a_path_or_not_as_its_entry_says(toy, monkeypatch):
    def absolute(path):
        return f"/abs/{path}"

    assert with_local_paths("toy:http://h/v1#tokenizer=tok", absolute) == "toy:http://h/v1#tokenizer=/abs/tok"
    monkeypatch.setitem(registry.ENGINES, TOY.name, dataclasses.replace(toy, local_target=True))
    assert with_local_paths("toy:m#tokenizer=tok", absolute) == "toy:/abs/m#tokenizer=/abs/tok"


def test_the_engines_entries_say_what_callers_ask():
    facts = {name: (entry.default, entry.shares_cpu_cores, entry.served, entry.takes_dtype_and_device,
                    entry.local_target) for name, entry in registry.ENGINES.items()}
    assert facts == {
        "transformers": (True, True, False, True, True),
        "llamacpp": (False, True, False, False, True),
        "openai": (False, False, True, False, False),
        "vllm": (False, False, False, True, True),
    }
    assert recorded_by({"device_class": "cpu"}) is registry.ENGINES["transformers"]
    assert recorded_by({"engine": "gone"}) is None
    assert entry_of("builtin:tiny").default and entry_of("ORG/NAME").default


def test_each_entry_names_a_module_of_the_engines_package_that_loads():
    """The modules are imported by name when a spec chooses them: each must exist, inside ``engines/``
    (where the layering test places it), and take ``load(spec, request)``."""
    import importlib
    import inspect

    for entry in registry.ENGINES.values():
        assert entry.module.startswith("pytest_llmdeterminism.engines."), entry
        module = importlib.import_module(entry.module)
        assert list(inspect.signature(module.load).parameters) == ["spec", "request"], entry.module
