"""Artifacts are untrusted input: `llm-golden accept` writes only `__golden__` files inside the root,
all or nothing, and `show`/`diff` read only regular files (DESIGN.md §11)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_llmdeterminism import cli
from pytest_llmdeterminism.goldens.review import plan_accept

VALID = (Path(__file__).parent / "data" / "test_tiny_model.intel-avx512-native-0.1.0.json").read_bytes()
NEWER_SCHEMA = VALID.replace(b'"schema": 1', b'"schema": 2')


def put(folder: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def all_files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir())


@pytest.fixture
def root(tmp_path):
    (tmp_path / "root").mkdir()
    return tmp_path / "root"


def accept(candidates, root, *args):
    return cli.main(["accept", str(candidates), "--root", str(root), *args])


# -- accept: what may be written, and where ------------------------------------------------------


def test_files_outside_a_golden_folder_refuse_the_whole_accept(tmp_path, root, capsys):
    candidates = put(tmp_path / "candidates", {"evil.json": VALID, ".github/workflows/evil.json": VALID,
                                               "tests/__golden__/test_x.json": VALID})
    assert accept(candidates, root) == 2
    err = capsys.readouterr().err
    assert f"llm-golden: not in a __golden__ folder: {candidates}/.github/workflows/evil.json, " \
           f"{candidates}/evil.json. accept writes only golden files" in err
    assert "give --golden-dir D" in err
    assert err.rstrip().endswith("nothing was accepted: every candidate is checked before any file is "
                                 "written. Fix the problems above and run accept again.")
    assert all_files(root) == []


def test_golden_files_are_merged_into_the_same_path_under_the_root(tmp_path, root, capsys):
    candidates = put(tmp_path / "candidates", {"tests/__golden__/test_x.json": VALID})
    assert accept(candidates, root) == 0
    assert all_files(root) == ["tests/__golden__/test_x.json"]
    assert "accepted tests/__golden__/test_x.json ['test_capital'] (cpu/float32)" in capsys.readouterr().out


def test_golden_dir_accepts_goldens_kept_under_llm_golden_dir(tmp_path, root, capsys):
    candidates = put(tmp_path / "candidates", {"goldens/tests/test_x.json": VALID})
    assert accept(candidates, root) == 2
    assert "not in a __golden__ folder: " in capsys.readouterr().err
    assert accept(candidates, root, "--golden-dir", "goldens") == 0
    assert all_files(root) == ["goldens/tests/test_x.json"]
    assert accept(candidates, root, "--golden-dir", "../goldens") == 2
    assert "--golden-dir '../goldens' must be a folder inside the root" in capsys.readouterr().err


def test_a_symlinked_folder_in_the_candidates_is_refused(tmp_path, root, capsys):
    outside = put(tmp_path / "outside", {"__golden__/test_y.json": VALID})
    candidates = put(tmp_path / "candidates", {"tests/__golden__/test_x.json": VALID})
    (candidates / "linked").symlink_to(outside)
    assert accept(candidates, root) == 2
    err = capsys.readouterr().err
    assert f"symbolic links in {candidates}: {candidates}/linked. accept follows none" in err
    assert all_files(root) == []


def test_a_symlinked_golden_file_in_the_candidates_is_refused(tmp_path, root, capsys):
    secret = put(tmp_path / "outside", {"test_y.json": VALID}) / "test_y.json"
    candidates = tmp_path / "candidates" / "tests" / "__golden__"
    candidates.mkdir(parents=True)
    (candidates / "test_x.json").symlink_to(secret)
    assert accept(candidates.parent.parent, root) == 2
    assert f"{candidates}/test_x.json. accept follows none" in capsys.readouterr().err
    assert all_files(root) == []


def test_a_golden_folder_in_the_root_that_links_out_of_it_is_refused(tmp_path, root, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "tests").mkdir()
    (root / "tests" / "__golden__").symlink_to(outside)
    candidates = put(tmp_path / "candidates", {"tests/__golden__/test_x.json": VALID})
    assert accept(candidates, root) == 2
    err = capsys.readouterr().err
    assert f"{root}/tests/__golden__/test_x.json resolves to {outside}/test_x.json, outside the root" in err
    assert list(outside.iterdir()) == []


def test_an_invalid_candidate_after_a_valid_one_writes_nothing(tmp_path, root, capsys):
    candidates = put(tmp_path / "candidates", {"a/__golden__/test_a.json": VALID,
                                               "b/__golden__/test_b.json": NEWER_SCHEMA})
    assert accept(candidates, root) == 2
    assert "test_b.json' has schema version 2" in capsys.readouterr().err
    assert all_files(root) == []


def test_a_corrupt_golden_in_the_root_writes_nothing(tmp_path, root, capsys):
    candidates = put(tmp_path / "candidates", {"a/__golden__/test_a.json": VALID,
                                               "b/__golden__/test_b.json": VALID})
    put(root, {"b/__golden__/test_b.json": b"{"})
    assert accept(candidates, root) == 2
    assert "test_b.json' is not valid JSON" in capsys.readouterr().err
    assert all_files(root) == ["b/__golden__/test_b.json"]
    assert (root / "b/__golden__/test_b.json").read_bytes() == b"{"


def test_a_folder_without_goldens_names_the_layout_expected(tmp_path, root, capsys):
    (tmp_path / "candidates").mkdir()
    assert accept(tmp_path / "candidates", root) == 2
    err = capsys.readouterr().err
    assert f"no candidate goldens (*.json) under {tmp_path / 'candidates'}: expected the golden files that " \
           f"--llm-golden-artifacts={tmp_path / 'candidates'} writes, e.g. " \
           f"{tmp_path / 'candidates/tests/__golden__/test_x.json'}" in err


def test_the_plan_names_every_problem_at_once(tmp_path, root):
    candidates = put(tmp_path / "candidates", {"evil.json": b"not json", "tests/__golden__/ok.json": VALID,
                                               "tests/__golden__/bad.json": NEWER_SCHEMA})
    accepted, problems = plan_accept(candidates, root)
    assert [a.name for a in accepted] == [Path("tests/__golden__/ok.json")]
    assert len(problems) == 3  # evil.json outside, evil.json not JSON, bad.json of another schema


# -- show and diff read only regular files -------------------------------------------------------


def llm_golden(*args):
    return subprocess.run([sys.executable, "-m", "pytest_llmdeterminism.cli", *map(str, args)],
                          capture_output=True, text=True, check=False, timeout=60)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_show_and_diff_refuse_a_fifo_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "base" / "test_x.json"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    put(tmp_path / "cand", {"test_x.json": VALID})
    for args in (("show", fifo), ("diff", fifo, tmp_path / "cand" / "test_x.json"),
                 ("diff", tmp_path / "base", tmp_path / "cand")):
        result = llm_golden(*args)
        assert result.returncode == 2, result.stderr
        assert result.stderr == f"llm-golden: golden file {str(fifo)!r} is not a regular file (a FIFO). " \
                                "The file was left untouched. Give the path of a golden file (*.json).\n"


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero here")
def test_show_and_diff_refuse_a_device_instead_of_reading_it_forever(tmp_path):
    (tmp_path / "cand").mkdir()
    (tmp_path / "cand" / "test_x.json").symlink_to("/dev/zero")
    put(tmp_path / "base", {"test_x.json": VALID})
    for args in (("show", "/dev/zero"), ("diff", tmp_path / "base", tmp_path / "cand")):
        result = llm_golden(*args)
        assert result.returncode == 2, result.stderr
        assert "is not a regular file (a character device)" in result.stderr
