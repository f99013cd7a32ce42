"""The ``llm_model`` spec, parsed once: which engine, what it loads, and its ``#key=value`` options.

``builtin:tiny``, a folder or a ``.gguf`` file run on transformers, or a Hugging Face hub id
(``ORG/NAME[@REVISION]``, read from the local cache: ``hub.py``); ``ENGINE:TARGET#key=value&...``
names another engine (``llamacpp``, ``openai``, ``vllm``: ``registry.py``). Nothing here imports torch
or an engine.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pytest_llmdeterminism.engines.registry import ENGINES, entry_of
from pytest_llmdeterminism.errors import ConfigurationError, pasteable

BUILTIN_PREFIX = "builtin:"
# Model files `llm-golden fetch NAME DIR` puts into DIR (fetch.MODELS holds what it downloads).
FETCHABLE_FILES = {"SmolLM2-135M-Instruct.Q4_1.gguf": "smollm2", "gemma-3-270m-q4_k_m.gguf": "gemma3"}
# Hub ids `llm-golden fetch NAME --hub-cache` puts into the local Hugging Face cache.
FETCHABLE_HUB_IDS = {"HuggingFaceTB/SmolLM2-135M-Instruct": "smollm2", "google/gemma-3-270m": "gemma3"}

_Options = TypeVar("_Options")

# huggingface_hub's rule for a repo id (letters, digits, '-', '_', '.'; each part starting and
# ending with a letter or digit; no '--' or '..'; at most 96 characters), with the ORG/ part
# required: a bare NAME reads as a folder. REVISION: a branch, a tag or a commit (or its prefix).
_HUB_PART = r"[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"(?P<repo>{_HUB_PART}/{_HUB_PART})(?:@(?P<revision>[\w.-]+(?:/[\w.-]+)*))?", re.ASCII)


@dataclass(frozen=True)
class EngineSpec:
    """An ``ENGINE:TARGET#key=value&...`` spec: ``text`` as written (what messages show), the
    ``engine``, its ``target`` (a file, a folder or a URL) and its options, still text: each
    engine reads them into its own typed options with :meth:`options`."""

    text: str
    engine: str
    target: str
    params: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> EngineSpec:
        """The spec of another engine than transformers; a malformed option or a missing target
        names the fix."""
        __tracebackhide__ = True
        engine = engine_of(text)
        if engine is None:
            prefixes = ", ".join(name for name, entry in ENGINES.items() if not entry.default)
            raise ValueError(f"{text!r} names no engine prefix ({prefixes})")
        target, _, fragment = text.partition(":")[2].partition("#")
        params: dict[str, str] = {}
        for pair in filter(None, fragment.split("&")):
            key, sep, value = pair.partition("=")
            if not sep or not key or not value:
                raise ConfigurationError("llm_model", text, f"{pair!r} after '#' is not key=value "
                                         "(e.g. llamacpp:model.gguf#threads=2&n_batch=512)")
            params[key] = value
        if not target:
            raise ConfigurationError("llm_model", text, "names no model after the engine prefix")
        return cls(text, engine, target, tuple(params.items()))

    def options(self, into: type[_Options]) -> _Options:
        """The ``#key=value`` options as ``into`` (a frozen dataclass whose fields are the keys,
        typed ``int``, ``float``, ``bool`` or ``str``, with their defaults); an unknown key or a bad
        value names the fix."""
        __tracebackhide__ = True
        fields = {field.name: field for field in dataclasses.fields(into)}  # type: ignore[arg-type]
        given = dict(self.params)
        unknown = sorted(set(given) - set(fields))
        if unknown:
            raise ConfigurationError("llm_model", self.text, f"unknown option {unknown[0]!r} after '#'; this "
                                     f"engine takes: {', '.join(sorted(fields))}")
        parsed: dict[str, Any] = {}
        for key, text in given.items():
            parse = _PARSERS[_type_name(fields[key].type).removesuffix(" | None")]
            try:
                parsed[key] = parse(text)
            except ValueError:
                raise ConfigurationError("llm_model", self.text, f"option {key}={text!r} is not a valid "
                                         f"{getattr(parse, '__name__', 'value')}") from None
            if parse is int and parsed[key] < 1:
                raise ConfigurationError("llm_model", self.text, f"option {key}={text!r} must be at least 1")
        return into(**parsed)

    def given(self, key: str) -> str:
        """The text an option was given as (for a message about its value)."""
        return dict(self.params)[key]


@dataclass(frozen=True)
class HubId:
    """``ORG/NAME`` or ``ORG/NAME@REVISION``: a model in the local Hugging Face cache."""

    repo: str
    revision: str | None = None

    @classmethod
    def parse(cls, text: str) -> HubId | None:
        """The hub id ``text`` is spelt as, None when it cannot be one (pure: nothing is looked up)."""
        match = _HUB_ID.fullmatch(text)
        if match is None:
            return None
        repo = match["repo"]
        if "--" in repo or ".." in repo or len(repo) > 96 or repo.endswith(".gguf"):
            return None
        return cls(repo, match["revision"])

    def __str__(self) -> str:
        return self.repo if self.revision is None else f"{self.repo}@{self.revision}"


def hub_id(spec: str) -> HubId | None:
    """The hub id ``spec`` names, None for any other spec. A local folder or file keeps precedence:
    a spec that exists on disk (relative to the working folder) is a path, however it is spelt."""
    if engine_of(spec) is not None or spec.startswith(BUILTIN_PREFIX):
        return None
    parsed = HubId.parse(spec)
    return None if parsed is None or Path(spec).exists() else parsed


def engine_of(spec: str) -> str | None:
    """The engine a spec names (``llamacpp:model.gguf`` -> ``llamacpp``), None for the default engine
    (transformers), which no prefix names."""
    entry = entry_of(spec)
    return None if entry.default else entry.name


def with_local_paths(spec: str, absolute: Callable[[str], str]) -> str:
    """``spec`` with its local paths passed through ``absolute``: the model path, or an engine's model
    file and (for a server) its ``tokenizer=``. Malformed options are kept as written, for the load
    to refuse by name."""
    engine = engine_of(spec)
    if engine is None:
        return absolute(spec)
    target, hash_sign, fragment = spec.partition(":")[2].partition("#")
    if ENGINES[engine].local_target and target:
        target = absolute(target)
    pairs = [f"{key}={absolute(value)}" if key == "tokenizer" and sep and value else pair
             for pair in fragment.split("&") if pair for key, sep, value in [pair.partition("=")]]
    return f"{engine}:{target}{hash_sign}{'&'.join(pairs)}"


def without_credentials(text: str) -> str:
    """``text`` (a spec or URL) with any ``USER:PASSWORD@`` after its ``://`` shown as ``***@``. The
    authority ends at the last ``@`` before the first ``#``, so a password holding ``/`` or ``?`` is
    hidden too."""
    scheme_end = text.find("://")
    if scheme_end < 0:
        return text
    start = scheme_end + 3
    end = text.find("#", start)
    at = text.rfind("@", start, len(text) if end < 0 else end)
    return text if at < 0 else f"{text[:start]}***{text[at:]}"


def refuse_credentials(spec: str) -> None:
    """A spec whose URL holds ``USER:PASSWORD@``: refused, shown without them. The header, the load
    line and every error print the spec, and such credentials would never be sent anyway."""
    __tracebackhide__ = True
    shown = without_credentials(spec)
    if shown != spec:
        raise ConfigurationError("llm_model", shown, "the URL holds credentials (USER:PASSWORD@), which "
                                 "would be printed with the spec and are never sent. Put the key in an "
                                 "environment variable and name it: "
                                 "openai:http://HOST:PORT/v1#api_key_env=NAME&tokenizer=PATH (sent as "
                                 "'Authorization: Bearer', to this server only)")


def how_to_get(path: str, *, example: str = "models/NAME") -> str:
    """How to put the missing model ``path`` in place (``example``: a spec to set afterwards)."""
    name = path.replace("\\", "/").rpartition("/")[2]
    if name in FETCHABLE_FILES:
        folder = path[: len(path) - len(name)].rstrip("/\\") or "."
        return ("fetch it (checked against its pinned SHA-256) with "
                f"`llm-golden fetch {FETCHABLE_FILES[name]} {folder}`")
    return ("download the model first (e.g. `hf download ORG/NAME --local-dir models/NAME`) and set "
            f"{pasteable('llm_model', example)}")


def flag(text: str) -> bool:
    """``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``."""
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def _type_name(annotation: object) -> str:
    """``int``, ``str | None``, ...: a field's annotation as written (a string under postponed
    annotations) or as a type."""
    if isinstance(annotation, str):
        return annotation
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


# How an option's text becomes its field's type (the annotation, as written in the dataclass).
_PARSERS: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str, "bool": flag}
