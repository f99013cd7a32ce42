"""The tokenizer ``llm-golden review`` decodes token ids with, as a failing check does: the tokenizer of
the model the project's configuration names (``llm_model``), loaded alone (no weights), offline. A
golden stores the piece of each token it generated, but not of the other ids of its top-k; the
check that failed in CI decoded those with the model's tokenizer, and review shows the same text
only with it. It is used for a case only where its hash is the one that case recorded
(``tokenizer_hash``): another tokenizer would spell those ids otherwise."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_llmdeterminism.errors import LLMDeterminismError
from pytest_llmdeterminism.judge.compare import Recorded
from pytest_llmdeterminism.run.configuration import config_file_values


@dataclass(frozen=True)
class ProjectTokenizer:
    """The project's tokenizer, or why there is none (``tokenizer`` None), and its hash."""

    tokenizer: Any
    hash: str | None
    line: str  # what review says about it, once

    def for_case(self, *sides: Recorded | None) -> Any:
        """The tokenizer, where a side of the case recorded its hash; else None."""
        recorded = {side.fingerprint.get("tokenizer_hash") for side in sides if side is not None}
        return self.tokenizer if self.tokenizer is not None and self.hash in recorded else None


def load(config_file: Path | None, recorded: Iterable[str]) -> ProjectTokenizer:
    """The tokenizer of ``config_file``'s ``llm_model``; ``recorded``: the tokenizer hashes the cases
    recorded, which it should be one of."""
    unread = "token ids the goldens hold no piece for are shown as <id N>"
    spec = (config_file_values(config_file) or {}).get("llm_model", "").strip() if config_file else ""
    if not spec:
        return ProjectTokenizer(None, None, f"{unread}: the project's configuration names no llm_model "
                                            "whose tokenizer would decode them")
    try:
        path = _tokenizer_path(spec, config_file.parent if config_file else Path())
        from pytest_llmdeterminism.engines.checkpoint import load_tokenizer
        from pytest_llmdeterminism.engines.fingerprints import tokenizer_hash

        tokenizer = load_tokenizer(spec, path)
    except (LLMDeterminismError, OSError, ValueError, ImportError) as error:
        return ProjectTokenizer(None, None, f"{unread}: the tokenizer of llm_model {spec!r} cannot be loaded "
                                            f"({error})")
    found = tokenizer_hash(tokenizer)
    if found not in set(recorded):
        return ProjectTokenizer(None, found, f"{unread}: the tokenizer of llm_model {spec!r} (hash {found}) "
                                             "is not the one these goldens were recorded with")
    return ProjectTokenizer(tokenizer, found, f"token ids are decoded with the tokenizer of llm_model "
                                              f"{spec!r}, as the failing check decoded them")


def _tokenizer_path(spec: str, base: Path) -> Path:
    """Where the tokenizer of ``spec`` is: a built-in model's folder, a local folder or ``.gguf`` file
    (relative to the configuration file), a hub id's cached snapshot, an engine's model file or its
    ``tokenizer=`` option."""
    from pytest_llmdeterminism.engines import BUILTIN_MODELS
    from pytest_llmdeterminism.engines.spec import BUILTIN_PREFIX, EngineSpec, HubId, engine_of

    if spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX):]
        if name not in BUILTIN_MODELS:
            raise ValueError(f"no built-in model {name!r}")
        return BUILTIN_MODELS[name]
    if engine_of(spec) is not None:
        parsed = EngineSpec.parse(spec)
        target = dict(parsed.params).get("tokenizer") or parsed.target
        return base / Path(target).expanduser()
    local = base / Path(spec).expanduser()
    hub_id = HubId.parse(spec)
    if hub_id is not None and not os.path.exists(local):
        from pytest_llmdeterminism.engines import hub

        return hub.find(spec, hub_id).folder
    return local
