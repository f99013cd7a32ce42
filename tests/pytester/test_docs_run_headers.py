"""The run headers the docs' pages show: each is the one a run of the page's own configuration prints."""

from __future__ import annotations

import re

import pytest

from tests.helpers import ROOT
from tests.helpers.docs import first_block


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_the_header_a_page_shows_is_the_one_its_own_config_prints(pytester, page):
    """The page's pytest.ini, as the reader just wrote it, prints the header line the page shows."""
    text = (ROOT / page).read_text(encoding="utf-8")
    (shown,) = [line for line in text.splitlines() if line.startswith("llm: model=")]
    pytester.makeini(first_block(text, "ini"))
    pytester.makepyfile(test_capital=first_block(text, "python"))
    result = pytester.runpytest("--collect-only", "-p", "no:randomly")
    assert result.ret == pytest.ExitCode.OK
    printed = [line for line in result.outlines if line.startswith("llm: model=")]
    # The core count is this machine's; the page shows the 2-core machine the docs were written on.
    printed = [re.sub(r"\(\d+ cores\)", "(2 cores)", line) for line in printed]
    assert printed == [shown], f"{page} shows {shown!r}; its own config prints {printed}: update the page"
