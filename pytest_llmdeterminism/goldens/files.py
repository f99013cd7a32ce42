"""Where golden files live, how they are shown to the user, each file read once per run, and a
check's golden looked up in them (as a :class:`~pytest_llmdeterminism.generation.Generation`)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pytest_llmdeterminism.generation import Generation, Score
from pytest_llmdeterminism.goldens import schema, store
from pytest_llmdeterminism.goldens.atomic import inside as _inside
from pytest_llmdeterminism.goldens.atomic import link_out

GOLDEN_FOLDER = "__golden__"
# A folder the plugin writes its output into (``--llm-repro``: entries in the golden format beside
# other JSON) holds this file; no walk for golden files (``llm-golden diff``, ``accept``) enters a
# folder that does, as none enters a virtual environment (``pyvenv.cfg``).
OUTPUT_MARKER = "LLM-OUTPUT.txt"
OUTPUT_MARKER_TEXT = ("pytest-llmdeterminism wrote this folder ({flag}). llm-golden diff and accept do not "
                      "walk a folder holding this file: what it holds are no goldens of the project.\n")


@dataclass(frozen=True)
class Found:
    """What a check's look-up found: the ``variant`` to compare with (the generation's own, or another
    one under ``llm_golden_fallback``), its ``golden`` (None: the key has no such variant) and every
    variant the key has, sorted."""

    variant: str
    golden: Generation | Score | None
    variants: tuple[str, ...]


class GoldenFiles:
    def __init__(self, golden_dir: Path | None, rootdir: Path, invocation_dir: Path) -> None:
        self._golden_dir = golden_dir
        self._rootdir = rootdir
        self._invocation_dir = invocation_dir
        self._read: dict[Path, schema.Goldens] = {}
        self._generations: dict[tuple[Path, str, str], Generation | Score] = {}  # entries read as generations

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

    def describe_location(self) -> str:
        """Where this project keeps golden files, in words."""
        if self._golden_dir is None:
            return f"beside each test module in {GOLDEN_FOLDER}/, as no llm_golden_dir is set"
        return f"under llm_golden_dir = {self.portable(self._golden_dir)}"

    def link_out(self, path: Path) -> str | None:
        """Why a golden file may not be written or pruned at ``path``: a symbolic link on the way
        leads out of the places goldens live (the rootdir, and llm_golden_dir where it lies outside
        it). None when it stays inside."""
        homes = [self._rootdir]
        if self._golden_dir is not None and not _inside(self._golden_dir, self._rootdir):
            homes.append(self._golden_dir)  # configured to live elsewhere: that folder is theirs too
        return link_out(path, homes)

    def read(self, path: Path) -> schema.Goldens:
        """The goldens in ``path`` (empty when it does not exist); a bad file raises GoldenFileError."""
        __tracebackhide__ = True
        if path not in self._read:
            self._read[path] = store.read(path)
        return self._read[path]

    def look_up(self, path: Path, key: str, variant: str, *, fallback: bool) -> Found:
        """Golden ``key`` of ``path`` for a generation of ``variant``: that variant's entry, or with
        ``fallback`` another of the key's variants (:func:`fallback_variant`) where it has none. The
        entry was validated when its file was parsed; it is read as a :class:`Generation` (a score
        entry as a :class:`Score`) once a run."""
        __tracebackhide__ = True
        variants = self.read(path).get(key, {})
        if variant not in variants and fallback:
            variant = fallback_variant(variant, variants) or variant
        entry = variants.get(variant)
        if entry is None:
            return Found(variant, None, tuple(sorted(variants)))
        golden = self._generations.get((path, key, variant))
        if golden is None:
            golden = self._generations[path, key, variant] = schema.from_entry(entry)
        return Found(variant, golden, tuple(sorted(variants)))


def fallback_variant(wanted: str, variants: Iterable[str]) -> str | None:
    """Another variant to compare with: same device class first, then same dtype, then any."""
    device, _, dtype = wanted.partition("/")
    candidates = sorted(variants)
    for prefer in (lambda v: v.startswith(f"{device}/"), lambda v: v.endswith(f"/{dtype}"), lambda v: True):
        match = next((v for v in candidates if prefer(v)), None)
        if match is not None:
            return match
    return None
