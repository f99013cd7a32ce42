"""The docs' generated pages cover the code they are generated from and are committed current; the
pages say what the code does; the README stays short.

``docs/hooks.py`` renders the reference into the committed pages (``python docs/hooks.py --write``)
and again when mkdocs builds the site (``mkdocs build --strict`` in ``.ci/run`` checks links and
anchors); these tests call its renderers directly, without mkdocs.
"""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType

import pytest

from pytest_llmdeterminism.run.options import SETTINGS
from tests.helpers import ROOT
from tests.helpers.docs import first_block

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


def test_every_public_name_says_what_it_is_in_its_own_words(hooks):
    """A class without a docstring would show its base's (an Enum's "Create a collection of
    name/value pairs.", an error its parent's), or nothing."""
    rows = [line.split(" | ") for line in hooks.api().splitlines()[2:]]
    assert [name for name, _, summary in rows if not summary.strip(" |")] == []
    assert "| `Verdict` | enum | What one golden check found" in hooks.api()
    assert "Create a collection" not in hooks.api()


def test_every_generated_block_a_page_asks_for_exists_and_is_closed(hooks):
    pages = {page: page.read_text(encoding="utf-8") for page in DOCS.rglob("*.md")}
    asked = {match for text in pages.values() for match in hooks.MARKER.findall(text)}
    assert asked == {"options", "cli", "layers", "api"}
    unclosed = [page.name for page, text in pages.items()
                if len(hooks.MARKER.findall(text)) != len(hooks.BLOCK.findall(text))]
    assert unclosed == []
    with pytest.raises(ValueError, match="no generated block named 'nope'"):
        hooks._render("nope")


def test_the_committed_reference_pages_are_what_the_code_generates(hooks, capsys):
    """A reader on GitHub sees whole pages, not stubs: regenerated in memory, they must not change."""
    stale = hooks.stale_pages()
    assert not stale, (f"{', '.join(str(page.relative_to(ROOT)) for page in stale)} differ from the "
                       f"code; regenerate them with: {hooks.REGENERATE}")
    assert hooks.REGENERATE in (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert hooks.main(["--check"]) == 0
    assert capsys.readouterr().out == "the generated reference matches the code\n"


def test_a_stale_generated_block_is_found_and_rewritten(hooks, tmp_path):
    """Negative control for the freshness test: a block that no longer matches the code is stale, and
    filling it writes the code's version, leaving the text around it alone."""
    page = tmp_path / "api.md"
    page.write_text("Before.\n\n<!-- generated: api -->\n| `OldName` | class |\n"
                    "<!-- end of generated: api -->\n\nAfter.\n", encoding="utf-8")
    (tmp_path / "plain.md").write_text("No block here.\n", encoding="utf-8")
    stale = hooks.stale_pages(tmp_path)
    assert list(stale) == [page]
    assert stale[page].startswith("Before.\n\n<!-- generated: api -->\n\n| name | kind | what it is |")
    assert "| `Verdict` | enum |" in stale[page]
    assert stale[page].endswith("\n\n<!-- end of generated: api -->\n\nAfter.\n")
    assert "OldName" not in stale[page] and hooks.stale_pages(tmp_path) == stale  # nothing written


def test_the_readme_keeps_to_the_first_five_minutes():
    assert len((ROOT / "README.md").read_bytes()) <= 12 * 1024


# --- the pages say what the code does ----------------------------------------------------------------


def _verdict_table(text: str) -> list[str]:
    """The verdicts of the first table whose header is ``| verdict | ...``, in the page's order."""
    table = text.split("| verdict |", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^\| `([A-Z_]+)` \|", table, re.MULTILINE)


def test_the_verdicts_page_lists_every_verdict_in_the_order_the_code_decides_them():
    from pytest_llmdeterminism import Verdict

    # judge.decision.decide asks NONDETERMINISTIC (an earlier attempt's other output),
    # then MISSING; compare() then INPUT_CHANGED, then the first token divergence (TIE_FLIP, for a
    # sampled golden SAMPLE_FLIP, or REGRESSION; a score's rank change at a near tie RANK_FLIP), and
    # only with every token equal the hashes (LOGIT_DRIFT, or with the golden's text and pieces
    # against what its ids decode to, FIELDS_CHANGED or IDENTICAL).
    decided = ["NONDETERMINISTIC", "MISSING", "INPUT_CHANGED", "TIE_FLIP", "SAMPLE_FLIP", "RANK_FLIP",
               "REGRESSION", "LOGIT_DRIFT", "FIELDS_CHANGED", "IDENTICAL"]
    assert sorted(decided) == sorted(verdict.value for verdict in Verdict)
    assert _verdict_table((DOCS / "concepts" / "verdicts.md").read_text(encoding="utf-8")) == decided
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = readme.split("Every check ends in one verdict", 1)[1].split("decided in that order", 1)[0]
    assert re.findall(r"`([A-Z_]+)`", listed) == decided
    home = (DOCS / "index.md").read_text(encoding="utf-8").split("**Verdicts, not diffs.**", 1)[1]
    assert set(re.findall(r"`([A-Z_]+)`", home.split(" See", 1)[0])) == set(decided)


# --- one install instruction -------------------------------------------------------------------------

TORCH_CPU = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *DOCS.rglob("*.md")])


def _code_lines(text: str) -> list[str]:
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    return [line.strip() for block in blocks for line in block.splitlines()]


def test_every_page_installs_torch_with_one_command():
    """Every command that installs torch is the pinned CPU build from PyTorch's index, and every
    mention of a torch pin names the same version."""
    commands = {f"{page.relative_to(ROOT)}: {line}" for page in PAGES
                for line in _code_lines(page.read_text(encoding="utf-8"))
                if re.search(r"pip install [\"']?torch\b", line)}
    assert len(commands) >= 4  # README, getting started, CONTRIBUTING, the sharding workflow
    assert [command for command in commands if TORCH_CPU not in command] == []
    pins = {pin for page in PAGES for pin in re.findall(r"torch==([\d.]+)", page.read_text(encoding="utf-8"))}
    assert pins == {"2.13.0"}
    unpinned = [page.relative_to(ROOT) for page in PAGES
                if re.search(r"pip install [\"']?torch\b(?!==)", page.read_text(encoding="utf-8"))]
    assert unpinned == []


def test_the_sharding_workflow_is_complete():
    """Checkout, Python, CPU torch, the plugin, the model on the runner, the shards with their
    artifacts, and a merge job that reads them."""
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load(first_block((DOCS / "ci" / "sharding.md").read_text(encoding="utf-8"), "yaml"))
    shards, review = workflow["jobs"]["llm-tests"], workflow["jobs"]["llm-review"]

    def steps(job: dict) -> list[str]:
        return [step.get("uses", "").split("@")[0] or step["run"] for step in job["steps"]]

    shard_steps = steps(shards)
    assert shard_steps[:2] == ["actions/checkout", "actions/setup-python"]
    assert shard_steps[2].startswith(TORCH_CPU) and "actions/cache" in shard_steps
    download = next(step for step in shards["steps"] if "hf download" in step.get("run", ""))
    assert download["if"] == "steps.model.outputs.cache-hit != 'true'"
    assert any("--splits 3" in step and "--llm-report=llm-shard/report.json" in step for step in shard_steps)
    assert shard_steps[-1] == "actions/upload-artifact"
    assert review["needs"] == "llm-tests" and review["if"] == "always()"
    assert steps(review)[2].startswith(TORCH_CPU)
    assert "actions/download-artifact" in steps(review)
    assert any(step.startswith("llm-golden merge shards/*/report.json") for step in steps(review))


def test_the_gguf_hint_installs_what_the_gguf_extra_installs(monkeypatch):
    """A plugin installed from a path or a wheel is not on the index by name: the hint names the
    packages, with the versions the [gguf] extra asks for."""
    import importlib.util
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib

    from pytest_llmdeterminism import ModelLoadError
    from pytest_llmdeterminism.engines import checkpoint

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError) as raised:
        checkpoint.require_gguf_support("model.gguf")
    assert str(raised.value) == ("cannot load llm_model 'model.gguf': loading .gguf files needs gguf and "
                                 "accelerate: pip install 'gguf>=0.10' 'accelerate>=1.0'")
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"]["gguf"]
    assert extra == [f"{name}{version}" for name, version in checkpoint.GGUF_REQUIREMENTS.items()]
