"""Repro packs (``--llm-repro=DIR``): for every failing golden check, a folder that holds what the
check knew and the one command that reruns it alone.

:func:`plan` decides, purely, each pack's folder and files from the run's records (the ledger's
checks and candidates) and the goldens the checks compared with; :func:`write` writes them, each file
atomically, the entries in the golden files' own format. Under pytest-xdist the controller plans and
writes: the workers' checks and candidates reach it with each test's report.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_llmdeterminism.goldens import atomic, store
from pytest_llmdeterminism.goldens.files import OUTPUT_MARKER, OUTPUT_MARKER_TEXT
from pytest_llmdeterminism.goldens.schema import AnyEntry
from pytest_llmdeterminism.reporting.records import CheckRecord
from pytest_llmdeterminism.run.options import SETTINGS, Options

__all__ = ["Pack", "plan", "rerun_command", "safe_name", "write"]

_FLAG = {setting.ini: setting.flag for setting in SETTINGS}
_NAME_LIMIT = 80  # characters of a test id or key kept in a folder name, before its hash


@dataclass(frozen=True)
class Pack:
    """One failing check's repro pack: its folder (relative to ``--llm-repro``'s) and its files."""

    folder: str
    command: str  # the shell command that reruns the check alone, from the rootdir
    texts: dict[str, str] = field(default_factory=dict)  # file name -> text
    entries: dict[str, tuple[str, str, AnyEntry]] = field(default_factory=dict)  # file -> key, variant, entry
    executable: tuple[str, ...] = ()


def safe_name(text: str) -> str:
    """A folder name for a test id or golden key: letters, digits, ``.``, ``_`` and ``-`` only, at most
    :data:`_NAME_LIMIT` of them; where that changed the text, a hash of it follows, so two ids never
    share a folder."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._-")[:_NAME_LIMIT] or "check"
    if safe == text:
        return safe
    return f"{safe}-{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"


def rerun_command(nodeid: str, options: Options, *, threads: int | None) -> str:
    """``pytest NODEID`` with every setting in force that is not its default, run from the rootdir.
    ``threads``: the thread count the check's generation ran on, pinned with ``--llm-threads``: under
    pytest-xdist each worker took its share of the cores, and the count changes the bits."""
    settings = dict(options.settings_in_force)
    if threads is not None:
        settings["llm_threads"] = str(threads)
    arguments = ["pytest", nodeid, *(f"{_FLAG[ini]}={value}" for ini, value in settings.items())]
    arguments += ["--llm-golden-fallback"] if options.golden_fallback else []
    arguments += ["-n", "0"] if options.xdist_workers is not None else []  # one test: no workers
    return " ".join(shlex.quote(argument) for argument in arguments)


def plan(checks: Iterable[CheckRecord], candidates: Mapping[str, Mapping[str, Mapping[str, AnyEntry]]],
         options: Options, *, golden_file: Callable[[str], Path],
         golden: Callable[[Path, str, str], AnyEntry | None]) -> list[Pack]:
    """A pack per failing check. ``candidates``: the run's new entries (golden file -> key ->
    variant -> entry); ``golden_file``: a test module's golden file; ``golden``: the stored entry of
    (file, key, variant), or None."""
    failing: dict[str, list[CheckRecord]] = {}
    for check in checks:
        if not check.passed:
            failing.setdefault(check.test, []).append(check)
    packs = []
    for nodeid, failed in sorted(failing.items()):
        path = golden_file(nodeid.partition("::")[0])
        for check in failed:
            folder = safe_name(nodeid) + (f"/{safe_name(check.name)}" if len(failed) > 1 else "")
            new = candidates.get(str(path), {}).get(check.name, {}).get(check.run_variant or check.variant)
            stored = golden(path, check.name, check.variant) if check.verdict != "MISSING" else None
            packs.append(_pack(folder, nodeid, check, stored, new, options))
    return packs


def _pack(folder: str, nodeid: str, check: CheckRecord, stored: AnyEntry | None, new: AnyEntry | None,
          options: Options) -> Pack:
    shown = new or stored
    threads = shown.fingerprint.get("torch_threads") if shown is not None else None
    command = rerun_command(nodeid, options, threads=threads if isinstance(threads, int) else None)
    run_variant = check.run_variant or check.variant
    entries = {**({"golden.json": (check.name, check.variant, stored)} if stored is not None else {}),
               **({"new.json": (check.name, run_variant, new)} if new is not None else {})}
    texts = {
        "README.txt": _readme(nodeid, check, command, options, entries),
        "rerun.sh": _script(nodeid, check, command, options),
        "settings.json": _json({
            "test": nodeid, "key": check.name, "verdict": check.verdict, "profile": check.profile,
            "golden_variant": check.variant, "run_variant": run_variant,
            "batch_shape": shown.batch_shape if shown is not None else None,
            "generation_config": shown.generation_config if shown is not None else None,
            "settings_in_force": dict(options.settings_in_force), "threads": threads,
            "command": command,
        }),
        "fingerprint.json": _json({
            "golden": stored.fingerprint if stored is not None else None,
            "run": new.fingerprint if new is not None else None,
            "changed": {name: list(pair) for name, pair in check.changed_fingerprint.items()},
        }),
        "prompt.json": _prompts({"run": new, "golden": stored}),
    }
    return Pack(folder, command, texts, entries, executable=("rerun.sh",))


def _readme(nodeid: str, check: CheckRecord, command: str, options: Options,
            entries: Mapping[str, tuple[str, str, AnyEntry]]) -> str:
    profile = f" under {check.profile!r}" if check.profile else ""
    files = [
        ("rerun.sh", "the command below, run in PROJECT_ROOT: sh rerun.sh [PROJECT_ROOT] (default: the "
                     "run's rootdir where it exists, else the current folder)"),
        *((name, f"{'the golden' if name == 'golden.json' else 'this run'}'s entry [{key!r}][{variant!r}], "
                 "in the golden files' format") for name, (key, variant, _) in entries.items()),
        ("fingerprint.json", "both environments: the golden's (\"golden\"), this run's (\"run\"), and "
                             "the fields that differ (\"changed\")"),
        ("prompt.json", "the prompt as the model saw it, and its token ids"),
        ("settings.json", "the generation settings, the run's settings in force and the verdict"),
    ]
    absent = ([] if "golden.json" in entries else
              ["golden.json: none (the check had no golden)" if check.verdict == "MISSING" else
               "golden.json: the golden could not be read at the end of the run"]) + \
             ([] if "new.json" in entries else ["new.json: none (this verdict keeps no candidate)"])
    return "\n".join([
        f"Golden check {check.name!r} of {nodeid} failed: {check.verdict}{profile}.",
        "",
        f"Rerun this check alone from the project's root (this run's: {options.rootdir}):",
        "",
        f"    {command}",
        "",
        "Files:",
        *(f"  {name:<17} {what}" for name, what in files),
        *(f"  {line}" for line in absent),
        "",
    ])


def _script(nodeid: str, check: CheckRecord, command: str, options: Options) -> str:
    root = shlex.quote(str(options.rootdir))
    return "\n".join([
        "#!/bin/sh",
        f"# Reruns golden check {check.name!r} ({check.verdict}) of {nodeid!r} alone, with the settings in",
        "# force when it failed, from the project's root: the folder given (sh rerun.sh PROJECT_ROOT), else",
        "# the run's rootdir where it exists (this machine), else the current folder (another machine).",
        f'if [ "$#" -gt 0 ]; then cd "$1" || exit; elif [ -d {root} ]; then cd {root} || exit; fi',
        f"exec {command}",
        "",
    ])


def _prompts(entries: Mapping[str, AnyEntry | None]) -> str:
    """Each side's prompt, its form and its token ids, the ids on one line."""
    sides = [f'  {json.dumps(side)}: {{\n    "prompt": {json.dumps(entry.prompt, ensure_ascii=False)},\n'
             f'    "prompt_form": {json.dumps(entry.prompt_form)},\n'
             f'    "prompt_token_ids": {json.dumps(list(entry.prompt_token_ids))}\n  }}'
             for side, entry in entries.items() if entry is not None]
    return "{\n" + ",\n".join(sides) + "\n}\n"


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False) + "\n"


def write(packs: Iterable[Pack], folder: Path, *, rootdir: Path) -> tuple[list[Path], list[str]]:
    """Write each pack under ``folder`` (its files replaced atomically; nothing else there is
    touched), and the marker that keeps golden walks out of it; returns the pack folders written and
    a line per pack that could not be. No file is written through a symbolic link that leads out of
    ``folder`` (out of ``rootdir`` where ``folder`` lies in it), and every file gets a new file's mode
    (``rerun.sh`` executable), whatever was there."""
    home = [atomic.output_home(folder, rootdir)]
    written, errors = [], []
    packs = list(packs)
    if packs:
        marker = folder / OUTPUT_MARKER
        try:
            atomic.refuse_link_out(marker, home, what="repro packs")
            atomic.write_text_atomic(marker, OUTPUT_MARKER_TEXT.format(flag="--llm-repro"))
        except Exception as error:  # noqa: BLE001 - reported in the summary, run marked failed
            errors.append(f"{marker}: {type(error).__name__}: {error}")
    for pack in packs:
        target = folder / pack.folder
        try:
            for name in [*pack.entries, *pack.texts]:  # all refused before any is written
                atomic.refuse_link_out(target / name, home, what="repro packs")
            for name, (key, variant, entry) in pack.entries.items():
                store.write(target / name, {key: {variant: entry}})
            for name, text in pack.texts.items():
                executable = 0o111 & ~atomic.umask() if name in pack.executable else 0
                atomic.write_text_atomic(target / name, text, mode=atomic.new_file_mode() | executable)
        except Exception as error:  # noqa: BLE001 - reported in the summary, run marked failed
            errors.append(f"{target}: {type(error).__name__}: {error}")
        else:
            written.append(target)
    return written, errors
