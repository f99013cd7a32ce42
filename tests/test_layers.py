"""The package's house: every module sits on a layer and imports only from layers below it.

Any import counts: at module level, inside a function, or under ``TYPE_CHECKING``. A strict order
of layers also rules out every import cycle. A new module must be given its layer here (and in the
README's design notes), so the picture cannot drift from the code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "pytest_llmdeterminism"

LAYERS = [  # lowest first; each line may import only from the lines above it
    ["errors"],
    ["values", "generation", "numerics", "determinism"],
    ["compare", "capture", "backends.hf"],
    ["tolerance", "store", "backends"],
    ["fingerprint", "records", "files"],
    ["model", "options", "ledger"],
    ["audit"],
    ["report"],
    ["settings", "golden", "writer", "strategies"],
    ["session", "suites"],
    ["plugin", "cli", "__init__"],
]
LAYER = {module: number for number, modules in enumerate(LAYERS) for module in modules}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def package_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import of a module of this package in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pytest_llmdeterminism import store` imports the module store
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        modules = set()
        for name in names:
            if name.startswith("pytest_llmdeterminism."):
                module = name.removeprefix("pytest_llmdeterminism.")
                while module and module not in LAYER:  # a name imported from a module: the module
                    module = module.rpartition(".")[0]
                modules.add(module)
        found += [(node.lineno, module) for module in sorted(modules - {""})]
    return found


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if "tiny" not in p.parts)


def test_every_module_has_a_layer():
    assert sorted(module_name(p) for p in SOURCES if module_name(p) not in LAYER) == []


@pytest.mark.parametrize("path", SOURCES, ids=module_name)
def test_imports_only_go_down(path):
    source = module_name(path)
    upward = [f"{path.name}:{line} imports {target} (layer {LAYER[target]}, not below {source}'s {LAYER[source]})"
              for line, target in package_imports(path) if target != source and LAYER[target] >= LAYER[source]]
    assert upward == []


def test_the_checker_sees_upward_imports(tmp_path):
    """Negative control: an upward import, hidden in a function, is found."""
    module = PACKAGE / "compare.py"
    planted = tmp_path / "compare.py"
    planted.write_text(module.read_text() + "\ndef f():\n    from pytest_llmdeterminism.session import LLMSession\n")
    lines = [(line, target) for line, target in package_imports(planted) if LAYER[target] >= LAYER["compare"]]
    assert [target for _, target in lines] == ["session"]
