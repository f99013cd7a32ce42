"""The docs' generated pages cover the code they are generated from, and the README stays short.

``docs/hooks.py`` renders the reference when mkdocs builds the site (``mkdocs build --strict`` in
``.ci/run`` checks links and anchors); these tests call its renderers directly, without mkdocs.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from pytest_llmdeterminism.run.options import SETTINGS

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_options_reference_lists_every_option_and_ini_setting(hooks):
    from _pytest.config.argparsing import Parser

    from pytest_llmdeterminism.run.options import register

    parser = Parser(_ispytest=True)
    register(parser)
    flags = {name for group in parser._groups for option in group.options for name in option.names()
             if name.startswith("--llm")}
    page = hooks.options()
    assert flags >= {setting.flag for setting in SETTINGS} | {"--llm-golden-update", "--llm-report"}
    assert [flag for flag in sorted(flags) if f"### `{flag}`" not in page] == []
    assert [s.ini for s in SETTINGS if f"- ini: `{s.ini}`" not in page] == []


def test_the_cli_reference_shows_every_command(hooks):
    page = hooks.cli()
    commands = re.findall(r"^## `llm-golden (\w+)`", page, re.MULTILINE)
    assert {"show", "diff", "accept", "merge", "prune", "fetch", "perturb"} <= set(commands)
    assert "usage: llm-golden diff" in page


def test_the_package_map_lists_every_module_of_the_layering_test(hooks):
    page = hooks.layers()
    modules = [module for block in hooks._layers_table().values() for line in block for module in line]
    assert [m for m in modules if f"`{m}`" not in page and m != "__init__"] == []


def test_the_api_reference_lists_the_public_names(hooks):
    import pytest_llmdeterminism

    page = hooks.api()
    assert [name for name in pytest_llmdeterminism.__all__ if f"| `{name}` |" not in page] == []


def test_every_generated_block_a_page_asks_for_exists(hooks):
    asked = {match for page in DOCS.rglob("*.md") for match in hooks.MARKER.findall(page.read_text())}
    assert asked == {"options", "cli", "layers", "api"}
    with pytest.raises(ValueError, match="no generated block named 'nope'"):
        hooks._render("nope")


def test_the_readme_keeps_to_the_first_five_minutes():
    assert len((ROOT / "README.md").read_bytes()) <= 12 * 1024
