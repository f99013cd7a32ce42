"""What a run writes besides goldens (repro packs, candidates, reports) follows no symbolic link out of
the project: a checkout, which a pull request can change, may hold links that aim them at any file."""

from __future__ import annotations

import os
import stat

from pytest_llmdeterminism.goldens.atomic import new_file_mode
from pytest_llmdeterminism.run.repro import safe_name

_MISSING = """
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=2)
def test_capital(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The capital of France is"))
"""
_SECRET = "export PATH=/usr/bin\n"


def _secret(tmp_path):
    """A file outside the project (a user's shell profile), mode 0644."""
    secret = tmp_path / "home" / ".profile"
    secret.parent.mkdir()
    secret.write_text(_SECRET)
    secret.chmod(0o644)
    return secret


def _untouched(secret) -> bool:
    return secret.read_text() == _SECRET and stat.S_IMODE(secret.stat().st_mode) == 0o644


def test_a_repro_pack_file_that_links_out_of_the_project_is_not_written(suite, tmp_path):
    secret = _secret(tmp_path)
    suite.makepyfile(test_m=_MISSING)
    pack = suite.path / "repro" / safe_name("test_m.py::test_capital")
    pack.mkdir(parents=True)
    (pack / "rerun.sh").symlink_to(secret)
    result = suite.runpytest("--llm-repro=repro", "-p", "no:cacheprovider")
    assert result.ret != 0
    assert _untouched(secret), "neither overwritten nor made executable"
    result.stdout.fnmatch_lines([f"*{pack}: LinkOutError: {pack}/rerun.sh is a symbolic link: * outside "
                                 f"{suite.path}, and repro packs are written only inside it *"])
    assert not (pack / "README.txt").exists(), "a pack is refused whole, before any of its files is written"


def test_a_repro_folder_that_links_out_of_the_project_is_not_written(suite, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    suite.makepyfile(test_m=_MISSING)
    (suite.path / "repro").symlink_to(outside)
    result = suite.runpytest("--llm-repro=repro", "-p", "no:cacheprovider")
    assert result.ret != 0
    assert list(outside.iterdir()) == []
    result.stdout.fnmatch_lines([f"*{suite.path}/repro is a symbolic link: *"])


def test_a_repro_pack_outside_the_project_is_written_with_a_new_files_mode(suite, tmp_path):
    """A folder the user names outside the project is theirs; its files get a new file's mode (the
    script executable), not the mode of a file that was there."""
    suite.makepyfile(test_m=_MISSING)
    pack = tmp_path / "repro" / safe_name("test_m.py::test_capital")
    pack.mkdir(parents=True)
    (pack / "README.txt").write_text("old")
    (pack / "README.txt").chmod(0o777)
    suite.runpytest(f"--llm-repro={tmp_path / 'repro'}", "-p", "no:cacheprovider").assert_outcomes(failed=1)
    assert stat.S_IMODE((pack / "README.txt").stat().st_mode) == new_file_mode()
    assert os.access(pack / "rerun.sh", os.X_OK)


def test_a_candidates_folder_that_links_out_of_the_project_is_not_written(suite, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    suite.makepyfile(test_m=_MISSING)
    (suite.path / "candidates").symlink_to(outside)
    result = suite.runpytest("--llm-golden-artifacts=candidates", "-p", "no:cacheprovider")
    assert result.ret != 0
    assert list(outside.iterdir()) == []
    result.stdout.fnmatch_lines([f"NOT written: candidates/__golden__/test_m.json: {suite.path}/candidates "
                                 "is a symbolic link: * and candidates are written only inside it *"])


def test_a_report_that_links_out_of_the_project_is_not_written(suite, tmp_path):
    secret = _secret(tmp_path)
    suite.makepyfile(test_m=_MISSING)
    (suite.path / "report.md").symlink_to(secret)
    result = suite.runpytest("--llm-report=report.md", "-p", "no:cacheprovider")
    assert result.ret != 0
    assert _untouched(secret)
    result.stdout.fnmatch_lines([f"NOT written: report.md: {suite.path}/report.md is a symbolic link: * and "
                                 "reports are written only inside it *"])


def test_a_report_gets_a_new_files_mode_whatever_was_there(suite):
    suite.makepyfile(test_m=_MISSING)
    (suite.path / "report.html").write_text("old")
    (suite.path / "report.html").chmod(0o755)
    suite.runpytest("--llm-report=report.html", "-p", "no:cacheprovider").assert_outcomes(failed=1)
    assert stat.S_IMODE((suite.path / "report.html").stat().st_mode) == new_file_mode()


def test_merge_and_compare_refuse_a_report_that_links_out_of_the_project(suite, tmp_path, monkeypatch,
                                                                        capsys):
    from pytest_llmdeterminism import cli

    secret = _secret(tmp_path)
    suite.makepyfile(test_m=_MISSING)
    suite.runpytest("--llm-report=run.json", "-p", "no:cacheprovider").assert_outcomes(failed=1)
    (suite.path / "merged.md").symlink_to(secret)
    monkeypatch.chdir(suite.path)
    capsys.readouterr()
    assert cli.main(["merge", "run.json", "--report=merged.md"]) != 0
    assert f"{suite.path}/merged.md is a symbolic link: " in capsys.readouterr().err
    assert cli.main(["compare", "run.json", "run.json", "--html=merged.md"]) == 2
    assert f"llm-golden compare: {suite.path}/merged.md is a symbolic link: " in capsys.readouterr().err
    assert _untouched(secret)
