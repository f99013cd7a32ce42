"""One exception tree. Each error keeps the objects it failed on, so reports need not parse text.
Beside it, how a name read from an artifact is shown in a message (:func:`printable`), and the two
readings of what a user passes that every error about a setting starts from:
a setting as a message suggests it (:func:`pasteable`), and a number as a test passes it (a numpy
scalar, a ``Fraction``, ...) as the plain ``int`` or ``float`` that goldens and reports hold as JSON
(:func:`as_int`, :func:`as_float`; a ``bool`` is never a number here: ``max_new_tokens=True`` is a
mistake, not 1).

This module imports nothing from the package; ``GoldenMismatchError`` lives beside the
``Comparison`` it carries, in ``judge/compare.py``, and every error is exported from the package root.
"""

from __future__ import annotations

import json
import math
import numbers
import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "BatchInvarianceProbeError",
    "ConfigurationError",
    "EngineError",
    "GoldenFileError",
    "LLMDeterminismError",
    "ModelLoadError",
    "NonFiniteLogitsError",
    "PromptTooLongError",
    "SamplingRefusedError",
]


def pasteable(ini: str, value: str) -> str:
    """A setting as a message suggests it, valid wherever it is pasted: the command-line flag, then
    the ini line unquoted for pytest.ini / tox.ini / setup.cfg (which keep quotes as part of the
    value) and quoted for ``[tool.pytest.ini_options]`` in pyproject.toml (a TOML string)."""
    flag = "--" + ini.replace("_", "-")
    return (f"{flag}={shlex.quote(value)} (pytest.ini: {ini} = {value}; "
            f"pyproject.toml: {ini} = {json.dumps(value)})")


def printable(text: object) -> str:
    """``text`` as a terminal or a CI log may show it: every character Python's ``repr`` would escape
    (C0 and C1 controls, ESC, CR and LF, DEL, bidi overrides and other format characters, line and
    paragraph separators) written as its escape (``\\x1b``, ``\\n``, ``\\u202e``), the rest as it
    is. Every string an ``llm-golden`` command prints from an artifact (a candidate's file name, a
    report's test id or verdict) goes through it: a name cannot move the cursor, rewrite a line,
    reach the clipboard (OSC 52) or start a line of its own."""
    text = str(text)
    if text.isprintable():  # the common case, checked at C speed
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def as_int(value: object) -> int | None:
    """``value`` as a plain ``int`` when it is an integer (``int``, ``numpy.int64``, any
    ``numbers.Integral``) and not a bool; else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def as_float(value: object) -> float | None:
    """``value`` as a plain ``float`` when it is a real number (``float``, ``numpy.float32``, an
    integer, any ``numbers.Real``) and not a bool; else None. An integer beyond float's range is
    ``inf`` (a finite check refuses it), not an ``OverflowError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except OverflowError:
        return -math.inf if value < 0 else math.inf


class LLMDeterminismError(Exception):
    """Root of every error this plugin raises."""


NO_VALUE = object()  # a ConfigurationError about a setting that has no value (unset, or a bare flag)


class ConfigurationError(LLMDeterminismError, ValueError):
    """A setting (ini value, command-line option or marker argument) is invalid.

    Bad ini values and options are found at start-up, where the plugin turns this into a pytest
    usage error so that nothing runs; marker arguments fail the test that carries them.
    """

    def __init__(self, setting: str, value: object, message: str) -> None:
        self.setting = setting
        self.value = None if value is NO_VALUE else value
        shown = f"{setting}: " if value is NO_VALUE else f"{setting} = {value!r}: "
        super().__init__(shown + message)


class ModelLoadError(LLMDeterminismError):
    """The configured model cannot be loaded safely and offline."""

    def __init__(self, spec: str, message: str) -> None:
        self.spec = spec
        super().__init__(f"cannot load llm_model {spec!r}: {message}")


class EngineError(LLMDeterminismError):
    """The engine behind ``llm_model`` failed while generating: a server stopped answering, or did
    not decode greedily, or tokenised the prompt differently from the tokenizer the spec names."""

    def __init__(self, spec: str, message: str) -> None:
        self.spec = spec
        super().__init__(f"llm_model {spec!r}: {message}")


class SamplingRefusedError(LLMDeterminismError, ValueError):
    """A generation argument would make decoding random or non-greedy."""

    def __init__(self, argument: str, value: object, why: str) -> None:
        self.argument = argument
        self.value = value
        super().__init__(
            f"llm_model.generate({argument}={value!r}) refused: {why}. "
            "llm_model decodes greedily so that goldens are reproducible, unless do_sample=True asks "
            f"for its seeded sampler; remove {argument!r} from the call."
        )


class NonFiniteLogitsError(LLMDeterminismError, ValueError):
    """The model produced NaN or infinite logits: no golden can be recorded or compared."""

    def __init__(self, step: int, row: int) -> None:
        self.step = step
        self.row = row
        super().__init__(
            f"the model produced NaN or infinite logits at step {step} (row {row} of the batch). "
            "Goldens cannot hold them. Common causes: float16 overflow "
            f"(try {pasteable('llm_dtype', 'bfloat16')} or float32), corrupt or incompatible weights."
        )


class PromptTooLongError(LLMDeterminismError, ValueError):
    """A prompt has more tokens than the fixed batch shape's length L."""

    def __init__(self, prompt: str, n_tokens: int, batch_shape: str, *,
                 setting: str = "llm_batch_shape", fitting: str | None = None,
                 at_least: bool = False, characters: int = 0, shape_in_goldens: bool = True) -> None:
        """``fitting``: the smallest shape the plugin accepts that holds ``n_tokens`` (None: none does);
        ``at_least``: ``n_tokens`` is a lower bound from the prompt's ``characters``, the prompt was
        refused before it was tokenised (so ``fitting`` is a lower bound too, never suggested as a fix);
        ``shape_in_goldens``: the kernels in use make the shape part of every golden."""
        self.prompt = prompt
        self.n_tokens = n_tokens
        self.at_least = at_least
        self.batch_shape = batch_shape
        length = batch_shape.partition("x")[2]
        shown = prompt if len(prompt) <= 60 else prompt[:57] + "..."
        if fitting is None:
            fix = "no batch shape the plugin accepts holds it: shorten the prompt"
        elif at_least:
            fix = (f"shorten the prompt, or raise L above its token count (more than {n_tokens}: count "
                   f"them with llm_model.tokenizer). {after_shape_change(shape_in_goldens)}")
        else:
            example = (f"@deterministic(batch_shape=\"{fitting}\")" if setting.startswith("@") else
                       pasteable("llm_batch_shape", fitting))
            fix = f"raise L, e.g. {example}. {after_shape_change(shape_in_goldens)}"
        counted = f" (a bound from its {characters:,} characters; a text this long is not tokenised)" \
            if at_least and characters else ""
        super().__init__(
            f"prompt {shown!r} has {'at least ' * at_least}{n_tokens} tokens{counted} but "
            f"{setting.replace('=...', '')} {batch_shape!r} "
            f"allows {int(length) - 1} (one position always stays padding). Every generation runs at "
            f"one fixed shape BxL; {fix}."
        )


def after_shape_change(shape_in_goldens: bool) -> str:
    """What another batch shape does to the goldens, under the kernels in use."""
    if shape_in_goldens:
        return ("These kernels are not batch-invariant: the shape is part of every golden, so re-record "
                "them afterwards (--llm-golden-update)")
    return "The goldens stay valid: under the kernels in use they do not depend on the batch shape"


class BatchInvarianceProbeError(LLMDeterminismError):
    """The probe at the first generation of a shape found that a prompt's result depends on its row
    and companions on this machine, or (``nondeterministic``) that one batch run twice differs."""

    def __init__(self, prompt: str, batch_shape: str, step: int, in_force: str, fix: str, *,
                 nondeterministic: bool = False, other_shape: str | None = None) -> None:
        self.prompt = prompt
        self.batch_shape = batch_shape
        self.step = step
        self.nondeterministic = nondeterministic
        shown = prompt if len(prompt) <= 60 else prompt[:57] + "..."
        rows = int(batch_shape.partition("x")[0])
        if nondeterministic:
            what = (f"NONDETERMINISTIC: the same {batch_shape} batch with {shown!r} gave different logits "
                    f"twice (first at step {step}): something in the forward pass is random "
                    "(an unseeded random source, dropout, a hook adding noise, or a nondeterministic kernel)")
            fix = "find it with --llm-audit, which repeats each generation and tables what moved it"
        elif other_shape is not None:
            what = (f"batch invariance fails here: {shown!r} gives different logits in row 0 of a "
                    f"{batch_shape} batch and in a {other_shape} batch (first at step {step}), though "
                    "batch-invariant kernels are on (the default; llm_batch_invariant = false keeps the "
                    "previous kernels, whose goldens record the shape): its goldens would depend on the "
                    "batch shape")
        else:
            what = (f"batch invariance fails here: {shown!r} gives different logits at row 0 and at row "
                    f"{rows - 1} of a {batch_shape} batch with other companions (first at step {step}), so "
                    "every result would depend on what else is batched with it")
        super().__init__(f"{what}. In force: {in_force}. Fix: {fix}")


class GoldenFileError(LLMDeterminismError):
    """A golden file cannot be used: corrupt JSON, unknown schema, or an unexpected layout.

    The file is never rewritten while this error stands.
    """

    def __init__(self, path: Path, problem: str, fix: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"golden file {str(path)!r} {problem}. The file was left untouched. {fix}")

