"""The project an ``llm-golden`` command works on, found as pytest finds it: the configuration file
nearest above the folder it starts from, that file's folder (pytest's rootdir), its ``llm_golden_dir``."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import iniconfig

from pytest_llmdeterminism.errors import LLMDeterminismError
from pytest_llmdeterminism.run.configuration import config_file_values

# pytest's order: in each folder, from the start upwards, the first of these that holds pytest settings.
CONFIG_FILES = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini",
                "setup.cfg")


@dataclass(frozen=True)
class Project:
    config_file: Path | None  # None: no configuration file above the start
    rootdir: Path
    golden_dir: Path | None  # llm_golden_dir, absolute; None where goldens sit beside their tests


@dataclass(frozen=True)
class Settled:
    """The root and golden folder a command works with, and the line that says where they came from."""

    root: Path
    golden_dir: Path | None  # relative to the root where it lies inside it, else absolute
    from_config: bool  # golden_dir is the configuration file's llm_golden_dir, not the command line's
    line: str


class ProjectConfigError(LLMDeterminismError):
    """The configuration file pytest would read cannot be read; the message says which and why."""


def find(start: Path) -> Project:
    """The project of ``start`` (a folder): its configuration file as pytest would pick it."""
    here = Path(os.path.abspath(start))
    pyproject = None
    for folder in (here, *here.parents):
        for name in CONFIG_FILES:
            path = folder / name
            if not path.is_file():
                continue
            values = _values(path)
            if values is not None:
                return _project(path, values)
            pyproject = pyproject or (path if name == "pyproject.toml" else None)
    if pyproject is not None:  # pytest's last resort: the nearest pyproject.toml, even without settings
        return Project(pyproject, pyproject.parent, None)
    return Project(None, here, None)


def _values(path: Path) -> dict[str, str] | None:
    try:
        return config_file_values(path)
    except (OSError, ValueError, iniconfig.ParseError) as error:  # tomllib's errors are ValueErrors
        raise ProjectConfigError(f"{path} cannot be read as pytest would read it ({error}). Fix the file, "
                                 "or give the paths by hand (--root, --golden-dir).") from None


def _project(path: Path, values: dict[str, str]) -> Project:
    raw = values.get("llm_golden_dir", "").strip()
    golden_dir = None
    if raw:
        golden_dir = Path(os.path.abspath(path.parent / Path(raw).expanduser()))  # relative to the file
    return Project(path, path.parent, golden_dir)


def settle(root: Path | None, golden_dir: Path | None) -> Settled:
    """What a command uses: ``--root`` and ``--golden-dir`` where given, else the project's, found
    from ``--root`` or from here."""
    found = find(root if root is not None else Path.cwd())
    root = root if root is not None else _short(found.rootdir)
    source = "no pytest configuration file here or above" if found.config_file is None else \
        str(_short(found.config_file))
    if golden_dir is not None:
        return Settled(root, golden_dir, False, f"{source} (root {root}); --golden-dir {golden_dir} as given")
    if found.golden_dir is None:
        return Settled(root, None, False, f"{source} (root {root}): no llm_golden_dir, goldens in __golden__ "
                       "folders beside their tests")
    try:
        relative = found.golden_dir.relative_to(os.path.abspath(root))
    except ValueError:
        relative = found.golden_dir
    return Settled(root, relative, True, f"{source} (root {root}): llm_golden_dir = {relative}")


def _short(path: Path) -> Path:
    """``path`` relative to here where it lies inside it, as a user would type it."""
    try:
        return path.relative_to(Path.cwd()) if path != Path.cwd() else Path(".")
    except ValueError:
        return path


def settle_for(command: str, root: Path | None, golden_dir: Path | None) -> Settled | None:
    """:func:`settle` for ``llm-golden COMMAND``: the configuration line printed, or the reason it
    cannot be read printed (the caller exits 2) and None."""
    try:
        settled = settle(root, golden_dir)
    except ProjectConfigError as error:
        print(f"llm-golden {command}: {error}", file=sys.stderr)
        return None
    print(f"configuration: {settled.line}")
    return settled
