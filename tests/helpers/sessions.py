"""Several pytest sessions, one after another, in one child Python (``pytest.main`` in turn).

A child ``python -m pytest`` of a small project spends most of its time starting: importing torch and
transformers and loading the model (natively ~4 s of a ~5 s run; under qemu ~20 s of ~35 s). Runs that
need the same process-wide settings (numerics mode, CPU, environment) can share one child: each
session runs from its own project folder, its test modules and path entry are forgotten before the
next, and its exit status follows its output. Runs that must differ in those settings, or that test a
fresh process as such (signals, crashes, xdist), keep their own child. A probe script runs as a
session of its own too (:func:`script_project`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

SESSION_END = "=== llmdet session exit"
SCRIPT = f"""
import json, os, sys
import pytest
for cwd, args in json.loads(sys.argv[1]):
    os.chdir(cwd)
    code = pytest.main(args)
    for name, module in list(sys.modules.items()):
        if (getattr(module, "__file__", None) or "").startswith(cwd + os.sep):
            del sys.modules[name]
    sys.path[:] = [entry for entry in sys.path if entry != cwd]
    print("\\n{SESSION_END}", int(code), flush=True)
"""


def command(python: Sequence[str], sessions: Sequence[tuple[Path, Sequence[str]]]) -> list[str]:
    """The command line that runs ``sessions`` ((project folder, pytest arguments), in order) in
    ``python`` (the interpreter's command: a path, or qemu and a path)."""
    return [*python, "-c", SCRIPT, json.dumps([[str(path), list(args)] for path, args in sessions])]


def split(output: str) -> tuple[list[str], list[int]]:
    """Each finished session's output and exit status, in order."""
    parts = re.split(rf"^{SESSION_END} (-?\d+)$", output, flags=re.MULTILINE)
    return parts[0:-1:2], [int(code) for code in parts[1::2]]


# A script run as a session's one test: with its command line, its printed lines kept in a file.
SCRIPT_TEST = """
import contextlib, io, pathlib, runpy, sys

def test_script():
    printed, argv = io.StringIO(), sys.argv
    sys.argv = [{script!r}, *{argv!r}]
    try:
        with contextlib.redirect_stdout(printed):
            runpy.run_path({script!r})
    except SystemExit as end:  # a script's own end
        assert end.code in (0, None), printed.getvalue()
    finally:
        sys.argv = argv
        pathlib.Path({printed!r}).write_text(printed.getvalue())
"""


def script_project(folder: Path, script: Path, *argv: str) -> Path:
    """A project folder whose one test runs ``script`` with ``argv`` (run it as a session, after runs
    that need the same process-wide settings: one start fewer); what the script printed lands in the
    file returned."""
    folder.mkdir()
    (folder / "pytest.ini").write_text("[pytest]\n")
    printed = folder / "printed.txt"
    (folder / "test_script.py").write_text(SCRIPT_TEST.format(script=str(script), argv=list(argv),
                                                              printed=str(printed)))
    return printed
