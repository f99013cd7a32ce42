"""The design page's recipes (docs/design/index.md, "Variation points") stay true: every file a row
names exists (``NAME`` stands for the newcomer's module: its folder must exist), every table named
as "`TABLE` of `file`" or "`TABLE` in `file`" is defined there, and every test named in the last
column exists and adds its throw-away sibling (it has tests, and the helper it names exists)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "design" / "index.md"
PACKAGE = ROOT / "pytest_llmdeterminism"
START, END = "<!-- recipes -->", "<!-- end of recipes -->"
EXPECTED = {"a kind of golden", "a verdict", "an engine", "a report format"}


def recipes(text: str) -> dict[str, tuple[str, str]]:
    """Each row of the recipes table: what it adds -> (the files it touches, the tests)."""
    table = text[text.index(START) + len(START):text.index(END)]
    found = {}
    for row in table.strip().splitlines()[2:]:  # past the header and its rule
        added, files, tests = (cell.strip() for cell in row.strip().strip("|").split("|"))
        found[added] = (files, tests)
    return found


def _path(name: str) -> Path:
    return ROOT / name if name.startswith(("tests/", "docs/")) else PACKAGE / name


def _defines(path: Path, name: str) -> bool:
    """Whether ``path`` defines ``name`` at its top level (a class, a function or an assignment)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(target, ast.Name) and target.id == name for target in targets):
            return True
    return False


def problems(rows: dict[str, tuple[str, str]]) -> list[str]:
    found = []
    for added, (files, tests) in rows.items():
        for name in re.findall(r"`([\w/]+\.py)`", files + " " + tests):
            path = _path(name)
            exists = path.parent.is_dir() if "NAME" in name else path.is_file()
            if not exists:
                found.append(f"{added}: {name} does not exist")
        for symbol, name in re.findall(r"`(\w+)` (?:of|in) `([\w/]+\.py)`", files):
            if _path(name).is_file() and not _defines(_path(name), symbol):
                found.append(f"{added}: {name} defines no {symbol}")
        test_files = re.findall(r"`(tests/[\w/]+/test_\w+\.py)`", tests)
        if not test_files:
            found.append(f"{added}: names no test")
        for name in test_files:
            if _path(name).is_file() and "def test_" not in _path(name).read_text(encoding="utf-8"):
                found.append(f"{added}: {name} has no test")
    return found


def test_the_page_has_a_recipe_for_each_variation_point():
    assert set(recipes(PAGE.read_text(encoding="utf-8"))) == EXPECTED


def test_every_recipe_names_files_tables_and_tests_that_exist():
    assert problems(recipes(PAGE.read_text(encoding="utf-8"))) == []


@pytest.mark.parametrize(("row", "problem"), [
    ("| a kind | `goldens/kinds/NAME.py`; its line in `KINDS` of `goldens/nowhere.py` | "
     "`tests/pytester/test_plugged_in_kind.py` |", "a kind: goldens/nowhere.py does not exist"),
    ("| a kind | its line in `MISSING_TABLE` of `goldens/kinds/__init__.py` | "
     "`tests/pytester/test_plugged_in_kind.py` |",
     "a kind: goldens/kinds/__init__.py defines no MISSING_TABLE"),
    ("| a kind | `goldens/kinds/NAME.py` | `tests/pytester/test_gone.py` |",
     "a kind: tests/pytester/test_gone.py does not exist"),
    ("| a kind | `goldens/kinds/NAME.py` | by hand |", "a kind: names no test"),
])
def test_the_check_sees_a_stale_recipe(row, problem):
    page = f"{START}\n| to add | files | test |\n|---|---|---|\n{row}\n{END}"
    assert problem in problems(recipes(page))
