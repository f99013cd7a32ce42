"""Artifacts are untrusted input: `llm-golden accept` writes only `__golden__` files inside the root,
all or nothing; `llm-golden merge` follows no path of a shard report out of the goldens the project
configures, and reads only regular reports of a bounded size; `show`/`diff` read only regular files
(DESIGN.md §11)."""

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from pytest_llmdeterminism import cli
from pytest_llmdeterminism.goldens.acceptance import plan_accept
from pytest_llmdeterminism.reporting import documents
from pytest_llmdeterminism.reporting.records import CheckRecord, RunRecord
from pytest_llmdeterminism.run.prune_trust import checkout_commit
from tests.helpers import DATA
from tests.helpers.projects import git_checkout, llm_golden

VALID = (DATA / "test_tiny_model.intel-avx512-native-0.1.0.json").read_bytes()
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


def test_accept_takes_llm_golden_dir_from_the_projects_configuration(tmp_path, root, capsys, monkeypatch):
    put(root, {"pyproject.toml": b'[tool.pytest.ini_options]\nllm_golden_dir = "goldens"\n',
               "tests/x.py": b""})
    candidates = put(tmp_path / "candidates", {"goldens/tests/test_x.json": VALID})
    monkeypatch.chdir(root / "tests")  # anywhere in the project, as pytest finds it
    assert cli.main(["accept", str(candidates)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (f"configuration: {root}/pyproject.toml (root {root}): "
                                   "llm_golden_dir = goldens")
    assert all_files(root) == ["goldens/tests/test_x.json", "pyproject.toml", "tests/x.py"]


def test_accept_skips_files_without_pytest_settings_and_a_given_golden_dir_wins(tmp_path, root, capsys,
                                                                               monkeypatch):
    put(root, {"pytest.ini": b"[pytest]\nllm_golden_dir = goldens\n", "sub/tox.ini": b"[tox]\nenvlist = py\n",
               "sub/setup.cfg": b"[metadata]\nname = x\n"})
    candidates = put(tmp_path / "candidates", {"other/test_x.json": VALID})
    monkeypatch.chdir(root / "sub")
    assert cli.main(["accept", str(candidates)]) == 2
    out, err = capsys.readouterr()
    assert out == f"configuration: {root}/pytest.ini (root {root}): llm_golden_dir = goldens\n"
    assert f"not in a __golden__ folder or under the golden dir goldens/: {candidates}/other/test_x" in err
    assert cli.main(["accept", str(candidates), "--golden-dir", "other"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"configuration: {root}/pytest.ini (root {root}); --golden-dir other as given\n")
    assert "accepted other/test_x.json" in out and (root / "other" / "test_x.json").is_file()


def test_diff_of_a_candidates_folder_alone_compares_it_with_the_projects_goldens(tmp_path, root, capsys,
                                                                                  monkeypatch):
    put(root, {"pyproject.toml": b'[tool.pytest.ini_options]\nllm_golden_dir = "goldens"\n',
               "goldens/tests/test_x.json": VALID})
    candidates = put(tmp_path / "candidates", {"goldens/tests/test_x.json": VALID, "evil.json": VALID})
    monkeypatch.chdir(root)
    assert cli.main(["diff", str(candidates)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == "configuration: pyproject.toml (root .): llm_golden_dir = goldens"
    assert "IDENTICAL      goldens/tests/test_x.json ['test_capital']['cpu/float32']" in lines
    assert lines[-1] == f"summary: {len(VALID_KEYS)} IDENTICAL; nothing needs review (--fail-on=regression)"
    assert err == (f"llm-golden diff: ignored 1 JSON file(s) under {candidates} (evil.json) that are not "
                   "goldens (in no __golden__ folder and not under goldens/; accept would refuse them)\n")


def test_accept_names_a_configuration_file_it_cannot_read(tmp_path, root, capsys):
    put(root, {"pyproject.toml": b"[tool.pytest.ini_options\n"})
    assert accept(put(tmp_path / "candidates", {"__golden__/test_x.json": VALID}), root) == 2
    assert capsys.readouterr().err.startswith(f"llm-golden accept: {root}/pyproject.toml cannot be read as "
                                              "pytest would read it (")
    assert all_files(root) == ["pyproject.toml"]


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


# -- merge: a shard report is an artifact too ------------------------------------------------------

MAX_REPORT_BYTES = 256 * 1024 * 1024  # the limit merge's help states
# VALID holds these keys; a report whose only test is test_a.py::test_other makes all of them unused.
VALID_KEYS = sorted(msgspec.json.decode(VALID)["goldens"])


TEST_OTHER = b"def test_other(llm_model, golden_tokens):\n    pass\n"


def shard_report(folder: Path, golden_files: dict[str, str], *, candidates: str | None = None,
                 tests: tuple[str, ...] = ("test_other",), failed: bool = False,
                 checks: list[CheckRecord] | None = None, used: list[tuple[str, str]] | None = None,
                 commit: str | None = "HEAD") -> Path:
    """A complete, passing shard of ``tests`` in each module, its report in ``folder``; ``commit``: the
    commit it ran at ("HEAD": the one checked out where ``folder`` is); ``used``: by default, the
    goldens its ``checks`` compared with."""
    outcomes = {f"{module}::{test}": "passed" for module in golden_files for test in tests}
    folder.mkdir(parents=True, exist_ok=True)
    if used is None:
        used = [(golden_files[check.test.partition("::")[0]], check.name) for check in checks or []]
    run = RunRecord(suite=sorted(outcomes), selected=sorted(outcomes), outcomes=outcomes,
                    golden_files=golden_files, used=used, stopped=[], partial=[], failed=failed,
                    candidates=candidates, commit=checkout_commit(folder) if commit == "HEAD" else commit)
    (folder / "report.json").write_text(documents.json_text(documents.run_report(checks or [], [], run=run)))
    return folder / "report.json"


def test_merge_keeps_the_goldens_of_tests_the_checkout_defines_that_no_report_names(project, monkeypatch,
                                                                                   capsys):
    """A report is an artifact: one naming one test of a module does not speak for the module's others."""
    defined = "".join(f"def {name}(llm_model, golden_tokens):\n    pass\n\n" for name in
                      ("test_other", "test_capital", "test_capitals", "test_batch_of_prompts",
                       "test_near_tie_prompt"))
    put(project, {"test_a.py": defined.encode()})
    report = shard_report(project / "shard", {"test_a.py": "__golden__/test_a.json"})  # test_other alone
    status, out, err = merge(project, monkeypatch, capsys, report, "--prune")
    assert status == 0, err
    assert (project / "__golden__/test_a.json").read_bytes() == VALID
    assert "pruned" not in out and "unused golden" not in out
    # The negative control: the module defines one of them no more, so its goldens alone are unused.
    put(project, {"test_a.py": defined.replace("test_near_tie_prompt", "test_renamed").encode()})
    status, out, err = merge(project, monkeypatch, capsys, report, "--prune")
    assert status == 0, err
    assert out.splitlines()[-2:] == ["pruned 1 unused golden(s):",
                                     "  __golden__/test_a.json ['test_near_tie_prompt']"]


def test_merge_keeps_every_golden_of_a_module_the_checkout_does_not_have(project, monkeypatch, capsys):
    report = shard_report(project / "shard", {"test_a.py": "__golden__/test_a.json"})  # no test_a.py here
    status, out, err = merge(project, monkeypatch, capsys, report, "--prune")
    assert status == 0, err
    assert (project / "__golden__/test_a.json").read_bytes() == VALID and "pruned" not in out


def test_merge_believes_a_failed_check_over_a_report_that_says_it_did_not_fail(project, monkeypatch, capsys):
    put(project, {"test_a.py": TEST_OTHER})
    record = CheckRecord(test="test_a.py::test_other", name="test_other", variant="cpu/float32",
                         verdict="REGRESSION", passed=False)
    report = shard_report(project / "shard", {"test_a.py": "__golden__/test_a.json"}, checks=[record])
    status, out, err = merge(project, monkeypatch, capsys, report, "--prune")
    assert status == 1, out + err
    assert "unused goldens not pruned: the shards together ran the whole suite, but some tests failed" in out
    assert (project / "__golden__/test_a.json").read_bytes() == VALID


def test_merge_refuses_a_report_whose_tests_ran_outside_its_own_suite(project, monkeypatch, capsys):
    report = shard_report(project / "shard", {"test_a.py": "__golden__/test_a.json"})
    document = msgspec.json.decode(report.read_bytes())
    document["run"]["suite"] = []
    report.write_bytes(msgspec.json.encode(document))
    status, out, err = merge(project, monkeypatch, capsys, report, "--prune")
    assert status == 2 and "says tests ran that its suite does not hold (test_a.py::test_other)" in err
    assert (project / "__golden__/test_a.json").read_bytes() == VALID


@pytest.fixture
def project(root):
    """A project root with its pytest.ini (so nothing above it is found) and one module's goldens."""
    put(root, {"pytest.ini": b"[pytest]\n", "__golden__/test_a.json": VALID, "__golden__/test_b.json": VALID})
    git_checkout(root)
    return root


def merge(project, monkeypatch, capsys, *args):
    monkeypatch.chdir(project)
    status = cli.main(["merge", *(os.path.relpath(a, project) if isinstance(a, Path) else a for a in args)])
    out, err = capsys.readouterr()
    return status, out, err


def test_merge_prunes_the_goldens_of_a_report_that_names_its_own_modules_only(project, monkeypatch, capsys):
    put(project, {"test_a.py": TEST_OTHER})  # the checkout's module: none of VALID's tests is left in it
    report = shard_report(project / "shard", {"test_a.py": "__golden__/test_a.json"})
    status, out, err = merge(project, monkeypatch, capsys, report, "--prune")
    assert status == 0, err
    assert out.startswith("configuration: pytest.ini (root .): no llm_golden_dir")
    assert f"pruned {len(VALID_KEYS)} unused golden(s):" in out
    assert not (project / "__golden__/test_a.json").exists()  # every key unused: the file goes
    assert (project / "__golden__/test_b.json").read_bytes() == VALID


@pytest.mark.parametrize("where", ["absolute", "climbing"])
def test_merge_refuses_a_report_naming_a_golden_file_outside_the_root(tmp_path, project, monkeypatch, capsys,
                                                                      where):
    outside = put(tmp_path / "elsewhere", {"__golden__/x.json": VALID}) / "__golden__" / "x.json"
    named = str(outside) if where == "absolute" else "../elsewhere/__golden__/x.json"
    report = shard_report(project / "shard", {"test_a.py": named})
    status, out, err = merge(project, monkeypatch, capsys, report, "--prune")
    assert status == 2, out
    assert outside.read_bytes() == VALID and "pruned" not in out
    assert (f"llm-golden merge: shard/report.json: 'golden_files' maps 'test_a.py' to {named!r}, but the "
            "project keeps test_a.py's goldens in '__golden__/test_a.json' (beside each test module in "
            "__golden__/, as no llm_golden_dir is set); merge reads and prunes only that file. A shard "
            "report is CI artifact input") in err
    assert err.rstrip().endswith("nothing was written: every shard is checked before any file is written. "
                                 "Fix the problems above and run merge again.")


def test_merge_refuses_a_report_mapping_a_module_to_another_modules_goldens(project, monkeypatch, capsys):
    fine = shard_report(project / "shard1", {"test_a.py": "__golden__/test_a.json"})
    hostile = shard_report(project / "shard2", {"test_c.py": "__golden__/test_b.json"})
    status, out, err = merge(project, monkeypatch, capsys, fine, hostile, "--prune")
    assert status == 2, out
    assert "shard2/report.json: 'golden_files' maps 'test_c.py' to '__golden__/test_b.json', but the " \
           "project keeps test_c.py's goldens in '__golden__/test_c.json'" in err
    # Checked before anything is deleted: the honest shard's goldens are untouched too.
    assert (project / "__golden__/test_a.json").read_bytes() == VALID
    assert (project / "__golden__/test_b.json").read_bytes() == VALID


def test_merge_refuses_a_golden_folder_that_links_out_of_the_root(tmp_path, project, monkeypatch, capsys):
    outside = put(tmp_path / "outside", {"test_c.json": VALID})
    (project / "sub").mkdir()
    (project / "sub" / "__golden__").symlink_to(outside)
    report = shard_report(project / "shard", {"sub/test_c.py": "sub/__golden__/test_c.json"})
    status, out, err = merge(project, monkeypatch, capsys, report, "--prune")
    assert status == 2, out
    assert (outside / "test_c.json").read_bytes() == VALID
    assert (f"'golden_files' maps 'sub/test_c.py' to 'sub/__golden__/test_c.json', and "
            f"{project}/sub/__golden__ is a symbolic link: {project}/sub/__golden__/test_c.json resolves to "
            f"{outside}/test_c.json, outside {project}") in err


def test_merge_refuses_a_module_that_climbs_out_of_the_root(tmp_path, project, monkeypatch, capsys):
    outside = put(tmp_path / "elsewhere", {"__golden__/test_x.json": VALID}) / "__golden__" / "test_x.json"
    climbing = {"../elsewhere/test_x.py": "../elsewhere/__golden__/test_x.json"}
    report = shard_report(project / "shard", climbing)
    status, out, err = merge(project, monkeypatch, capsys, report, "--prune")
    assert status == 2, out
    assert outside.read_bytes() == VALID
    assert "maps '../elsewhere/test_x.py' to '../elsewhere/__golden__/test_x.json', but a test module is a " \
           "path inside the root, relative to it, without '..'" in err


@pytest.mark.parametrize("how", ["climbing", "linked"])
def test_merge_refuses_candidates_outside_the_reports_own_folder(tmp_path, project, monkeypatch, capsys, how):
    put(tmp_path / "outside", {"__golden__/test_a.json": VALID})
    shard = project / "shard"
    shard.mkdir()
    if how == "linked":
        (shard / "candidates").symlink_to(tmp_path / "outside")
    given = "candidates" if how == "linked" else str(Path(os.path.relpath(tmp_path / "outside", shard)))
    report = shard_report(shard, {"test_a.py": "__golden__/test_a.json"}, candidates=given)
    status, out, err = merge(project, monkeypatch, capsys, report, "--candidates=merged")
    assert status == 2, out
    assert not (project / "merged").exists()
    assert f"llm-golden merge: shard/report.json: 'candidates' is {given!r}, " in err
    assert ("Keep each shard's --llm-golden-artifacts folder inside the folder of its --llm-report, e.g. "
            "--llm-report=shard1/report.json --llm-golden-artifacts=shard1/candidates.") in err


def test_merge_judges_goldens_where_the_projects_llm_golden_dir_keeps_them(project, monkeypatch, capsys):
    put(project, {"pytest.ini": b"[pytest]\nllm_golden_dir = goldens\n", "goldens/test_a.json": VALID})
    beside = shard_report(project / "shard", {"test_a.py": "__golden__/test_a.json"})
    status, out, err = merge(project, monkeypatch, capsys, beside, "--prune")
    assert status == 2 and "keeps test_a.py's goldens in 'goldens/test_a.json' (under llm_golden_dir = " \
                           "goldens)" in err
    assert (project / "__golden__/test_a.json").read_bytes() == VALID
    report = shard_report(project / "shard", {"test_a.py": "goldens/test_a.json"})
    put(project, {"test_a.py": TEST_OTHER})
    status, out, err = merge(project, monkeypatch, capsys, report, "--prune")
    assert status == 0, err
    assert out.startswith("configuration: pytest.ini (root .): llm_golden_dir = goldens\n")
    assert not (project / "goldens/test_a.json").exists()


def test_merge_refuses_an_oversized_report_before_reading_it(project, monkeypatch, capsys):
    report = project / "huge.json"
    with report.open("wb") as handle:
        handle.truncate(MAX_REPORT_BYTES + 1)  # sparse: no disk, and never read
    status, _, err = merge(project, monkeypatch, capsys, report)
    assert status == 2
    assert (f"llm-golden merge: huge.json has {MAX_REPORT_BYTES + 1:,} bytes, more than the limit of "
            f"{MAX_REPORT_BYTES:,} bytes (256 MiB). Give the .json file that `pytest --llm-report=PATH.json` "
            "wrote") in err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_merge_refuses_a_fifo_report_without_waiting_for_a_writer(project):
    os.mkfifo(project / "report.json")
    result = subprocess.run([sys.executable, "-m", "pytest_llmdeterminism.cli", "merge", "report.json"],
                            capture_output=True, text=True, check=False, timeout=30, cwd=project)
    assert result.returncode == 2, result.stderr
    assert "llm-golden merge: report.json is not a regular file (a FIFO). Give the .json" in result.stderr


def test_merge_reads_back_the_infinite_numbers_a_report_wrote_as_null(project, monkeypatch, capsys):
    """Strict JSON has no infinity: a drift beyond every logprob and a step margin with no second
    token are written as null, and a merge of that report must read them as infinite again."""
    import math

    put(project, {"test_a.py": TEST_OTHER})
    record = CheckRecord(test="test_a.py::test_other", name="test_other", variant="cpu/float32",
                         verdict="LOGIT_DRIFT", passed=True, max_logprob_delta=math.inf,
                         steps={"expected": [(" Paris", 7, math.inf, None)]})
    report = shard_report(project / "shard", {"test_a.py": "__golden__/test_a.json"}, checks=[record])
    assert '"max_logprob_delta": null' in report.read_text()
    status, out, err = merge(project, monkeypatch, capsys, report, "--report=merged.json")
    assert status == 0, err
    merged = msgspec.json.decode((project / "merged.json").read_bytes())["checks"][0]
    assert merged["max_logprob_delta"] is None and merged["steps"]["expected"][0][2] is None


def test_merge_prunes_only_on_reports_of_the_commit_checked_out(project, monkeypatch, capsys):
    """A stale report of another commit, or one of no commit, names other tests: nothing is pruned on it."""
    put(project, {"test_a.py": TEST_OTHER})
    for commit, said in (("0" * 40, f"ran at commit {'0' * 40!r}"), (None, "records no commit (its run was "
                                                                      "outside a git checkout, or an older "
                                                                      "pytest-llmdeterminism wrote it)")):
        report = shard_report(project / "shard", {"test_a.py": "__golden__/test_a.json"}, commit=commit)
        status, out, err = merge(project, monkeypatch, capsys, report, "--prune")
        assert status == 2, out + err
        head = checkout_commit(project)
        assert f"shard/report.json {said}, but the checkout at . is at {head}: the goldens its tests did " \
               "not look up may be used by this commit's tests. Merge without --prune" in err
        assert (project / "__golden__/test_a.json").read_bytes() == VALID
        assert merge(project, monkeypatch, capsys, report)[0] == 0  # without --prune, it merges
    # Outside a git checkout no report can show it ran this commit's tests.
    (project / "shard").rename(project.parent / "shard")
    put(project.parent / "elsewhere", {"pytest.ini": b"[pytest]\n", "test_a.py": TEST_OTHER,
                                       "__golden__/test_a.json": VALID})
    status, out, err = merge(project.parent / "elsewhere", monkeypatch, capsys,
                             shard_report(project.parent / "shard", {"test_a.py": "__golden__/test_a.json"}),
                             "--prune")
    assert status == 2 and "git rev-parse HEAD found none" in err


def test_merge_refuses_to_prune_on_a_report_whose_used_leaves_out_its_checks(project, monkeypatch, capsys):
    """A report naming the real tests as passed, with its checks but `used: []`, would delete the file."""
    put(project, {"test_a.py": "".join(f"def {key}(llm_model, golden_tokens):\n    pass\n\n"
                                       for key in ("test_other", *VALID_KEYS)).encode()})
    checks = [CheckRecord(test=f"test_a.py::{key}", name=key, variant="cpu/float32", verdict="IDENTICAL",
                          passed=True) for key in VALID_KEYS]
    report = shard_report(project / "shard", {"test_a.py": "__golden__/test_a.json"}, checks=checks,
                          tests=("test_other", *VALID_KEYS), used=[])
    status, out, err = merge(project, monkeypatch, capsys, report, "--prune")
    assert status == 2, out + err
    assert (f"shard/report.json lists {len(VALID_KEYS)} check(s) of goldens its 'used' does not name "
            f"(test_a.py::{VALID_KEYS[0]} [{VALID_KEYS[0]!r}], ") in err
    assert "so this one was edited or is damaged, and nothing is pruned on its word" in err
    assert (project / "__golden__/test_a.json").read_bytes() == VALID
    # The negative control: the same report as the run wrote it prunes nothing, every golden being used.
    report = shard_report(project / "shard", {"test_a.py": "__golden__/test_a.json"}, checks=checks,
                          tests=("test_other", *VALID_KEYS))
    status, out, err = merge(project, monkeypatch, capsys, report, "--prune")
    assert status == 0, out + err
    assert "pruned" not in out and (project / "__golden__/test_a.json").read_bytes() == VALID
