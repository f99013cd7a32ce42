"""A local checkpoint (a transformers folder or a ``.gguf`` file) as every engine reads it, offline and
without remote code: its tokenizer, its EOS ids, its JSON configuration. Shared by the transformers,
vLLM and server engines, so that each tokenises and stops as the others do."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.errors import ModelLoadError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def load_tokenizer(spec: str, path: Path) -> PreTrainedTokenizerBase:
    """The transformers tokenizer of a local folder or ``.gguf`` file, offline, with a pad token."""
    __tracebackhide__ = True
    from transformers import AutoTokenizer

    source, common = pretrained_arguments(spec, path)
    gguf_bar = silence_gguf_progress_bar() if "gguf_file" in common else None
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **common)
    except (OSError, ValueError) as error:
        raise ModelLoadError(spec, f"could not load the tokenizer at {str(path)!r}: {type(error).__name__}: "
                             f"{error}") from error
    finally:
        if gguf_bar is not None:
            gguf_bar()
    ensure_pad_token(tokenizer)
    return tokenizer


def pretrained_arguments(spec: str, path: Path) -> tuple[str, dict[str, Any]]:
    """``from_pretrained``'s source and keywords for a folder or a ``.gguf`` file: offline, no remote
    code. ``local_files_only`` keeps loading offline (the hub library reads HF_HUB_OFFLINE only at
    import)."""
    __tracebackhide__ = True
    common: dict[str, Any] = {"local_files_only": True, "trust_remote_code": False}
    if not (path.suffix == ".gguf" and path.is_file()):
        return str(path), common
    require_gguf_support(spec)
    return str(path.parent), {**common, "gguf_file": path.name}


def ensure_pad_token(tokenizer: PreTrainedTokenizerBase) -> None:
    if tokenizer.pad_token_id is None:
        # Pad positions are masked out, so any id works: EOS where there is one (what most
        # checkpoints expect), else the vocabulary's first token.
        tokenizer.pad_token = tokenizer.eos_token if tokenizer.eos_token_id is not None \
            else tokenizer.convert_ids_to_tokens(0)


# What the [gguf] extra installs (pyproject.toml), as the hint for a missing one names it.
GGUF_REQUIREMENTS = {"gguf": ">=0.10", "accelerate": ">=1.0"}


def require_gguf_support(spec: str) -> None:
    import importlib.util

    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        # The packages themselves, not the [gguf] extra: a plugin installed from a path or a wheel
        # is not on the index under its name. The versions are the extra's (pyproject.toml).
        wanted = " ".join(f"'{name}{GGUF_REQUIREMENTS[name]}'" for name in missing)
        raise ModelLoadError(spec, f"loading .gguf files needs {' and '.join(missing)}: pip install {wanted}")


def silence_gguf_progress_bar() -> Callable[[], None] | None:
    """transformers' GGUF conversion shows a tqdm bar that ignores its own progress-bar switch; it
    would land in the captured stderr of the first failing test. Returns what restores it."""
    import functools

    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        return None
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        return None
    gguf_utils.tqdm = functools.partial(original, disable=True)

    def restore() -> None:
        gguf_utils.tqdm = original

    return restore


@contextmanager
def clean_generation_config(model: Any) -> Iterator[None]:
    """Within the block the model's ``generation_config`` is a fresh ``GenerationConfig``: ``generate``
    fills every unset field from it, so a checkpoint's own sampling defaults would leak in. Put back
    afterwards, also on an error."""
    from transformers import GenerationConfig

    checkpoint_config = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = checkpoint_config


def checkpoint_eos_ids(path: Path, tokenizer: Any) -> list[int]:
    """The EOS ids the transformers backend uses for ``path`` (a folder): the generation config's,
    else the model config's, else the tokenizer's. Other engines stop on the same ids, so a golden
    of one engine and a check on another run the same generation config."""
    for name in ("generation_config.json", "config.json"):
        eos = read_json(path / name).get("eos_token_id")
        if eos is not None:
            return [eos] if isinstance(eos, int) else [int(t) for t in eos]
    return [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]


def read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
