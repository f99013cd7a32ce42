"""Per-test settings, resolved once per test item and kept in its ``item.stash``.

The options give the run's defaults; every ``@deterministic(...)`` on the test, its class and its
module overrides them, the closest one per argument. A bad marker argument fails the test that
carries it, each time with the same error.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from pytest_llmdeterminism.errors import ConfigurationError, as_int
from pytest_llmdeterminism.judge.tolerance import Profile, parse_profile
from pytest_llmdeterminism.run.options import Options, parse_integer, parse_seed
from pytest_llmdeterminism.shape import MARKER, BatchShape, GenerationSettings


@dataclass(frozen=True)
class ItemSettings:
    deterministic: bool  # the test carries @deterministic: seeds, deterministic kernels, audits
    generation: GenerationSettings
    tolerance: Profile | None  # the marker's profile; None lets the options decide per device class
    rerun: str  # shell arguments that select this test with the run's own --llm-* options


_SETTINGS = pytest.StashKey["ItemSettings | ConfigurationError"]()


def of(item: pytest.Item, options: Options) -> ItemSettings:
    __tracebackhide__ = True
    if _SETTINGS not in item.stash:
        try:
            item.stash[_SETTINGS] = _resolve(item, options)
        except ConfigurationError as error:
            item.stash[_SETTINGS] = error
    settings = item.stash[_SETTINGS]
    if isinstance(settings, ConfigurationError):
        raise settings.with_traceback(None)
    return settings


def _resolve(item: pytest.Item, options: Options) -> ItemSettings:
    __tracebackhide__ = True
    merged: dict[str, object] = {}
    for marker in reversed(list(item.iter_markers(MARKER))):  # farthest first
        if marker.args:
            raise ConfigurationError(f"@deterministic in {item.nodeid}", marker.args,
                                     "takes keyword arguments only, e.g. @deterministic(max_new_tokens=24)")
        merged.update(marker.kwargs)
    given = validate_marker_kwargs(merged, item.nodeid)
    shape = given.get("batch_shape", options.batch_shape)
    tolerance = given.get("tolerance")
    assert isinstance(shape, BatchShape) and (tolerance is None or isinstance(tolerance, Profile))
    generation = GenerationSettings(
        batch_shape=shape,
        batch_shape_setting=("@deterministic(batch_shape=...)" if "batch_shape" in given
                             else "llm_batch_shape"),
        max_new_tokens=int(given.get("max_new_tokens", options.max_new_tokens)),  # type: ignore[call-overload]
        seed=int(given.get("seed", options.seed)),  # type: ignore[call-overload]
        concurrency=int(given.get("concurrency", 0)),  # type: ignore[call-overload]
    )
    return ItemSettings(item.get_closest_marker(MARKER) is not None, generation, tolerance,
                        _rerun_arguments(item, options))


def _rerun_arguments(item: pytest.Item, options: Options) -> str:
    """Shell arguments that select this test from where pytest was started, with the run's own
    ``--llm-*`` options (model, dtype, shape...), so a printed command acts on the same variant."""
    path = os.path.relpath(item.path, item.config.invocation_params.dir)
    target = f"{path}::{item.nodeid.split('::', 1)[1]}" if "::" in item.nodeid else path
    return " ".join(shlex.quote(arg) for arg in (target, *options.cli_settings))


def validate_marker_kwargs(kwargs: dict[str, object], nodeid: str) -> dict[str, object]:
    """Check ``@deterministic(...)`` arguments; return them parsed."""
    __tracebackhide__ = True
    parsers: dict[str, Callable[[object], object]] = {
        "seed": lambda v: parse_seed("@deterministic(seed=...)", str(v)),
        "max_new_tokens": lambda v: parse_integer("@deterministic(max_new_tokens=...)", str(v), 1, minimum=1),
        "batch_shape": lambda v: BatchShape.parse(str(v), setting="@deterministic(batch_shape=...)"),
        "tolerance": lambda v: parse_profile(str(v), setting="@deterministic(tolerance=...)"),
        "concurrency": lambda v: _concurrency(v, nodeid),
    }
    parsed = {}
    for key, raw in kwargs.items():
        if key not in parsers:
            raise ConfigurationError(
                f"@deterministic({key}=...) in {nodeid}", raw,
                f"unknown argument; accepted: {', '.join(sorted(parsers))}",
            )
        if key in ("batch_shape", "tolerance"):
            if isinstance(raw, bool):
                raise ConfigurationError(f"@deterministic({key}=...) in {nodeid}", raw, "expected a string")
            parsed[key] = parsers[key](raw)
            continue
        integer = as_int(raw)  # numpy's too, as a plain int: never a bool
        if integer is None:
            raise ConfigurationError(f"@deterministic({key}=...) in {nodeid}", raw, "expected an integer")
        parsed[key] = parsers[key](integer)
    return parsed


def _concurrency(value: object, nodeid: str) -> int:
    """``@deterministic(concurrency=N)``: N concurrent companion requests, from 1 to
    :data:`~model.concurrency.MAX_CONCURRENCY` (0 is the default: one request at a time)."""
    __tracebackhide__ = True
    from pytest_llmdeterminism.model.concurrency import MAX_CONCURRENCY

    assert isinstance(value, int)
    if not 0 <= value <= MAX_CONCURRENCY:
        raise ConfigurationError(f"@deterministic(concurrency=...) in {nodeid}", value,
                                 f"expected the number of concurrent companion requests, from 1 to "
                                 f"{MAX_CONCURRENCY} (e.g. concurrency=4, or the server's slot count; 0 "
                                 "sends one request at a time)")
    return value
