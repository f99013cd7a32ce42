"""The house's fences (STYLE.md): a module of more than 400 lines says at its top why it is long
(a line of its docstring starting with ``Long:``), and no function is longer than 80 lines."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_llmdeterminism"
SOURCES = sorted(PACKAGE.rglob("*.py"))
MODULE_LINES = 400
FUNCTION_LINES = 80
NOTE = "Long:"


def _explained(tree: ast.Module) -> bool:
    """Whether the module's docstring has a line that says why the module is long."""
    docstring = ast.get_docstring(tree) or ""
    return any(line.strip().startswith(NOTE) for line in docstring.splitlines())


def long_modules(sources: list[Path], root: Path = PACKAGE) -> list[str]:
    """Each module over the line fence whose docstring does not say why."""
    found = []
    for path in sources:
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MODULE_LINES and not _explained(ast.parse(text)):
            found.append(f"{path.relative_to(root)}: {lines} lines")
    return found


def long_functions(sources: list[Path], root: Path = PACKAGE) -> list[str]:
    """Each function (or method) over the function fence."""
    found = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {length} lines")
    return found


def test_a_module_over_the_fence_says_why_at_its_top():
    assert long_modules(SOURCES) == []


def test_no_function_is_over_the_fence():
    assert long_functions(SOURCES) == []


def test_the_fences_see_what_they_guard(tmp_path):
    """The checks are not vacuous: a long module without its note, and a long function, are found."""
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    long = tmp_path / "long.py"
    long.write_text('"""A module."""\n\n\ndef f():\n' + body + "\n" + "\n" * MODULE_LINES)
    noted = tmp_path / "noted.py"
    noted.write_text(f'"""A module.\n\n{NOTE} one concern, its proof beside it."""\n' + "\n" * MODULE_LINES)
    assert long_modules([long, noted], tmp_path) == [f"long.py: {MODULE_LINES + FUNCTION_LINES + 4} lines"]
    assert long_functions([long], tmp_path) == [f"long.py:4 f: {FUNCTION_LINES + 1} lines"]
