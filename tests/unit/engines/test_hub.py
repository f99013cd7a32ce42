"""Hub ids (``ORG/NAME[@REVISION]``) read offline from the local Hugging Face cache (engines/hub.py):
their form, a revision as a branch, tag, commit or prefix, what is missing or ambiguous said so, and
a cached id generating like its files with a fingerprint naming the commit."""

from __future__ import annotations

import pytest

from pytest_llmdeterminism.engines import hub, load
from pytest_llmdeterminism.engines.spec import HubId
from pytest_llmdeterminism.errors import ModelLoadError
from pytest_llmdeterminism.model.fingerprint import fingerprint
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings
from tests.helpers.hub import NEW, OLD, REPO
from tests.helpers.models import in_hub_cache


@pytest.mark.parametrize(("text", "parsed"), [
    ("HuggingFaceTB/SmolLM2-135M-Instruct", HubId("HuggingFaceTB/SmolLM2-135M-Instruct")),
    ("Org/Tiny@v1.0", HubId(REPO, "v1.0")),
    ("Org/Tiny@refs/pr/1", HubId(REPO, "refs/pr/1")),
    (f"Org/Tiny@{OLD[:7]}", HubId(REPO, OLD[:7])),
    ("models/model.gguf", None),  # a missing GGUF file is a path, not a repo
    ("./Org/Tiny", None),
    ("/Org/Tiny", None),
    ("Org/Tiny/extra", None),
    ("tiny", None),  # a bare NAME reads as a folder
    ("Org--x/Tiny", None),
    ("Org/Tiny@", None),
    ("llamacpp:Org/Tiny", None),
])
def test_a_hub_id_is_org_slash_name_with_an_optional_revision(text, parsed):
    assert HubId.parse(text) == parsed


def test_a_cached_hub_id_generates_like_its_files_and_its_fingerprint_names_the_commit(hub_cache, tiny):
    snapshot = in_hub_cache(hub_cache, REPO, OLD)
    loaded = load(REPO, dtype="float32", device="cpu")
    assert (loaded.path, loaded.hub_commit) == (snapshot, OLD)
    settings = GenerationSettings(BatchShape(1, 16), 6, 0)
    prompt = "Q: What is the capital of Japan? A:"
    expected = LLMModel(tiny, settings).generate(prompt).token_ids
    assert LLMModel(loaded, settings).generate(prompt).token_ids == expected
    found = fingerprint(loaded)
    assert (found["model"], found["model_commit"]) == (REPO, OLD)
    assert found["weights_hash"] == fingerprint(tiny)["weights_hash"]
    assert "model_commit" not in fingerprint(tiny)


@pytest.mark.parametrize(("revision", "commit"), [
    (None, NEW), ("main", NEW), ("v1", OLD), (OLD, OLD), (OLD[:7], OLD), (NEW[:4], NEW),
])
def test_a_revision_is_a_branch_a_tag_a_commit_or_its_prefix(hub_cache, revision, commit):
    in_hub_cache(hub_cache, REPO, OLD, refs=("v1",))
    in_hub_cache(hub_cache, REPO, NEW, refs=("main",))
    asked = HubId(REPO, revision)
    found = hub.find(str(asked), asked)
    assert (found.commit, found.folder) == (commit, hub_cache / "models--Org--Tiny" / "snapshots" / commit)


def test_a_revision_not_in_the_cache_lists_what_is_cached_and_the_download(hub_cache):
    in_hub_cache(hub_cache, REPO, OLD, refs=("main", "v1"))
    with pytest.raises(ModelLoadError) as refused:
        hub.find("Org/Tiny@v9", HubId(REPO, "v9"))
    assert str(refused.value) == (
        "cannot load llm_model 'Org/Tiny@v9': the Hugging Face cache holds Org/Tiny, but not revision 'v9' "
        f"(cached: main, v1 {OLD[:12]}). Searched {str(hub_cache)!r} (from HF_HUB_CACHE). The plugin never "
        "downloads; put the model in that cache once with `hf download Org/Tiny --revision v9`, or set "
        "llm_model to a local folder")


def test_an_ambiguous_commit_prefix_asks_for_more_of_it(hub_cache):
    in_hub_cache(hub_cache, REPO, OLD)
    in_hub_cache(hub_cache, REPO, OLD[:6] + NEW[6:], refs=())
    with pytest.raises(ModelLoadError, match=r"the commit prefix '012345' matches 2 cached commits of "
                                             r"Org/Tiny \(0123456789ab, 012345987654\); give more"):
        hub.find("Org/Tiny@012345", HubId(REPO, "012345"))


@pytest.mark.parametrize("revision", ["..", ".", "../..", "refs/../main", "a/../../x", ".hidden", "v1..v2"])
def test_a_revision_spelt_as_a_path_is_refused_by_name(hub_cache, revision):
    """``Org/Tiny@..`` once climbed out of the cache's refs folder (a raw IsADirectoryError)."""
    in_hub_cache(hub_cache, REPO, OLD, refs=("main",))
    with pytest.raises(ModelLoadError) as refused:
        hub.find(f"{REPO}@{revision}", HubId(REPO, revision))
    assert str(refused.value) == (
        f"cannot load llm_model 'Org/Tiny@{revision}': revision {revision!r} is not a branch, tag or commit: "
        "no part of a revision may begin with '.' or hold '..' (git's rule; the cache reads revisions as "
        "paths). Name one, e.g. llm_model = Org/Tiny@main, or Org/Tiny@<commit hash>")


def ref_to_a_missing_snapshot(repo):
    (repo / "refs" / "broken").write_text(NEW)


def ref_that_is_not_text(repo):
    (repo / "refs" / "broken").write_bytes(b"\xff\xfe")


def stray_file_among_snapshots(repo):
    (repo / "snapshots" / "README").write_text("notes")


@pytest.mark.parametrize(("damage", "skipped"), [
    (ref_to_a_missing_snapshot, f"; skipped, damaged: ref 'broken' names commit {NEW!r}, which has no "
                                "snapshot folder; delete those ref files or download them again"),
    (ref_that_is_not_text, "; skipped, damaged: ref 'broken' is not readable text; delete those ref files or "
                           "download them again"),
    (stray_file_among_snapshots, ""),
])
def test_one_bad_entry_in_the_cache_hides_no_good_revision(hub_cache, damage, skipped):
    """huggingface_hub's cache scan drops a whole repository for one bad ref: a commit prefix then
    read as "the cache holds no Org/Tiny". The bad entry is skipped and named instead."""
    in_hub_cache(hub_cache, REPO, OLD, refs=("main", "v1"))
    damage(hub_cache / "models--Org--Tiny")
    assert hub.find(f"{REPO}@{OLD[:7]}", HubId(REPO, OLD[:7])).commit == OLD
    assert hub.find(REPO, HubId(REPO)).commit == OLD
    with pytest.raises(ModelLoadError) as refused:
        hub.find("Org/Tiny@v9", HubId(REPO, "v9"))
    assert f"holds Org/Tiny, but not revision 'v9' (cached: main, v1 {OLD[:12]}{skipped}). Searched" \
        in str(refused.value)


@pytest.mark.parametrize("ref", ["main", "v1"])
def test_a_ref_asked_for_that_cannot_be_read_is_explained(hub_cache, ref):
    """A ref file that is a folder, or not text: huggingface_hub's IsADirectoryError or
    UnicodeDecodeError once reached the user raw."""
    in_hub_cache(hub_cache, REPO, OLD, refs=("main", "v1"))
    refs = hub_cache / "models--Org--Tiny" / "refs"
    (refs / ref).unlink()
    if ref == "main":
        (refs / ref).mkdir()
    else:
        (refs / ref).write_bytes(b"\xff\xfe")
    with pytest.raises(ModelLoadError, match=rf"holds Org/Tiny, but not revision '{ref}' \(cached: "):
        hub.find(f"{REPO}@{ref}", HubId(REPO, ref))
