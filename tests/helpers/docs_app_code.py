"""docs/writing-tests.md's section "Testing your app's own generation code", as files
(test_docs_app_code.py, test_docs_app_code_runs.py)."""

import re

from tests.helpers import ROOT

PAGE = ROOT / "docs" / "writing-tests.md"
SECTION = "## Testing your app's own generation code"


def section_files() -> dict[str, str]:
    """The section's code blocks that name their file (```python title="myapp.py"), by file name."""
    text = PAGE.read_text(encoding="utf-8").split(SECTION, 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r'```\w+ title="([^"]+)"\n(.*?)```', text, re.DOTALL))

