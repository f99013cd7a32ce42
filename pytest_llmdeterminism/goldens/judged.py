"""The tolerance each candidate golden was judged with, where the run set one (the test's
``tolerance=`` or ``--llm-tolerance``): a small JSON file beside the candidate file
(``__golden__/test_x.json`` -> ``__golden__/test_x.tolerances``, ``{key: {variant: profile}}``), so
that ``llm-golden diff``, ``review`` and ``accept`` judge each candidate under the profile the run
judged it with. A candidate it does not name was judged by the environment's default, which those
tools compute from the two fingerprints as the run did.

The file is an artifact like the candidates, untrusted: read strictly (a regular file, a size
limit, one profile string per variant, each parsed as the setting is), and one error names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import msgspec

from pytest_llmdeterminism.errors import ConfigurationError, GoldenFileError
from pytest_llmdeterminism.goldens import store
from pytest_llmdeterminism.goldens.atomic import folder_lock, write_text_atomic
from pytest_llmdeterminism.judge.tolerance import Profile, parse_profile

__all__ = ["SUFFIX", "merge", "path_for", "read"]

SUFFIX = ".tolerances"  # not *.json: no walk of a golden folder reads it as a golden file
_MAX_BYTES = 64 * 2**20
_DECODE = msgspec.json.Decoder(dict[str, dict[str, str]])
Tolerances = dict[str, dict[str, str]]  # key -> variant -> the profile as the setting spells it


def path_for(candidate_file: Path) -> Path:
    return candidate_file.with_suffix(SUFFIX)


def read(candidate_file: Path) -> dict[str, dict[str, Profile]]:
    """The profiles the run set for the candidates of ``candidate_file``; {} where it set none."""
    path = path_for(candidate_file)
    fix = (f"Delete {path} to judge every candidate with the environment's default tolerance, or "
           "rerun the tests with --llm-golden-artifacts to write it again")
    try:
        raw = _read_raw(path)
        return {key: {variant: parse_profile(text, setting=f"[{key!r}][{variant!r}]")
                      for variant, text in variants.items()} for key, variants in raw.items()}
    except (store.UnreadableFileError, ConfigurationError) as error:
        raise GoldenFileError(path, f"is no tolerance file of candidates: {error}", fix) from None
    except msgspec.ValidationError as error:
        raise GoldenFileError(path, f"is no tolerance file of candidates ({{key: {{variant: profile}}}}): "
                                    f"{error}", fix) from None


def merge(candidate_file: Path, tolerances: Mapping[str, Mapping[str, str]]) -> None:
    """Record the profile of each ``key``/``variant`` just written to ``candidate_file`` ("": the
    environment's default, recorded as no entry); the file goes when it names none."""
    path = path_for(candidate_file)
    with folder_lock(path):
        try:
            current = _read_raw(path)
        except (store.UnreadableFileError, msgspec.ValidationError):
            current = {}  # an unreadable one is replaced: the run that writes the candidates knows
        for key, variants in tolerances.items():
            for variant, text in variants.items():
                if text:
                    current.setdefault(key, {})[variant] = text
                else:
                    current.get(key, {}).pop(variant, None)
        current = {key: variants for key, variants in current.items() if variants}
        if current:
            text = msgspec.json.format(msgspec.json.encode(current), indent=2).decode()
            write_text_atomic(path, text + "\n")
        else:
            path.unlink(missing_ok=True)


def _read_raw(path: Path) -> Tolerances:
    try:
        data = store.read_regular_file(path, max_bytes=_MAX_BYTES)
    except FileNotFoundError:
        return {}
    try:
        return _DECODE.decode(data)
    except msgspec.DecodeError as error:
        raise msgspec.ValidationError(str(error)) from None
