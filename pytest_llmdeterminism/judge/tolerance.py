"""Tolerance profiles: which verdicts pass. Pure: parsing and deciding, no I/O, no torch.

The verdict says what happened; the profile decides whether that passes::

    exact                           tokens and logit hashes must match
    tokens                          tokens must match; logit drift passes
    close(atol=1e-3)                tokens must match and top-k logprobs agree within atol
    near_tie(margin=0.1, atol=1e-2) like close; a first divergence at a step whose golden
                                    top-1/top-2 margin was below `margin` (or within the drift
                                    measured before it) passes as TIE_FLIP (a score's rank
                                    change at such a margin: RANK_FLIP)
    gate(margin=0.1, atol=1e-2)     an eval passes where its paired gate is ALLOW (no flip, every
                                    flip at a near tie, or a significant gain); REJECT and
                                    INCONCLUSIVE fail. Any other check: as near_tie

A setting may map device classes to profiles: ``cpu: exact, cuda: near_tie(margin=0.2)``.
Without a setting the default follows the environment: ``exact`` when the golden was recorded
with the same numerics (see ``fingerprint.numerics_changes``), else ``near_tie`` with the dtype's
margin and atol, because another CPU, GPU or library version changes bits, not behaviour.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pytest_llmdeterminism.errors import ConfigurationError, as_float
from pytest_llmdeterminism.judge.compare import DEFAULT_TIE_MARGIN, Comparison, Verdict

# near_tie's and close's default atol per dtype (the default margin lives beside the comparator).
DEFAULT_ATOL = {"float32": 1e-3, "float16": 5e-2, "bfloat16": 1e-1}
EXAMPLE = "near_tie(margin=0.1, atol=1e-2)"


class ProfileName(str, enum.Enum):
    """A profile's name as a setting spells it (a ``str``: ``ProfileName.EXACT == "exact"``)."""

    EXACT = "exact"
    TOKENS = "tokens"
    CLOSE = "close"
    NEAR_TIE = "near_tie"
    GATE = "gate"

    def __str__(self) -> str:
        return self.value


_PARAMETERS = {ProfileName.EXACT: (), ProfileName.TOKENS: (), ProfileName.CLOSE: ("atol",),
               ProfileName.NEAR_TIE: ("margin", "atol"), ProfileName.GATE: ("margin", "atol")}


@dataclass(frozen=True)
class Profile:
    name: ProfileName
    atol: float | None = None
    margin: float | None = None

    def __post_init__(self) -> None:
        __tracebackhide__ = True
        object.__setattr__(self, "name", ProfileName(self.name))  # Profile("exact") is ProfileName.EXACT
        for key in ("atol", "margin"):
            value = getattr(self, key)
            if value is None:
                continue
            problem = _threshold_problem(value)
            if problem:
                raise ConfigurationError(f"{self.name.value}({key}=...)", value,
                                         f"{key} {problem}, e.g. {EXAMPLE!r}")
            object.__setattr__(self, key, as_float(value))  # a numpy float too: reports print it as JSON

    def __str__(self) -> str:
        params = [f"{p}={getattr(self, p):g}" for p in _PARAMETERS[self.name] if getattr(self, p) is not None]
        return f"{self.name.value}({', '.join(params)})" if params else self.name.value

    def describe(self, dtype: str) -> str:
        """The profile with the thresholds it applies for ``dtype`` spelled out."""
        if self.name in (ProfileName.EXACT, ProfileName.TOKENS):
            return str(self)
        atol = self.atol if self.atol is not None else DEFAULT_ATOL.get(dtype, DEFAULT_ATOL["float32"])
        if self.name is ProfileName.CLOSE:
            return f"close(atol={atol:g})"
        return f"{self.name.value}(margin={self.tie_margin(dtype):g}, atol={atol:g})"

    def tie_margin(self, dtype: str) -> float:
        """The margin below which a flipped token counts as a near tie."""
        if self.margin is not None:
            return self.margin
        return DEFAULT_TIE_MARGIN.get(dtype, DEFAULT_TIE_MARGIN["float32"])

    def accepts(self, comparison: Comparison, dtype: str = "float32") -> bool:
        verdict = comparison.verdict
        if verdict is Verdict.IDENTICAL:
            return True
        if self.name is ProfileName.GATE and comparison.gate is not None:
            return comparison.gate == "ALLOW"
        if not verdict.tolerable or self.name is ProfileName.EXACT:
            return False
        if self.name is ProfileName.TOKENS:
            return verdict is Verdict.LOGIT_DRIFT
        atol = self.atol if self.atol is not None else DEFAULT_ATOL.get(dtype, DEFAULT_ATOL["float32"])
        if comparison.max_logprob_delta > atol:
            return False
        return verdict is Verdict.LOGIT_DRIFT or self.name in (ProfileName.NEAR_TIE, ProfileName.GATE)


@dataclass(frozen=True)
class ToleranceSetting:
    """A profile for every device class, or one per class (``None`` key: any other class)."""

    by_device: Mapping[str | None, Profile]

    def describe(self) -> str:
        return ", ".join(f"{device or '*'}: {profile}" if len(self.by_device) > 1 or device else str(profile)
                         for device, profile in self.by_device.items())

    def explicit_for(self, device_class: str) -> Profile | None:
        """The profile the user set for this device class, or None."""
        return self.by_device.get(device_class, self.by_device.get(None))


def _threshold_problem(value: object) -> str | None:
    """Why ``value`` cannot be an atol or margin: an infinite one would pass every drift or every
    flip (a profile that accepts everything is no test), a negative or NaN one nothing."""
    number = as_float(value)
    if number is None:
        return "must be a number"
    if not math.isfinite(number) or number < 0:
        return "must be a finite number >= 0"
    return None


def default_profile(dtype: str, *, same_environment: bool) -> Profile:
    """``exact`` where the golden's numerics are this run's; the dtype's ``near_tie`` across environments."""
    if same_environment:
        return Profile(ProfileName.EXACT)
    return Profile(ProfileName.NEAR_TIE, atol=DEFAULT_ATOL.get(dtype, DEFAULT_ATOL["float32"]),
                   margin=DEFAULT_TIE_MARGIN.get(dtype, DEFAULT_TIE_MARGIN["float32"]))


def parse_profile(text: str, *, setting: str = "llm_tolerance") -> Profile:
    match = re.fullmatch(r"\s*([a-z_]+)\s*(?:\((.*)\))?\s*", text)
    names = [name.value for name in ProfileName]
    if not match or match[1] not in names:
        raise ConfigurationError(setting, text, f"expected one of {', '.join(names)}, e.g. {EXAMPLE!r}")
    name, args = ProfileName(match[1]), (match[2] or "").strip()
    values: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in args.split(","))):
        key, _, raw = part.partition("=")
        key = key.strip()
        if key not in _PARAMETERS[name]:
            accepted = ", ".join(_PARAMETERS[name]) or "no arguments"
            raise ConfigurationError(setting, text,
                                     f"{name.value} takes {accepted}; got {key!r}. Example: {EXAMPLE!r}")
        try:
            number = float(raw)
        except ValueError:
            number = math.nan
        problem = _threshold_problem(number)
        if problem:
            raise ConfigurationError(setting, text, f"{key} {problem}, e.g. {EXAMPLE!r}")
        if key in values:
            raise ConfigurationError(setting, text, f"{key} is given twice")
        values[key] = number
    return Profile(name, **values)


def parse_setting(text: str, *, setting: str = "llm_tolerance") -> ToleranceSetting:
    """One profile, or ``device: profile`` pairs separated by commas or new lines."""
    text = text.strip()
    if ":" not in text:
        return ToleranceSetting({None: parse_profile(text, setting=setting)})
    by_device: dict[str | None, Profile] = {}
    # Split on commas that are not inside parentheses, and on new lines.
    for part in re.split(r",(?![^(]*\))|\n", text):
        if not part.strip():
            continue
        device, sep, profile = part.partition(":")
        device = device.strip()
        if not sep or not re.fullmatch(r"cpu|cuda|mps|xpu|\*", device):
            raise ConfigurationError(
                setting, text, f"expected 'device: profile' pairs, e.g. 'cpu: exact, cuda: {EXAMPLE}'"
            )
        by_device[None if device == "*" else device] = parse_profile(profile, setting=setting)
    return ToleranceSetting(by_device)
