"""Importing the package: no torch, transformers or numpy loaded, the public marker, and a public
surface that exports every error (all derived from the root error) and every type a user annotates
or matches on, its lazy exports staying lazy."""

import subprocess
import sys

import pytest


@pytest.mark.fresh_python  # it tests what a new Python imports
def test_import_does_not_load_torch_or_transformers():
    code = ("import sys, pytest_llmdeterminism, pytest_llmdeterminism.plugin; "
            "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_public_marker_is_pytest_mark():
    import pytest

    from pytest_llmdeterminism import deterministic

    assert deterministic.name == "deterministic"
    assert deterministic.mark == pytest.mark.deterministic.mark


def _classes_defined_in_the_package() -> dict[str, type]:
    """Every class defined at the top of a module of the package, by its defining module's source:
    found by walking the files, so a module nobody imports is not missed."""
    import ast
    import importlib
    from pathlib import Path

    import pytest_llmdeterminism

    root = Path(pytest_llmdeterminism.__file__).parent
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                found[f"{module}.{node.name}"] = getattr(importlib.import_module(module), node.name)
    return found


def test_every_error_the_package_defines_is_exported_and_derives_from_the_root_error():
    import pytest_llmdeterminism as package

    errors = {where: cls for where, cls in _classes_defined_in_the_package().items()
              if issubclass(cls, BaseException)}
    assert len(errors) >= 17  # the walk found the tree, not nothing
    assert [where for where, cls in errors.items() if not issubclass(cls, package.LLMDeterminismError)] == []
    assert [where for where, cls in errors.items()
            if cls.__name__ not in package.__all__ or getattr(package, cls.__name__) is not cls] == []
    assert [where for where, cls in errors.items() if cls.__module__ != "pytest_llmdeterminism"] == []


def test_a_shard_error_is_still_caught_as_a_plain_exception():
    from pytest_llmdeterminism import LLMDeterminismError, ShardError

    assert issubclass(ShardError, LLMDeterminismError) and issubclass(ShardError, Exception)


def test_the_types_a_user_annotates_or_matches_on_are_exported():
    import typing

    import pytest_llmdeterminism as package
    from pytest_llmdeterminism.judge.compare import Comparison, Verdict
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.run.golden_tokens import GoldenTokens

    names = ("Comparison", "Verdict", "LLMModel", "GoldenTokens")
    exported = {name: getattr(package, name) for name in names}
    assert exported == {"Comparison": Comparison, "Verdict": Verdict, "LLMModel": LLMModel,
                        "GoldenTokens": GoldenTokens}
    assert set(exported) <= set(package.__all__)
    assert package.Verdict.NONDETERMINISTIC.value == "NONDETERMINISTIC"
    # A public type's annotations resolve wherever it says it lives (tools that read them: Hypothesis'
    # from_type, dataclass and docs tooling).
    classes = [getattr(package, name) for name in package.__all__ if isinstance(getattr(package, name), type)]
    for cls in classes:
        typing.get_type_hints(cls)


@pytest.mark.fresh_python  # it tests what a new Python imports
def test_the_lazily_loaded_exports_stay_lazy_and_appear_in_dir():
    """hypothesis (strategies) and the llm-golden command's modules load only when their names are
    used, so pytest loading the plugin costs nothing more; `dir()` and `from ... import` see them."""
    code = ("import sys, pytest_llmdeterminism as p, pytest_llmdeterminism.plugin\n"
            "before = sorted(m for m in ('hypothesis', 'pytest_llmdeterminism.cli') if m in sys.modules)\n"
            "from pytest_llmdeterminism import BatchInvarianceError, FetchError, PerturbError\n"
            "print(before, 'hypothesis' in sys.modules, set(p.__all__) <= set(dir(p)),\n"
            "      BatchInvarianceError.__module__, FetchError.__module__, PerturbError.__module__)\n"
            "try:\n    p.NoSuchName\nexcept AttributeError as error:\n    print(error)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "[] True True pytest_llmdeterminism pytest_llmdeterminism pytest_llmdeterminism",
        "module 'pytest_llmdeterminism' has no attribute 'NoSuchName'"]
