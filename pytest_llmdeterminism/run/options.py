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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pytest_llmdeterminism.compute import profiles
from pytest_llmdeterminism.engines.spec import (
    BUILTIN_PREFIX,
    HubId,
    engine_of,
    refuse_credentials,
    with_local_paths,
)
from pytest_llmdeterminism.errors import ConfigurationError
from pytest_llmdeterminism.judge.tolerance import ToleranceSetting
from pytest_llmdeterminism.reporting import documents
from pytest_llmdeterminism.sampling import MAX_SEED
from pytest_llmdeterminism.shape import DTYPES, BatchShape

if TYPE_CHECKING:
    import pytest

DEFAULT_BATCH_SHAPE = "1x128"
DEFAULT_MAX_NEW_TOKENS = 32
DEFAULT_SEED = 0
UpdateMode = Literal["all", "new"]
# --llm-golden-prune: 'tests' (the bare flag) deletes goldens of deleted or renamed tests and of checks
# a passing test no longer makes; 'cases' also those of parametrized cases the run did not collect
PruneMode = Literal["tests", "cases"]
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
    cpu_numerics: str  # profiles.MODES: portable, compatible, native
    update: UpdateMode | None
    tolerance: ToleranceSetting
    golden_fallback: bool
    audit: int | None  # repeats per audited generation, or None when --llm-audit is off
    audit_dtype: str | None
    reports: tuple[Path, ...]  # --llm-report, each of a format documents.REPORT_FORMATS has
    artifacts: Path | None
    prune: PruneMode | None  # --llm-golden-prune, or None
    partial: tuple[str, ...]  # why this run does not see every test (then unused goldens are not judged)
    rootdir: Path
    invocation_dir: Path
    cli_settings: tuple[str, ...] = ()  # the --llm-* settings given on the command line, as typed
    threads: int | None = None  # llm_threads, or None for auto (compute/threads.py)
    xdist_workers: int | None = None  # the pytest-xdist workers this process starts (the controller)
    plant_defect: bool = False  # --llm-plant-defect or LLMDET_PLANT_DEFECT=1: the negative control
    # llm_batch_invariant: kernels whose logits do not depend on the batch. None (unset): where the
    # numerics support them, else the previous kernels; True: required; False: the previous kernels
    batch_invariant: bool | None = None
    repro: Path | None = None  # --llm-repro: a repro pack per failing golden check under this folder
    # Every setting in force that is not its default, as (ini name, value): what a repro pack's
    # command passes again; the model and golden folder relative to the rootdir where inside it.
    settings_in_force: tuple[tuple[str, str], ...] = ()
    # llm_server_checks: a server run starts with the serving audit, whose verified capability each
    # golden's fingerprint then records (model/serving_audit.py)
    server_checks: bool = False


@dataclass(frozen=True)
class _Setting:
    ini: str
    flag: str
    help: str
    default: str | None


SETTINGS = (
    _Setting("llm_model", "--llm-model",
             "model under test: a local transformers folder, a .gguf file, builtin:tiny, or a hub id "
             "ORG/NAME[@REVISION] read offline from the local Hugging Face cache (HF_HUB_CACHE / HF_HOME; "
             "a local folder of the same name wins)", None),
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
             profiles.DEFAULT_MODE),
    _Setting("llm_threads", "--llm-threads",
             "torch's CPU threads: a count, or auto (default): torch's default, and under pytest-xdist each "
             "worker's share of the usable cores (cores // workers, at least 1); an OMP_NUM_THREADS or "
             "MKL_NUM_THREADS you set is kept under auto",
             "auto"),
    _Setting("llm_batch_invariant", "--llm-batch-invariant",
             "batch-invariant CPU kernels, so a prompt gives the same bits alone or in any batch and "
             "goldens do not depend on llm_batch_shape (it changes speed, not bits: B > 1 speeds up calls "
             "that pass several prompts, and costs a one-prompt call B rows). Unset (default): "
             "on wherever they run (float32 on the CPU under portable or compatible numerics, x86-64 or "
             "Linux arm64), else the previous kernels; true: required, an error where they do not run; "
             "false: the previous kernels, the batch shape part of every golden",
             None),
    _Setting("llm_server_checks", "--llm-server-checks",
             "true: a run against a server (openai:...) starts with the serving audit of one request "
             "(alone, among concurrent companions, repeated under load, after a request that fills the "
             "prefix cache), prints it in the header and records what it verified in each golden's "
             "fingerprint (serving_verified); false (default): goldens say their serving was not verified",
             "false"),
)


def _flag_mode(flag: str, first: str, second: str) -> Callable[[str], str]:
    """The type of a flag whose value is ``first`` or ``second`` (the bare flag: ``first``)."""
    def mode(value: str) -> str:
        if value in (first, second):
            return value
        raise argparse.ArgumentTypeError(
            f"expected {first!r} or {second!r}, got {value!r}. To {flag.removeprefix('--llm-golden-')} and "
            f"name test paths, write '{flag}={first} PATH' (or put PATH before the flag)."
        )
    return mode


_update_mode = _flag_mode("--llm-golden-update", "all", "new")
_prune_mode = _flag_mode("--llm-golden-prune", "tests", "cases")


def _audit_repeats(value: str) -> int:
    if value.isdigit() and int(value) >= 2:
        return int(value)
    raise argparse.ArgumentTypeError(
        f"expected a number of repeats >= 2, got {value!r}. To audit and name test paths, write "
        "'--llm-audit=5 PATH' (or put PATH before the flag)."
    )


def _report_path(value: str) -> str:
    if documents.format_of(value) is not None:
        return value
    raise argparse.ArgumentTypeError(f"expected a path ending in {documents.suffixes()}, got {value!r}")


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
        f"write a report of every golden check: {documents.suffixes(purposes=True)}; "
        "repeat the option for several",
        [], {"action": "append", "metavar": "PATH", "type": _report_path},
    ),
    _CommandLineOption(
        "--llm-golden-artifacts", "llm_golden_artifacts",
        "write the candidate golden of every missing or failing check under DIR (e.g. for a CI "
        "artifact); review them with: llm-golden review DIR (or diff DIR), import them with: "
        "llm-golden accept DIR",
        None, {"metavar": "DIR"},
    ),
    _CommandLineOption(
        "--llm-repro", "llm_repro",
        "write a repro pack for every failing golden check under DIR/<test id>[/<key>]: both environment "
        "fingerprints, the prompt and its token ids, the settings, the golden and the new entry, and "
        "rerun.sh with the one command that reruns that check alone (e.g. for a CI artifact)",
        None, {"metavar": "DIR"},
    ),
    _CommandLineOption(
        "--llm-golden-prune", "llm_golden_prune",
        "after a complete run in which every test passed, delete goldens that no test checked: 'tests' "
        "(default) those of tests deleted or renamed and of checks a passing test no longer makes; "
        "'cases' also those of parametrized cases this run did not collect (a parametrization that "
        "depends on the machine or environment loses the other cases' goldens: kept without it)",
        None, {"nargs": "?", "const": "tests", "type": _prune_mode, "metavar": "tests|cases"},
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
        f"protect you. Also on with {PLANT_DEFECT_VARIABLE}=1. Writes no goldens, candidates, repro packs or "
        "prunes",
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
    (for a server) its tokenizer, after the engine prefix. A hub id (``ORG/NAME[@REVISION]``) is kept
    as written unless a folder or file of that name exists where a path would be looked for: the
    local path wins."""
    if spec is None or spec.startswith(BUILTIN_PREFIX):
        return spec
    refuse_credentials(spec)
    local = with_local_paths(spec, lambda path: resolve_path("llm_model", path, config) or path)
    if engine_of(spec) is None and HubId.parse(spec) is not None and not Path(local).exists():
        return spec
    return local


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


def parse_one_of(setting: str, raw: str, choices: tuple[str, ...]) -> str:
    """``raw`` if it is one of ``choices``, else a usage error that lists them."""
    if raw not in choices:
        raise ConfigurationError(setting, raw, f"expected one of {', '.join(choices)}, e.g. '{choices[0]}'")
    return raw


def parse_device(raw: str) -> str:
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", raw):
        raise ConfigurationError("llm_device", raw, "expected auto, cpu, mps, cuda or cuda:N, e.g. 'cpu'")
    return raw


def parse_threads(raw: str | None) -> int | None:
    """``llm_threads``: None for ``auto``, else a thread count."""
    if raw is None or raw == "auto":
        return None
    if raw.isdigit() and int(raw) >= 1:
        return int(raw)
    raise ConfigurationError("llm_threads", raw, "expected auto or a number of threads >= 1, e.g. '1' (one "
                             "thread in every process, serial or under pytest-xdist)")


def parse_boolean(setting: str, raw: str | None, *, default: bool = False) -> bool:
    if raw is None:
        return default
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise ConfigurationError(setting, raw, "expected true or false, e.g. 'true'")


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


def parse_seed(setting: str, raw: str | None) -> int:
    """A seed every engine takes (``llm_seed``, ``--llm-seed``, ``@deterministic(seed=...)``)."""
    try:
        seed = DEFAULT_SEED if raw is None else int(raw)
    except ValueError:
        seed = -1
    if not 0 <= seed <= MAX_SEED:
        raise ConfigurationError(setting, raw, f"expected an integer from 0 to 2**63 - 1 ({MAX_SEED}: the "
                                 f"largest seed torch, numpy and OpenAI-compatible servers all take), "
                                 f"e.g. '{DEFAULT_SEED}'")
    return seed
