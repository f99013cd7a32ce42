"""The run's settings as pytest holds them, read once into a frozen :class:`~.options.Options`.

A command-line option overrides its ini twin. At start-up, before conftests are imported, the
configuration file's keys are read from ``config.inipath`` (pytest has no public view of them) so
that an ``llm_*`` key nobody declared stops the run, naming the closest real one.
"""

from __future__ import annotations

import difflib
import itertools
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.compute import numerics, threads
from pytest_llmdeterminism.engines.registry import entry_of
from pytest_llmdeterminism.engines.spec import engine_of
from pytest_llmdeterminism.errors import NO_VALUE, ConfigurationError
from pytest_llmdeterminism.judge.tolerance import ToleranceSetting, parse_setting
from pytest_llmdeterminism.reporting import documents
from pytest_llmdeterminism.run.options import (
    DEFAULT_BATCH_SHAPE,
    DEFAULT_MAX_NEW_TOKENS,
    FLAGS,
    PLANT_DEFECT_VARIABLE,
    SETTINGS,
    Options,
    UpdateMode,
    parse_boolean,
    parse_device,
    parse_integer,
    parse_one_of,
    parse_seed,
    parse_threads,
    resolve_model_spec,
    resolve_path,
)
from pytest_llmdeterminism.shape import DTYPES, BatchShape

if TYPE_CHECKING:
    from collections.abc import Callable

    import pytest

_PATH_FLAGS = ("--llm-model", "--llm-golden-dir", "--llm-golden-artifacts", "--llm-report", "--llm-repro")


def _require_equals_for_paths(args: list[str]) -> None:
    """pytest picks its rootdir and ini file from the command line's existing paths before plugin
    options are parsed, so ``--llm-model DIR`` makes DIR look like a test path and the project's
    ini file silently goes unread. ``--llm-model=DIR`` is unambiguous."""
    for flag, following in itertools.pairwise(args):
        if flag in _PATH_FLAGS and not following.startswith("-"):
            raise ConfigurationError(
                flag, following,
                f"write {flag}={following} (with '='): with a space pytest reads {following!r} as a "
                "test path when it looks for your pytest.ini / pyproject.toml, and ignores them",
            )


def read(config: pytest.Config) -> Options:
    def value(ini: str) -> str | None:
        cli = config.getoption(ini)
        raw = cli if cli is not None else config.getini(ini)
        return str(raw).strip() if raw not in (None, "") else None

    _require_equals_for_paths([str(a) for a in config.invocation_params.args])
    rootdir = Path(config.rootpath)
    golden_dir = resolve_path("llm_golden_dir", value("llm_golden_dir"), config)
    model = resolve_model_spec(value("llm_model"), config)
    return Options(
        model=model,
        golden_dir=Path(golden_dir).resolve() if golden_dir else None,
        batch_shape=BatchShape.parse(value("llm_batch_shape") or DEFAULT_BATCH_SHAPE),
        dtype=parse_one_of("llm_dtype", value("llm_dtype") or "float32", DTYPES),
        device=parse_device(value("llm_device") or "auto"),
        seed=parse_seed("llm_seed", value("llm_seed")),
        max_new_tokens=parse_integer("llm_max_new_tokens", value("llm_max_new_tokens"),
                                     DEFAULT_MAX_NEW_TOKENS, minimum=1),
        cpu_numerics=numerics.parse_mode(value("llm_cpu_numerics")),
        update=_update_mode_allowed(config),
        plant_defect=_plant_defect(config, model),
        tolerance=parse_setting(value("llm_tolerance") or "", setting="llm_tolerance")
        if value("llm_tolerance") else ToleranceSetting({}),
        golden_fallback=bool(config.getoption("llm_golden_fallback")),
        audit=config.getoption("llm_audit"),
        audit_dtype=config.getoption("llm_audit_dtype"),
        prune=config.getoption("llm_golden_prune"),
        artifacts=Path(config.invocation_params.dir, config.getoption("llm_golden_artifacts"))
        if config.getoption("llm_golden_artifacts") else None,
        repro=Path(config.invocation_params.dir, config.getoption("llm_repro"))
        if config.getoption("llm_repro") else None,
        settings_in_force=settings_in_force(value, rootdir, model=model, golden_dir=golden_dir),
        partial=partial_run_reasons(config),
        reports=_reports(config.getoption("llm_report"), Path(config.invocation_params.dir)),
        rootdir=rootdir,
        invocation_dir=Path(config.invocation_params.dir),
        cli_settings=tuple(f"{s.flag}={config.getoption(s.ini)}" for s in SETTINGS
                           if config.getoption(s.ini) is not None),
        threads=parse_threads(value("llm_threads")),
        xdist_workers=xdist_workers(config),
        # unset: None, batch-invariant kernels wherever they run (engines.load chooses)
        batch_invariant=None if value("llm_batch_invariant") is None
        else parse_boolean("llm_batch_invariant", value("llm_batch_invariant")),
        server_checks=parse_boolean("llm_server_checks", value("llm_server_checks")),
    )


def settings_in_force(value: Callable[[str], str | None], rootdir: Path, *, model: str | None,
                      golden_dir: str | None) -> tuple[tuple[str, str], ...]:
    """Every setting whose value in force (command line, else ini) is not its default, as ``(ini name,
    value)``; the model and golden folder as resolved, relative to ``rootdir`` where inside it, so
    that a command run from the rootdir finds them in any checkout."""
    resolved = {"llm_model": model, "llm_golden_dir": golden_dir}
    found = []
    for setting in SETTINGS:
        raw = value(setting.ini)
        if raw is None or raw == setting.default:
            continue
        path = resolved.get(setting.ini, raw) or raw
        if setting.ini in resolved and Path(path).is_absolute():
            path = os.path.normpath(path)
            inside = Path(path).is_relative_to(rootdir) and path != str(rootdir)
            path = Path(path).relative_to(rootdir).as_posix() if inside else path
        found.append((setting.ini, path))
    return tuple(found)


def xdist_workers(config: pytest.Config) -> int | None:
    """How many pytest-xdist workers this process starts (``-n N``, ``--tx``): None without xdist
    and in a worker."""
    if hasattr(config, "workerinput") or config.getoption("dist", "no") == "no":
        return None
    specs = (str(spec).partition("*") for spec in config.getoption("tx", None) or ())
    count = sum(int(times) if star and times.isdigit() else 1 for times, star, _ in specs)  # --tx 3*popen
    return count or None


def auto_workers(config: pytest.Config) -> tuple[int, str] | None:
    """What ``-n auto`` starts in a project whose tests get their model from the plugin
    (``llm_model``), on the CPU (transformers or llama.cpp in process), and the header's line saying
    so; None where xdist's own count stands (no ``llm_model``, a GPU or a server,
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` set)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    namespace = config.known_args_namespace
    model = str(getattr(namespace, "llm_model", None) or config.getini("llm_model") or "").strip()
    device = str(getattr(namespace, "llm_device", None) or config.getini("llm_device") or "auto")
    if not model or not entry_of(model).shares_cpu_cores or not _on_the_cpu(device.strip()):
        return None
    cores = threads.usable_cores()
    workers = threads.auto_workers(cores)
    if workers:
        share = threads.share(cores, workers)
        return workers, f"llm: -n auto starts {workers} workers of {share} threads ({cores} cores)"
    return 0, (f"llm: -n auto runs the tests in this process: {cores} core{'s' if cores != 1 else ''}, and a "
               f"worker per {threads.AUTO_WORKER_CORES} cores pays from {2 * threads.AUTO_WORKER_CORES} on "
               "(each worker loads its own model); choose a count with -n N")


def _on_the_cpu(device: str) -> bool:
    """Whether ``llm_device`` puts the model on the CPU; ``auto`` does without a GPU (an NVIDIA device
    node on Linux, Apple silicon's MPS), told without importing torch."""
    if device != "auto":
        return device == "cpu"
    import glob
    import platform

    apple = platform.system() == "Darwin" and platform.machine() == "arm64"
    return not apple and not glob.glob("/dev/nvidia[0-9]*")


def _reports(given: list[str], base: Path) -> tuple[Path, ...]:
    # as given, not resolved: a link to the report is checked where it is written (atomic.link_out)
    paths = tuple(dict.fromkeys(Path(os.path.abspath(base / path)) for path in given))
    twice = documents.repeated_format(paths)
    if twice:
        example = "e.g. --llm-report=llm.json --llm-report=llm.html"
        raise ConfigurationError("--llm-report", given, f"two {twice} reports; give one path per format "
                                 f"({documents.suffixes(None)}), {example}")
    return paths


def check_names(config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """``llm_*`` ini keys and ``--llm-*`` options that no plugin or conftest declared stop the run
    once, naming the closest real one (pytest alone would warn about the ini key and fail every test
    with "no model"). Call it after conftests have loaded."""
    known_ini = [setting.ini for setting in SETTINGS]
    for key, raw in ini_values(config).items():
        if key.startswith("llm_") and not _declared_ini(config, key):
            close = difflib.get_close_matches(key, known_ini, n=1, cutoff=0.75)
            hint = f"did you mean {close[0]!r}?" if close else "known keys: " + ", ".join(known_ini)
            raise ConfigurationError(key, raw, f"not a pytest-llmdeterminism ini setting; {hint}")
    _, unknown = parser.parse_known_and_unknown_args(args)
    for arg in map(str, unknown):
        flag, _, raw = arg.partition("=")
        if flag.startswith("--llm"):
            raise ConfigurationError(flag, raw or NO_VALUE, f"no such option; {_closest_flag(flag)}")


def _closest_flag(flag: str) -> str:
    """A truncated name (pytest takes no abbreviations) or a misspelled one: the real option it means."""
    extended = sorted((name for name in FLAGS if name.startswith(flag)), key=len)
    if extended and (len(extended) == 1 or len(extended[0]) - len(flag) <= 3):
        return f"did you mean {extended[0]}? (pytest does not accept abbreviated options)"
    close = extended or difflib.get_close_matches(flag, FLAGS, n=3, cutoff=0.75)
    if close:
        return f"did you mean {' or '.join(close[:3])}?"
    return "see pytest --help for the --llm-* options"


def _declared_ini(config: pytest.Config, key: str) -> bool:
    try:
        config.getini(key)
    except ValueError:  # pytest's answer for a key no plugin or conftest declared
        return False
    return True


def ini_values(config: pytest.Config) -> dict[str, str]:
    """The keys and raw values of the configuration file pytest chose (``config.inipath``), then of
    its ``-o KEY=VALUE`` overrides: what the project wrote, whether a plugin declared it or not.

    ``config.getini`` answers only for declared keys, so the file is read here with the parsers
    pytest reads it with: ``iniconfig`` for .ini and .cfg, ``tomllib`` (``tomli`` before Python
    3.11, a dependency of pytest there) for .toml, in the section each kind of file keeps pytest's
    settings in.
    """
    values = {} if config.inipath is None else config_file_values(Path(config.inipath)) or {}
    # The early namespace: at start-up, before conftests, config.option is not filled in yet.
    for override in getattr(config.known_args_namespace, "override_ini", None) or ():
        key, equals, value = str(override).partition("=")
        if equals:  # pytest itself refuses an override without '='
            values[key] = value
    return values


def config_file_values(path: Path) -> dict[str, str] | None:
    """The pytest settings in configuration file ``path``, or None when it holds none that pytest
    would use it for: a ``pyproject.toml`` without ``[tool.pytest…]``, a ``tox.ini`` without
    ``[pytest]``, a ``setup.cfg`` without ``[tool:pytest]`` (``pytest.ini`` and ``pytest.toml``
    always count, as for pytest)."""
    dedicated = path.name in ("pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml")
    if path.suffix == ".toml":
        document = _toml_document(path)
        tool = document.get("tool", {}).get("pytest")
        if tool is None and path.name == "pyproject.toml":
            return None
        tool = tool or {}
        table = {**tool.get("ini_options", {}), **{k: v for k, v in tool.items() if k != "ini_options"}}
        if path.name != "pyproject.toml":  # pytest.toml and a -c FILE.toml keep it in [pytest]
            table.update(document.get("pytest", {}))
        return {str(key): str(value) for key, value in table.items()}
    if path.suffix not in (".ini", ".cfg"):
        return None
    import iniconfig

    section = "tool:pytest" if path.suffix == ".cfg" else "pytest"  # setup.cfg: [tool:pytest]
    parsed = iniconfig.IniConfig(str(path))
    if section not in parsed:
        return {} if dedicated else None
    return dict(parsed[section].items())


def _toml_document(path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    with path.open("rb") as file:
        document: dict[str, Any] = tomllib.load(file)
    return document


def early_cpu_numerics(early_config: pytest.Config) -> str:
    """``llm_cpu_numerics`` before conftests load (and before anything can have imported torch)."""
    raw = getattr(early_config.known_args_namespace, "llm_cpu_numerics", None)
    return numerics.parse_mode(raw if raw is not None else str(early_config.getini("llm_cpu_numerics")))


def early_threads(early_config: pytest.Config) -> int | None:
    """``llm_threads`` before conftests load."""
    raw = getattr(early_config.known_args_namespace, "llm_threads", None)
    raw = raw if raw is not None else str(early_config.getini("llm_threads"))
    return parse_threads(raw.strip() or None)


NODE_IDS_GIVEN = "test ids on the command line"  # the rest of the suite was not even collected


def partial_run_reasons(config: pytest.Config) -> tuple[str, ...]:
    """Selections after which some goldens were simply not visited: never judge them unused then."""
    reasons = []
    if config.getoption("keyword", ""):
        reasons.append("-k")
    if config.getoption("markexpr", ""):
        reasons.append("-m")
    if any("::" in str(arg) for arg in config.args):
        reasons.append(NODE_IDS_GIVEN)
    for option, flag in (("lf", "--lf"), ("deselect", "--deselect"), ("stepwise", "--sw")):
        if config.getoption(option, None):
            reasons.append(flag)
    return tuple(reasons)


def running_in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _plant_defect(config: pytest.Config, model: str | None) -> bool:
    """``--llm-plant-defect`` (or ``LLMDET_PLANT_DEFECT=1``): on for a transformers model, and never
    together with an update, which would record the planted defect's outputs as goldens."""
    from_variable = os.environ.get(PLANT_DEFECT_VARIABLE, "").strip() == "1"
    if not (config.getoption("llm_plant_defect") or from_variable):
        return False
    given = f"{PLANT_DEFECT_VARIABLE}=1" if from_variable and not config.getoption("llm_plant_defect") \
        else "--llm-plant-defect"
    update = config.getoption("llm_golden_update")
    if update:
        off = f"unset {PLANT_DEFECT_VARIABLE}" if given != "--llm-plant-defect" else "drop --llm-plant-defect"
        raise ConfigurationError(
            "--llm-golden-update", update,
            f"refused with {given}: the planted defect perturbs the model on purpose, and its outputs "
            f"must never become goldens. Run the negative control without --llm-golden-update; to record "
            f"goldens, {off}",
        )
    engine = engine_of(model) if model is not None else None
    if engine is not None:
        raise ConfigurationError(
            given, NO_VALUE,
            f"llm_model {model!r} runs on the {engine} engine, but the planted defect perturbs a "
            "transformers model's weights in memory, and this engine's weights are out of the test "
            "process's reach. Run the negative control on a perturbed copy instead: llm-golden perturb "
            "SRC DEST --scale 0.5 (a safetensors folder), then serve or load DEST and run without the "
            "planted defect",
        )
    return True


def _update_mode_allowed(config: pytest.Config) -> UpdateMode | None:
    """Goldens are recorded where a person reviews them, not silently by a pipeline."""
    update: UpdateMode | None = config.getoption("llm_golden_update")
    if update and running_in_ci() and not config.getoption("llm_golden_update_in_ci"):
        raise ConfigurationError(
            "--llm-golden-update", update,
            f"refused because CI={os.environ.get('CI')!r} is set: in CI goldens are checked, never "
            "written, so a pipeline cannot approve its own changes. Record them on a development "
            "machine and commit them, or add --llm-golden-update-in-ci to write them here anyway",
        )
    return update


