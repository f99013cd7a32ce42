"""Every option and ini name, declared once, read once into a frozen :class:`Options`.

A command-line option overrides its ini twin. Bad values stop pytest at start-up with a usage
error that names the setting and shows a valid example.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pytest_llmdeterminism.engines import numerics
from pytest_llmdeterminism.engines.spec import BUILTIN_PREFIX, refuse_credentials, with_local_paths
from pytest_llmdeterminism.errors import NO_VALUE, ConfigurationError
from pytest_llmdeterminism.shape import DTYPES, BatchShape
from pytest_llmdeterminism.tolerance import ToleranceSetting, parse_setting

if TYPE_CHECKING:
    import pytest

DEFAULT_BATCH_SHAPE = "1x128"
DEFAULT_MAX_NEW_TOKENS = 32
DEFAULT_SEED = 0
UpdateMode = Literal["all", "new"]


@dataclass(frozen=True)
class Options:
    model: str | None
    golden_dir: Path | None
    batch_shape: BatchShape
    dtype: str
    device: str
    seed: int
    max_new_tokens: int
    cpu_numerics: str  # numerics.PORTABLE or numerics.NATIVE
    update: UpdateMode | None
    tolerance: ToleranceSetting
    golden_fallback: bool
    audit: int | None  # repeats per audited generation, or None when --llm-audit is off
    audit_dtype: str | None
    reports: tuple[Path, ...]  # --llm-report, each .json, .md or .html
    artifacts: Path | None
    prune: bool
    partial: tuple[str, ...]  # why this run does not see every test (then unused goldens are not judged)
    rootdir: Path
    invocation_dir: Path
    cli_settings: tuple[str, ...] = ()  # the --llm-* settings given on the command line, as typed


@dataclass(frozen=True)
class _Setting:
    ini: str
    flag: str
    help: str
    default: str | None


SETTINGS = (
    _Setting("llm_model", "--llm-model",
             "model under test: a local transformers folder, a .gguf file, or builtin:tiny", None),
    _Setting("llm_golden_dir", "--llm-golden-dir",
             "folder for golden files (default: a __golden__ folder beside each test file)", None),
    _Setting("llm_batch_shape", "--llm-batch-shape",
             f"BxL: the one batch shape every generation runs in (default {DEFAULT_BATCH_SHAPE})",
             DEFAULT_BATCH_SHAPE),
    _Setting("llm_dtype", "--llm-dtype", f"model dtype, one of {', '.join(DTYPES)} (default float32)",
             "float32"),
    _Setting("llm_device", "--llm-device", "torch device: auto, cpu, mps, cuda or cuda:N (default auto)",
             "auto"),
    _Setting("llm_seed", "--llm-seed", f"seed set before every deterministic test (default {DEFAULT_SEED})",
             str(DEFAULT_SEED)),
    _Setting("llm_tolerance", "--llm-tolerance",
             "tolerance profile: exact, tokens, close(atol=...), near_tie(margin=..., atol=...), or "
             "'cpu: exact, cuda: near_tie(...)' (default: exact on CPU, near_tie scaled by dtype elsewhere)",
             None),
    _Setting("llm_max_new_tokens", "--llm-max-new-tokens",
             f"new tokens per generation unless a test says otherwise (default {DEFAULT_MAX_NEW_TOKENS})",
             str(DEFAULT_MAX_NEW_TOKENS)),
    _Setting("llm_cpu_numerics", "--llm-cpu-numerics",
             "portable (default): CPU kernels that give the same bits on any x86-64 CPU and thread count; "
             "native: the CPU's fastest kernels, goldens specific to the CPU model and thread count",
             numerics.DEFAULT_MODE),
)


def _update_mode(value: str) -> str:
    if value in ("all", "new"):
        return value
    raise argparse.ArgumentTypeError(
        f"expected 'all' or 'new', got {value!r}. To update and name test paths, write "
        "'--llm-golden-update=all PATH' (or put PATH before the flag)."
    )


def _audit_repeats(value: str) -> int:
    if value.isdigit() and int(value) >= 2:
        return int(value)
    raise argparse.ArgumentTypeError(
        f"expected a number of repeats >= 2, got {value!r}. To audit and name test paths, write "
        "'--llm-audit=5 PATH' (or put PATH before the flag)."
    )


def _report_path(value: str) -> str:
    if Path(value).suffix in (".json", ".md", ".html"):
        return value
    raise argparse.ArgumentTypeError(f"expected a path ending in .json, .md or .html, got {value!r}")


FLAGS: list[str] = []  # every --llm-* option, filled by register()


def register(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmdeterminism", "LLM output regression testing (pytest-llmdeterminism)")
    original = group.addoption

    def addoption(*names: str, **attrs: object) -> None:
        FLAGS.extend(name for name in names if name not in FLAGS)
        original(*names, **attrs)

    group.addoption = addoption  # type: ignore[method-assign]
    for setting in SETTINGS:
        group.addoption(setting.flag, dest=setting.ini, default=None, help=setting.help)
        parser.addini(setting.ini, setting.help, default=setting.default)
    group.addoption(
        "--llm-golden-update", dest="llm_golden_update", nargs="?", const="all", default=None,
        type=_update_mode, metavar="all|new",
        help="record goldens: 'all' (default) writes missing and failing ones, 'new' only missing ones",
    )
    group.addoption(
        "--llm-report", dest="llm_report", action="append", default=[], metavar="PATH", type=_report_path,
        help="write a report of every golden check: .json (machine-readable), .md (pull-request comment) or "
             ".html (for reviewers); repeat the option for several",
    )
    group.addoption(
        "--llm-golden-artifacts", dest="llm_golden_artifacts", default=None, metavar="DIR",
        help="write the candidate golden of every missing or failing check under DIR (e.g. for a CI "
             "artifact); review, then import them with: llm-golden accept DIR",
    )
    group.addoption(
        "--llm-golden-prune", dest="llm_golden_prune", action="store_true", default=False,
        help="after a complete run in which every test passed, delete goldens that no test checked",
    )
    group.addoption(
        "--llm-golden-update-in-ci", dest="llm_golden_update_in_ci", action="store_true", default=False,
        help="allow --llm-golden-update when the CI environment variable is set (refused otherwise)",
    )
    group.addoption(
        "--llm-audit", dest="llm_audit", nargs="?", const=5, default=None, type=_audit_repeats, metavar="N",
        help="audit every deterministic generation: repeat it N times (default 5) and re-run it at another "
             "batch size, padding, cache setting and thread count; report what changed the result",
    )
    group.addoption(
        "--llm-audit-dtype", dest="llm_audit_dtype", default=None, choices=DTYPES,
        help="with --llm-audit, also re-run each generation in this dtype",
    )
    group.addoption(
        "--llm-golden-fallback", dest="llm_golden_fallback", action="store_true", default=False,
        help="when a test has no golden for this device class and dtype, compare with another variant",
    )


_PATH_FLAGS = ("--llm-model", "--llm-golden-dir", "--llm-golden-artifacts", "--llm-report")


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
    golden_dir = _path_setting("llm_golden_dir", value("llm_golden_dir"), config)
    return Options(
        model=_model_spec(value("llm_model"), config),
        golden_dir=Path(golden_dir).resolve() if golden_dir else None,
        batch_shape=BatchShape.parse(value("llm_batch_shape") or DEFAULT_BATCH_SHAPE),
        dtype=_choice("llm_dtype", value("llm_dtype") or "float32", DTYPES),
        device=_device(value("llm_device") or "auto"),
        seed=parse_integer("llm_seed", value("llm_seed"), DEFAULT_SEED, minimum=0),
        max_new_tokens=parse_integer("llm_max_new_tokens", value("llm_max_new_tokens"),
                                DEFAULT_MAX_NEW_TOKENS, minimum=1),
        cpu_numerics=numerics.parse_mode(value("llm_cpu_numerics")),
        update=_update_mode_allowed(config),
        tolerance=parse_setting(value("llm_tolerance") or "", setting="llm_tolerance")
        if value("llm_tolerance") else ToleranceSetting({}),
        golden_fallback=bool(config.getoption("llm_golden_fallback")),
        audit=config.getoption("llm_audit"),
        audit_dtype=config.getoption("llm_audit_dtype"),
        prune=bool(config.getoption("llm_golden_prune")),
        artifacts=Path(config.invocation_params.dir, config.getoption("llm_golden_artifacts"))
        if config.getoption("llm_golden_artifacts") else None,
        partial=partial_run_reasons(config),
        reports=_reports(config.getoption("llm_report"), Path(config.invocation_params.dir)),
        rootdir=rootdir,
        invocation_dir=Path(config.invocation_params.dir),
        cli_settings=tuple(f"{s.flag}={config.getoption(s.ini)}" for s in SETTINGS
                           if config.getoption(s.ini) is not None),
    )


def _reports(given: list[str], base: Path) -> tuple[Path, ...]:
    paths = tuple(dict.fromkeys((base / path).resolve() for path in given))
    suffixes = [path.suffix for path in paths]
    twice = sorted({suffix for suffix in suffixes if suffixes.count(suffix) > 1})
    if twice:
        raise ConfigurationError("--llm-report", given, f"two {twice[0]} reports; give one path per format "
                                 "(.json, .md, .html), e.g. --llm-report=llm.json --llm-report=llm.html")
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
    """The ini file's keys and raw values (pytest 9 deprecates the public ``inicfg``; its private twin
    holds the same mapping)."""
    raw = getattr(config, "_inicfg", None)
    if raw is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            raw = getattr(config, "inicfg", None) or {}
    return {str(key): str(getattr(value, "value", value)) for key, value in raw.items()}


def early_cpu_numerics(early_config: pytest.Config) -> str:
    """``llm_cpu_numerics`` before conftests load (and before anything can have imported torch)."""
    raw = getattr(early_config.known_args_namespace, "llm_cpu_numerics", None)
    return numerics.parse_mode(raw if raw is not None else str(early_config.getini("llm_cpu_numerics")))


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


def _model_spec(spec: str | None, config: pytest.Config) -> str | None:
    """The spec with its local paths made absolute: the model path, or an engine's model file and
    (for a server) its tokenizer, after the engine prefix."""
    if spec is None or spec.startswith(BUILTIN_PREFIX):
        return spec
    refuse_credentials(spec)
    return with_local_paths(spec, lambda path: _path_setting("llm_model", path, config) or path)


def _path_setting(name: str, raw: str | None, config: pytest.Config) -> str | None:
    """A path from the command line is relative to where pytest started; one from the ini file is
    relative to that file (as a user reads it); ``~`` is expanded in both."""
    if raw is None:
        return None
    path = Path(raw).expanduser()
    if not path.is_absolute():
        from_ini = config.getoption(name) is None and config.inipath is not None
        base = config.inipath.parent if from_ini and config.inipath else Path(config.invocation_params.dir)
        path = base / path
    return str(path)


def _choice(setting: str, raw: str, choices: tuple[str, ...]) -> str:
    if raw not in choices:
        raise ConfigurationError(setting, raw, f"expected one of {', '.join(choices)}, e.g. '{choices[0]}'")
    return raw


def _device(raw: str) -> str:
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", raw):
        raise ConfigurationError("llm_device", raw, "expected auto, cpu, mps, cuda or cuda:N, e.g. 'cpu'")
    return raw


def parse_integer(setting: str, raw: str | None, default: int, *, minimum: int) -> int:
    if raw is None:
        return default
    try:
        number = int(raw)
    except ValueError:
        number = minimum - 1
    if number < minimum:
        raise ConfigurationError(setting, raw, f"expected an integer >= {minimum}, e.g. '{default}'")
    return number
