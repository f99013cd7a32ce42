"""The benchmarks and scripts the docs tell readers to run still name what the package has: the inner
loop's quick check. They import the package inside functions (after pinning CPU numerics), so nothing
fails until a reader runs them; this reads every such import and resolves it, without running
anything heavy. The benchmarks also run, in their smoke forms, in tests/pytester/test_benchmarks.py
(and the llama.cpp one in tests/engines/test_benchmarks_engines.py), which catches what an import
cannot: a renamed argument, a changed return value."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.helpers.benchmarks import RESULT_LINES, scripts

FILES = sorted([*ROOT.glob("benchmarks/*.py"), *ROOT.glob("scripts/*.py"), *ROOT.glob("examples/*.py")])


def package_names(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name) for every ``from pytest_llmdeterminism… import name`` and
    ``import pytest_llmdeterminism…`` in ``path``."""
    found: list[tuple[int, str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pytest_llmdeterminism"):
            found += [(node.lineno, str(node.module), alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names
                      if alias.name.startswith("pytest_llmdeterminism")]
    return found


def unresolved(path: Path) -> list[str]:
    problems = []
    for line, module, name in package_names(path):
        try:
            imported = importlib.import_module(module)
        except ImportError as error:
            problems.append(f"{path.name}:{line} {module}: {error}")
            continue
        if name is not None and not hasattr(imported, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                problems.append(f"{path.name}:{line} {module} has no {name!r}")
    return problems


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_import_of_the_package_resolves(path):
    assert unresolved(path) == []


def test_the_check_sees_a_moved_name(tmp_path):
    """Negative control: a name the package no longer has is reported."""
    stale = tmp_path / "stale.py"
    stale.write_text("def f():\n    from pytest_llmdeterminism.goldens.store import to_entry\n"
                     "    import pytest_llmdeterminism.backends\n")
    assert [problem.split(" ", 1)[0] for problem in unresolved(stale)] == ["stale.py:2", "stale.py:3"]


def test_every_benchmark_names_the_lines_its_smoke_run_prints():
    """A script in benchmarks/ that the smoke runs' table does not name fails here too, in the inner
    loop, before its smoke run fails in the subprocess tier."""
    assert sorted(RESULT_LINES) == scripts()
