"""Where golden files live, how they are shown to the user, and each file read once per run."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from pytest_llmdeterminism.goldens import schema, store

GOLDEN_FOLDER = "__golden__"


class GoldenFiles:
    def __init__(self, golden_dir: Path | None, rootdir: Path, invocation_dir: Path) -> None:
        self._golden_dir = golden_dir
        self._rootdir = rootdir
        self._invocation_dir = invocation_dir
        self._read: dict[Path, schema.Goldens] = {}

    def path_for(self, test_path: Path) -> Path:
        """The golden file of a test file: beside it in ``__golden__/``, or mirrored under llm_golden_dir."""
        if self._golden_dir is None:
            return test_path.parent / GOLDEN_FOLDER / f"{test_path.stem}.json"
        return self._golden_dir / self.under_root(test_path).with_suffix(".json")

    def path_for_nodeid(self, module: str) -> Path:
        return self.path_for(self._rootdir / module)

    def under_root(self, path: Path) -> Path:
        """``path`` relative to the rootdir, or just its name when it lies outside."""
        try:
            return path.relative_to(self._rootdir)
        except ValueError:
            return Path(path.name)

    def portable(self, path: Path) -> str:
        """``path`` as another machine's checkout names it: relative to the rootdir (absolute outside it)."""
        try:
            return path.relative_to(self._rootdir).as_posix()
        except ValueError:
            return path.as_posix()

    def display(self, path: Path) -> str:
        """``path`` as the user would type it from where pytest was started."""
        relative = os.path.relpath(path, self._invocation_dir)
        return path.as_posix() if relative.startswith("..") else relative

    def read(self, path: Path) -> schema.Goldens:
        """The goldens in ``path`` (empty when it does not exist); a bad file raises GoldenFileError."""
        __tracebackhide__ = True
        if path not in self._read:
            self._read[path] = store.read(path)
        return self._read[path]


def fallback_variant(wanted: str, variants: Iterable[str]) -> str | None:
    """Another variant to compare with: same device class first, then same dtype, then any."""
    device, _, dtype = wanted.partition("/")
    candidates = sorted(variants)
    for prefer in (lambda v: v.startswith(f"{device}/"), lambda v: v.endswith(f"/{dtype}"), lambda v: True):
        match = next((v for v in candidates if prefer(v)), None)
        if match is not None:
            return match
    return None
