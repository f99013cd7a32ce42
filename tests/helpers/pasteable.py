"""The README's and the docs' config blocks (test_pasteable.py, test_pasteable_runs.py)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import ROOT

README = ROOT / "README.md"


def config_blocks(path: Path) -> list[tuple[str, str]]:
    """(language, text) of every ```ini and ```toml block in a Markdown file."""
    text = path.read_text(encoding="utf-8")
    return re.findall(r"^```(ini|toml)\n(.*?)^```", text, re.MULTILINE | re.DOTALL)

