"""The reference pages' generated blocks: rendered from the code, committed, and kept current.

A page holds a generated block between two marker lines; what lies between them is written by this
file, never by hand::

    <!-- generated: options -->
    ...
    <!-- end of generated: options -->

``python docs/hooks.py --write`` rewrites every block in ``docs/`` from the code, so a reader on
GitHub sees the full reference; ``--check`` lists the pages whose blocks differ (exit 1), as
``tests/unit/test_docs.py`` does. As an mkdocs hook it renders the blocks again at build time, so the site
always documents the code it was built from. The blocks:

- ``<!-- generated: options -->``: every ``--llm-*`` option and ini setting, read from a real
  ``pytest.Parser`` that the plugin's ``run.options.register`` filled;
- ``<!-- generated: cli -->``: the help of ``llm-golden`` and of each of its commands, from its
  argparse parser;
- ``<!-- generated: layers -->``: the package map, from ``tests/unit/test_layers.py``'s ``PACKAGES`` table
  and the first sentence of each module's docstring;
- ``<!-- generated: api -->``: the names in ``pytest_llmdeterminism.__all__`` with their summaries.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import enum
import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PACKAGE = ROOT / "pytest_llmdeterminism"
MARKER = re.compile(r"^<!-- generated: (\w+) -->$", re.MULTILINE)
BLOCK = re.compile(r"^(<!-- generated: (\w+) -->\n).*?^(<!-- end of generated: \2 -->)$",
                   re.MULTILINE | re.DOTALL)
REGENERATE = "python docs/hooks.py --write"


def on_startup(**_: Any) -> None:
    # Document this tree's code, whatever copy of the package is installed.
    sys.path.insert(0, str(ROOT))


def on_page_markdown(markdown: str, **_: Any) -> str:
    return fill(markdown)


def fill(markdown: str) -> str:
    """``markdown`` with every generated block rendered afresh from the code."""
    return BLOCK.sub(lambda match: f"{match.group(1)}\n{_render(match.group(2))}\n\n{match.group(3)}",
                     markdown)


def stale_pages(docs: Path = DOCS) -> dict[Path, str]:
    """Each page whose generated blocks differ from the code, with its text as it should read."""
    stale = {}
    for page in sorted(docs.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        filled = fill(text)
        if filled != text:
            stale[page] = filled
    return stale


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python docs/hooks.py", description=(__doc__ or "").split("\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="rewrite every stale page's generated blocks")
    action.add_argument("--check", action="store_true", help="list stale pages; exit 1 if there are any")
    args = parser.parse_args(argv)
    on_startup()
    stale = stale_pages()
    for page, text in stale.items():
        if args.write:
            page.write_text(text, encoding="utf-8")
        print(f"{'rewrote' if args.write else 'stale:'} {page.relative_to(ROOT)}")
    if not stale:
        print("the generated reference matches the code")
    elif args.check:
        print(f"the generated reference differs from the code; regenerate it with: {REGENERATE}")
        return 1
    return 0


def _render(name: str) -> str:
    renderers: dict[str, Callable[[], str]] = {"options": options, "cli": cli, "layers": layers, "api": api}
    if name not in renderers:
        raise ValueError(f"docs/hooks.py: no generated block named {name!r}; known: {', '.join(renderers)}")
    return renderers[name]()


# --- options -----------------------------------------------------------------------------------------


def _filled_parser() -> Any:
    from _pytest.config.argparsing import Parser

    from pytest_llmdeterminism.run import options as run_options

    parser = Parser(_ispytest=True)
    run_options.register(parser)
    return parser


def _ini_settings(parser: Any) -> dict[str, tuple[str, object]]:
    """ini name -> (help, default), as the plugin declared them with ``parser.addini``."""
    declared = getattr(parser, "_inidict", None)
    if declared is not None:  # pytest keeps what addini was given here (name -> (help, type, default))
        return {name: (str(entry[0]), entry[2]) for name, entry in declared.items()}
    from pytest_llmdeterminism.run.options import SETTINGS

    return {setting.ini: (setting.help, setting.default) for setting in SETTINGS}


def _usage(names: list[str], attrs: dict[str, Any]) -> str:
    flag = names[-1]
    nargs = attrs.get("nargs")
    if nargs == 0:
        return flag
    metavar = attrs.get("metavar") or (
        "|".join(attrs["choices"]) if attrs.get("choices") else attrs["dest"].removeprefix("llm_").upper()
    )
    return f"{flag}[={metavar}]" if nargs == "?" else f"{flag}={metavar}"


def _llm_groups(parser: Any) -> list[Any]:
    """The option groups that hold this plugin's ``--llm-*`` options."""
    groups = getattr(parser, "_groups", None) or [parser.getgroup("llmdeterminism")]
    return [group for group in groups
            if any(name.startswith("--llm") for option in group.options for name in option.names())]


def options() -> str:
    parser = _filled_parser()
    ini = _ini_settings(parser)
    lines = []
    dests = set()
    for group in _llm_groups(parser):
        for option in group.options:
            attrs = option.attrs()
            names = option.names()
            dest = attrs.get("dest")
            dests.add(dest)
            rows = [f"- command line: `{_usage(names, attrs)}`"]
            if dest in ini:
                default = ini[dest][1]
                rows += [f"- ini: `{dest}`", f"- ini default: `{default}`" if default not in (None, "")
                         else "- ini default: none"]
            if attrs.get("action") == "append" or isinstance(attrs.get("default"), list):  # argparse's append
                rows.append("- repeatable")
            lines += [f"### `{names[-1]}`", "", *rows, "", _escape(str(attrs.get("help", ""))), ""]
    for name in [name for name in ini if name not in dests]:  # an ini setting without a command-line twin
        help_text, default = ini[name]
        lines += [f"### `{name}`", "", f"- ini: `{name}` (default `{default}`)", "", _escape(help_text), ""]
    return "\n".join(lines)


# --- the llm-golden command --------------------------------------------------------------------------


def _cli_parser() -> argparse.ArgumentParser:
    cli = importlib.import_module("pytest_llmdeterminism.cli")
    build = cli.parser
    result: argparse.ArgumentParser = build()
    return result


@contextlib.contextmanager
def _plain_terminal() -> Iterator[None]:
    """Help text wrapped at one width and without colour, whatever terminal runs the build."""
    saved = {key: os.environ.get(key) for key in ("COLUMNS", "NO_COLOR", "PYTHON_COLORS")}
    os.environ.update(COLUMNS="100", NO_COLOR="1", PYTHON_COLORS="0")
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def cli() -> str:
    with _plain_terminal():
        parser = _cli_parser()
        sections = [("llm-golden", parser.format_help())]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                sections += [(f"llm-golden {name}", command.format_help())
                             for name, command in action.choices.items()]
    lines = []
    for title, text in sections:
        lines += [f"## `{title}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(lines)


# --- the package map ---------------------------------------------------------------------------------


def _layers_table() -> dict[str, list[list[str]]]:
    spec = importlib.util.spec_from_file_location("_docs_test_layers",
                                                  ROOT / "tests" / "unit" / "test_layers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table: dict[str, list[list[str]]] = module.PACKAGES
    return table


def _source(module: str) -> Path:
    if module == "__init__":
        return PACKAGE / "__init__.py"
    path = PACKAGE.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _summary(doc: str | None) -> str:
    """The docstring's first sentence, as Markdown."""
    if not doc:
        return ""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    if re.match(r"\w+\(.*\)$", paragraph):  # a dataclass's generated signature, not a docstring
        return ""
    sentence = re.split(r"(?<=\.)\s+(?=[A-Z`])", paragraph)[0]
    sentence = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", sentence)
    return _escape(sentence.replace("``", "`"))


def _escape(text: str) -> str:
    """Text from the code, safe in a Markdown table cell or paragraph."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(part if part.startswith("`") else part.replace("|", "&#124;").replace("<", "&lt;")
                   .replace("*", r"\*").replace("_", r"\_") for part in parts).replace("|", "&#124;")


def layers() -> str:
    rows = []
    number = 0
    for package, block in _layers_table().items():
        for line in block:
            for module in line:
                doc = ast.get_docstring(ast.parse(_source(module).read_text(encoding="utf-8")))
                name = "pytest_llmdeterminism" if module == "__init__" else module
                rows.append(f"| {number} | {package} | `{name}` | {_summary(doc)} |")
            number += 1
    rows.reverse()  # the top of the house first, as a reader meets it
    return "\n".join(["| layer | package | module | its job (the module's docstring) |",
                      "|---|---|---|---|", *rows])


# --- the public API ----------------------------------------------------------------------------------


def api() -> str:
    package = importlib.import_module("pytest_llmdeterminism")
    rows = ["| name | kind | what it is |", "|---|---|---|"]
    for name in package.__all__:
        value = getattr(package, name)
        if name == "deterministic":
            kind = "marker"
            doc = ("The `deterministic` marker: the same object as `pytest.mark.deterministic`. Bare, or "
                   "with `seed`, `max_new_tokens`, `batch_shape`, `tolerance`.")
        else:
            kind = _kind(value)
            # A class's own docstring: one it inherits describes its base, not it.
            doc = _summary(inspect.cleandoc(vars(value).get("__doc__") or "") if isinstance(value, type)
                           else inspect.getdoc(value))
        rows.append(f"| `{name}` | {kind} | {doc} |")
    return "\n".join(rows)


def _kind(value: object) -> str:
    if not isinstance(value, type):
        return "function"
    if issubclass(value, BaseException):
        return "exception"
    return "enum" if issubclass(value, enum.Enum) else "class"


if __name__ == "__main__":
    sys.exit(main())
