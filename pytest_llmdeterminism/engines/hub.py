"""Hub ids (``ORG/NAME``, ``ORG/NAME@REVISION``) found in the local Hugging Face cache, never downloaded.

``huggingface_hub`` reads its own cache: ``snapshot_download(local_files_only=True)`` resolves a
branch, tag or full commit the way transformers would, and ``scan_cache_dir`` lists what is cached
(for a commit prefix, and for the message when the model is not there). The cache is the one
``huggingface_hub`` uses: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``,
as read when the library was imported.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_llmdeterminism.engines.spec import HubId
from pytest_llmdeterminism.errors import ModelLoadError

if TYPE_CHECKING:
    from huggingface_hub import CachedRepoInfo

_COMMIT_PREFIX = re.compile(r"[0-9a-f]{4,40}")


@dataclass(frozen=True)
class HubSnapshot:
    """Where a hub id's files are: the cache's snapshot folder of one commit."""

    hub_id: HubId
    commit: str
    folder: Path


def cache_folder() -> Path:
    """The hub cache ``huggingface_hub`` reads (and ``hf download`` writes)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def find(spec: str, hub_id: HubId) -> HubSnapshot:
    """The cached snapshot of ``hub_id``, or a :class:`ModelLoadError` naming the cache searched and
    the ``hf download`` command that puts the model there."""
    __tracebackhide__ = True
    from huggingface_hub import errors, snapshot_download

    cache = cache_folder()
    try:
        folder = snapshot_download(hub_id.repo, revision=hub_id.revision or "main", cache_dir=cache,
                                   local_files_only=True)
    except errors.LocalEntryNotFoundError as error:
        if isinstance(error, getattr(errors, "IncompleteSnapshotError", ())):  # newer huggingface_hub
            raise ModelLoadError(spec, f"{error} It was looked for in {_described(cache)}; complete it with "
                                 f"`{_download_command(hub_id)}`") from None
        folder = None
    found = Path(folder) if folder is not None else _by_commit_prefix(spec, hub_id, cache)
    return HubSnapshot(hub_id, found.name, found)  # the cache names each snapshot folder by its commit


def _by_commit_prefix(spec: str, hub_id: HubId, cache: Path) -> Path:
    """The snapshot whose commit starts with the revision asked for; else the error."""
    __tracebackhide__ = True
    repo = _cached_repo(hub_id.repo, cache)
    revision = hub_id.revision or ""
    if repo is not None and _COMMIT_PREFIX.fullmatch(revision):
        matches = sorted((r for r in repo.revisions if r.commit_hash.startswith(revision)),
                         key=lambda r: r.commit_hash)
        if len(matches) == 1:
            return matches[0].snapshot_path
        if matches:
            commits = ", ".join(match.commit_hash[:12] for match in matches)
            raise ModelLoadError(spec, f"the commit prefix {revision!r} matches {len(matches)} cached "
                                 f"commits of {hub_id.repo} ({commits}); give more of the commit hash")
    raise ModelLoadError(spec, _not_cached(hub_id, repo, cache))


def _cached_repo(repo_id: str, cache: Path) -> CachedRepoInfo | None:
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        scanned = scan_cache_dir(cache)
    except (CacheNotFound, OSError, ValueError):
        return None
    models = (repo for repo in scanned.repos if repo.repo_type == "model" and repo.repo_id == repo_id)
    return next(models, None)


def _not_cached(hub_id: HubId, repo: CachedRepoInfo | None, cache: Path) -> str:
    if repo is None:
        what = (f"no local folder or .gguf file is named {hub_id.repo!r}, and the Hugging Face cache holds "
                f"no {hub_id.repo}")
    else:
        cached = sorted(f"{', '.join(sorted(revision.refs)) or 'commit'} {revision.commit_hash[:12]}"
                        for revision in repo.revisions)
        what = (f"the Hugging Face cache holds {hub_id.repo}, but not revision {hub_id.revision or 'main'!r} "
                f"(cached: {'; '.join(cached) or 'nothing'})")
    return (f"{what}. Searched {_described(cache)}. The plugin never downloads; put the model in that cache "
            f"once with `{_download_command(hub_id)}`, or set llm_model to a local folder")


def _download_command(hub_id: HubId) -> str:
    return f"hf download {hub_id.repo}" + (f" --revision {hub_id.revision}" if hub_id.revision else "")


def _described(cache: Path) -> str:
    """The cache folder and the setting that chose it."""
    if os.environ.get("HF_HUB_CACHE"):
        why = "from HF_HUB_CACHE"
    elif os.environ.get("HF_HOME"):
        why = "HF_HOME/hub"
    else:
        why = "the default; HF_HUB_CACHE or HF_HOME point elsewhere"
    return f"{str(cache)!r} ({why})"
