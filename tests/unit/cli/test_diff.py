"""`llm-golden diff` (cli/diff.py) on golden files, without a pytest run: a candidate of a variant the
base lacks compared with the plugin's fallback, a base variant absent only when unpaired, the
candidate's dtype setting the tie margin, folders a level apart named, tokens shown without a model."""

import json
from pathlib import Path

from pytest_llmdeterminism.goldens import schema, store
from pytest_llmdeterminism.goldens.review import ABSENT, NEW, needs_review, review_goldens
from tests.helpers.cli_diff import RECORDED
from tests.helpers.projects import llm_golden


def recorded_entry(key="test_capital"):
    return store.read(RECORDED)[key]["cpu/float32"]


def test_a_candidate_of_a_variant_base_lacks_is_compared_with_the_plugins_fallback():
    entry = recorded_entry()
    base = {"test_capital": {"cuda/float16": entry, "cpu/float32": entry}}
    candidate = {"test_capital": {"cpu/bfloat16": entry}}
    cases = review_goldens("test_x.json", base, candidate)
    # Same device class first (the --llm-golden-fallback rule); the GPU golden had no candidate.
    assert [(c.variant, c.verdict, c.compared_with) for c in cases] == [
        ("cpu/bfloat16", "IDENTICAL", "cpu/float32"),
        ("cuda/float16", ABSENT, None),
    ]


def test_a_base_variant_is_absent_only_when_no_candidate_was_paired_with_it():
    entry = recorded_entry()
    base = {"test_capital": {"cpu/float32": entry}, "test_gone": {"cpu/float32": entry}}
    candidate = {"test_capital": {"cpu/float32": entry, "cpu/bfloat16": entry},
                 "test_new": {"cpu/float32": entry}}
    cases = review_goldens("test_x.json", base, candidate)
    assert [(c.key, c.variant, c.verdict, c.compared_with) for c in cases] == [
        ("test_capital", "cpu/bfloat16", "IDENTICAL", "cpu/float32"),
        ("test_capital", "cpu/float32", "IDENTICAL", None),
        ("test_gone", "cpu/float32", ABSENT, None),
        ("test_new", "cpu/float32", NEW, None),
    ]
    assert [c.key for c in needs_review(cases, "drift")] == ["test_new"]  # ABSENT never fails


def test_a_candidates_dtype_sets_the_tie_margin():
    """One flip at a golden margin of 0.37: confident for float32, a near tie for bfloat16."""
    golden = store.read(RECORDED)["test_near_tie_prompt"]["cpu/float32"]
    assert 0.05 < golden.steps[0].margin < 0.5
    runner_up = golden.steps[0].top[1][0]
    flipped = schema.to_entry(schema.from_entry(golden))
    flipped["steps"][0]["token"] = runner_up
    for dtype, verdict in (("float32", "REGRESSION"), ("bfloat16", "TIE_FLIP")):
        candidate = dict(flipped, fingerprint=dict(flipped["fingerprint"], dtype=dtype))
        (case,) = review_goldens("t.json", {"k": {"cpu/float32": golden}}, {"k": {"cpu/float32": candidate}})
        assert case.verdict == verdict


def test_folders_a_level_apart_are_named_with_the_pair_to_compare(tmp_path):
    import shutil

    from pytest_llmdeterminism.goldens.review import aligned_folders

    for folder in ("project/tests/__golden__", "cands/tests/__golden__"):
        (tmp_path / folder).mkdir(parents=True)
        for name in ("test_a.json", "test_b.json"):
            shutil.copy(RECORDED, tmp_path / folder / name)
    base, cands = Path("project/tests/__golden__"), Path("cands")
    # CAND given at the artifact's top, BASE at __golden__: CAND must go two folders deeper.
    assert aligned_folders(tmp_path / base, tmp_path / cands) == (tmp_path / base,
                                                                  tmp_path / "cands/tests/__golden__")
    # BASE given one folder too high: BASE goes into __golden__.
    assert aligned_folders(tmp_path / "project/tests", tmp_path / "cands/tests/__golden__") == (
        tmp_path / base, tmp_path / "cands/tests/__golden__")
    assert aligned_folders(tmp_path / base, tmp_path / "cands/tests/__golden__") is None  # already paired
    result = llm_golden("diff", base, cands, cwd=tmp_path)
    assert result.returncode == 1
    assert "NEW" in result.stdout and "ABSENT" in result.stdout
    assert result.stdout.splitlines()[-1] == (
        "hint: no golden file is in both folders, but they pair up when CAND is 'cands/tests/__golden__', a "
        "folder inside the one given: BASE and CAND must mirror each other (both a __golden__ folder, or "
        "both the folder above it). Compare with: llm-golden diff project/tests/__golden__ "
        "cands/tests/__golden__")
    fixed = llm_golden("diff", base, "cands/tests/__golden__", cwd=tmp_path)
    assert fixed.returncode == 0 and "hint:" not in fixed.stdout, fixed.stdout
    too_high = llm_golden("diff", "project/tests", "cands/tests/__golden__", cwd=tmp_path)
    assert "they pair up when BASE is 'project/tests/__golden__'" in too_high.stdout


def test_diff_shows_tokens_as_the_goldens_store_them_without_a_model(tmp_path, capsys):
    from pytest_llmdeterminism.cli.diff import diff

    document = json.loads(RECORDED.read_text())
    base, candidate = tmp_path / "base" / "test_x.json", tmp_path / "cand" / "test_x.json"
    base.parent.mkdir()
    candidate.parent.mkdir()
    base.write_text(json.dumps(document))
    golden = document["goldens"]["test_capital"]["cpu/float32"]
    runner_up = golden["steps"][0]["top"][1][0]
    golden["steps"][0].update(token=runner_up, piece=" Lyon")  # a confident step, flipped
    bare = document["goldens"]["test_near_tie_prompt"]["cpu/float32"]
    bare["steps"][0].update(token=bare["steps"][0]["top"][1][0], piece="")  # a golden with no piece
    candidate.write_text(json.dumps(document))

    assert diff(base.parent, candidate.parent, fail_on="regression") == 1
    lines = {line.split()[2]: line for line in capsys.readouterr().out.splitlines()[:-1]}
    original = json.loads(RECORDED.read_text())["goldens"]["test_capital"]["cpu/float32"]["steps"][0]
    assert f"step 0: {original['piece']!r}({original['token']}) -> ' Lyon'({runner_up})," in \
        lines["['test_capital']['cpu/float32']"], lines
    near = json.loads(RECORDED.read_text())["goldens"]["test_near_tie_prompt"]["cpu/float32"]["steps"][0]
    near_line = lines["['test_near_tie_prompt']['cpu/float32']"]
    assert f"{near['piece']!r}({near['token']}) -> {bare['steps'][0]['token']}, golden margin" in near_line
