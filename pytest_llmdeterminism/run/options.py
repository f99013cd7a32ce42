"""Every option and ini name, declared once: the tables, the frozen :class:`Options` they are read
into, and the parsers of their values.

``SETTINGS`` (an ini key with its command-line twin) and ``COMMAND_LINE_OPTIONS`` (flags alone) are
public: the documentation's options reference is generated from them. Reading them from pytest's
config is :mod:`~pytest_llmdeterminism.run.configuration`'s job. Bad values stop pytest at start-up
with a usage error that names the setting and shows a valid example.
"""

from __future__ import annotations

import argparse
import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pytest_llmdeterminism.engines import numerics
from pytest_llmdeterminism.engines.spec import BUILTIN_PREFIX, refuse_credentials, with_local_paths
from pytest_llmdeterminism.errors import ConfigurationError
from pytest_llmdeterminism.shape import DTYPES, BatchShape
from pytest_llmdeterminism.tolerance import ToleranceSetting

if TYPE_CHECKING:
    import pytest

DEFAULT_BATCH_SHAPE = "1x128"
DEFAULT_MAX_NEW_TOKENS = 32
DEFAULT_SEED = 0
UpdateMode = Literal["all", "new"]
PLANT_DEFECT_VARIABLE = "LLMDET_PLANT_DEFECT"  # =1: --llm-plant-defect, for a CI step's environment


@dataclass(frozen=True)
class Options:
    model: str | None
    golden_dir: Path | None
    batch_shape: BatchShape
    dtype: str
    device: str
    seed: int
    max_new_tokens: int
    cpu_numerics: str  # numerics.MODES: portable, compatible, native
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
    plant_defect: bool = False  # --llm-plant-defect or LLMDET_PLANT_DEFECT=1: the negative control


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
             "'cpu: exact, cuda: near_tie(...)' (default: exact where the golden was recorded with "
             "the same numerics, the dtype's near_tie across environments)",
             None),
    _Setting("llm_max_new_tokens", "--llm-max-new-tokens",
             f"new tokens per generation unless a test says otherwise (default {DEFAULT_MAX_NEW_TOKENS})",
             str(DEFAULT_MAX_NEW_TOKENS)),
    _Setting("llm_cpu_numerics", "--llm-cpu-numerics",
             "portable (default): CPU kernels that give the same bits on every CPU of one architecture "
             "(x86-64 with AVX2, or arm64) at a given thread count; compatible: the same on any x86-64 "
             "CPU, AVX2 or not, prefill about twice as slow; "
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


@dataclass(frozen=True)
class _CommandLineOption:
    flag: str
    dest: str
    help: str
    default: Any
    how: Mapping[str, Any] = field(default_factory=dict)  # argparse's action, nargs, type, ...


COMMAND_LINE_OPTIONS = (
    _CommandLineOption(
        "--llm-golden-update", "llm_golden_update",
        "record goldens: 'all' (default) writes missing and failing ones, 'new' only missing ones",
        None, {"nargs": "?", "const": "all", "type": _update_mode, "metavar": "all|new"},
    ),
    _CommandLineOption(
        "--llm-report", "llm_report",
        "write a report of every golden check: .json (machine-readable), .md (pull-request comment) or "
        ".html (for reviewers); repeat the option for several",
        [], {"action": "append", "metavar": "PATH", "type": _report_path},
    ),
    _CommandLineOption(
        "--llm-golden-artifacts", "llm_golden_artifacts",
        "write the candidate golden of every missing or failing check under DIR (e.g. for a CI "
        "artifact); review, then import them with: llm-golden accept DIR",
        None, {"metavar": "DIR"},
    ),
    _CommandLineOption(
        "--llm-golden-prune", "llm_golden_prune",
        "after a complete run in which every test passed, delete goldens that no test checked",
        False, {"action": "store_true"},
    ),
    _CommandLineOption(
        "--llm-golden-update-in-ci", "llm_golden_update_in_ci",
        "allow --llm-golden-update when the CI environment variable is set (refused otherwise)",
        False, {"action": "store_true"},
    ),
    _CommandLineOption(
        "--llm-audit", "llm_audit",
        "audit every deterministic generation: repeat it N times (default 5) and re-run it at another "
        "batch size, padding, cache setting and thread count; report what changed the result",
        None, {"nargs": "?", "const": 5, "type": _audit_repeats, "metavar": "N"},
    ),
    _CommandLineOption(
        "--llm-audit-dtype", "llm_audit_dtype",
        "with --llm-audit, also re-run each generation in this dtype",
        None, {"choices": DTYPES},
    ),
    _CommandLineOption(
        "--llm-plant-defect", "llm_plant_defect",
        "negative control: perturb the loaded model's weights in memory (relative noise 0.5, seed 0), as "
        "a bad upgrade would, so that every golden check must fail; if the run passes, the suite does not "
        f"protect you. Also on with {PLANT_DEFECT_VARIABLE}=1. Writes no goldens, candidates or prunes",
        False, {"action": "store_true"},
    ),
    _CommandLineOption(
        "--llm-golden-fallback", "llm_golden_fallback",
        "when a test has no golden for this device class and dtype, compare with another variant",
        False, {"action": "store_true"},
    ),
)
FLAGS = tuple(option.flag for option in (*SETTINGS, *COMMAND_LINE_OPTIONS))  # every --llm-* option


def register(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmdeterminism", "LLM output regression testing (pytest-llmdeterminism)")
    for setting in SETTINGS:
        group.addoption(setting.flag, dest=setting.ini, default=None, help=setting.help)
        parser.addini(setting.ini, setting.help, default=setting.default)
    for option in COMMAND_LINE_OPTIONS:
        # A copy: pytest keeps the default object itself in config.option (--llm-report's list).
        group.addoption(option.flag, dest=option.dest, default=copy.copy(option.default), help=option.help,
                        **option.how)


def resolve_model_spec(spec: str | None, config: pytest.Config) -> str | None:
    """The spec with its local paths made absolute: the model path, or an engine's model file and
    (for a server) its tokenizer, after the engine prefix."""
    if spec is None or spec.startswith(BUILTIN_PREFIX):
        return spec
    refuse_credentials(spec)
    return with_local_paths(spec, lambda path: resolve_path("llm_model", path, config) or path)


def resolve_path(name: str, raw: str | None, config: pytest.Config) -> str | None:
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


def parse_choice(setting: str, raw: str, choices: tuple[str, ...]) -> str:
    if raw not in choices:
        raise ConfigurationError(setting, raw, f"expected one of {', '.join(choices)}, e.g. '{choices[0]}'")
    return raw


def parse_device(raw: str) -> str:
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
