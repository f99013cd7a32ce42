"""Goldens a pytest run does not trust: a bad golden no test reads does not crash the end of a green
run; an update or prune refuses a golden folder or file that links out of the root, and an update
still writes through a link that stays inside it."""

from __future__ import annotations

from pytest_llmdeterminism.goldens import store
from tests.helpers.golden_safety import BAD_GOLDENS


def test_a_bad_golden_no_test_reads_does_not_crash_the_end_of_a_green_run(suite):
    suite.makepyfile(test_unread="def test_plain():\n    pass\n")
    (suite.path / "__golden__").mkdir()
    (suite.path / "__golden__" / "test_unread.json").write_text(BAD_GOLDENS["nan"])
    result = suite.runpytest("--llm-report=report.html")
    result.assert_outcomes(passed=1)
    assert result.ret == 0
    pruned = suite.runpytest("--llm-golden-prune")
    assert pruned.ret == 0 and "Traceback" not in pruned.stdout.str()
    assert (suite.path / "__golden__" / "test_unread.json").read_text() == BAD_GOLDENS["nan"]


# -- updates write only inside the root (DESIGN.md §11) -------------------------------------------

_ONE_CHECK = """
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=2)
def test_capital(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The capital of France is"))
"""


def test_an_update_refuses_a_golden_folder_that_links_out_of_the_root(suite, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    suite.makepyfile(test_m=_ONE_CHECK)
    (suite.path / "__golden__").symlink_to(outside)
    result = suite.runpytest("--llm-golden-update", "-p", "no:cacheprovider")
    assert result.ret != 0
    assert list(outside.iterdir()) == []
    result.stdout.fnmatch_lines([
        f"NOT written: __golden__/test_m.json: {suite.path}/__golden__ is a symbolic link: "
        f"{suite.path}/__golden__/test_m.json resolves to {outside}/test_m.json, outside {suite.path}, and "
        "goldens are written only inside it (*). Replace the link with a real folder, or remove it."])


def test_an_update_refuses_a_golden_file_that_links_out_of_the_root(suite, tmp_path):
    secret = tmp_path / "outside" / "new.json"  # a link to a file yet to be made: a write would create it
    secret.parent.mkdir()
    suite.makepyfile(test_m=_ONE_CHECK)
    (suite.path / "__golden__").mkdir()
    (suite.path / "__golden__" / "test_m.json").symlink_to(secret)
    result = suite.runpytest("--llm-golden-update", "-p", "no:cacheprovider")
    assert result.ret != 0
    assert not secret.exists()
    result.stdout.fnmatch_lines([
        f"NOT written: __golden__/test_m.json: {suite.path}/__golden__/test_m.json is a symbolic link: "
        f"* outside {suite.path}, * Replace the link with a real file, or remove it."])


def test_an_update_still_writes_through_a_link_that_stays_inside_the_root(suite):
    suite.makepyfile(test_m=_ONE_CHECK)
    (suite.path / "goldens").mkdir()
    (suite.path / "__golden__").symlink_to(suite.path / "goldens")
    suite.runpytest("--llm-golden-update", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert "test_capital" in store.read(suite.path / "goldens" / "test_m.json")


def test_prune_refuses_a_golden_folder_that_links_out_of_the_root(suite, tmp_path):
    second = '\n@deterministic(max_new_tokens=2)\ndef test_gone(llm_model, golden_tokens):\n' \
             '    golden_tokens.check(llm_model.generate("Hello"))\n'
    suite.makepyfile(test_m=_ONE_CHECK + second)
    suite.runpytest("--llm-golden-update", "-p", "no:cacheprovider").assert_outcomes(passed=2)
    suite.makepyfile(test_m=_ONE_CHECK)  # test_gone's golden is now unused
    outside = tmp_path / "outside"
    (suite.path / "__golden__").rename(outside)
    (suite.path / "__golden__").symlink_to(outside)
    result = suite.runpytest("--llm-golden-prune", "-p", "no:cacheprovider")
    assert result.ret != 0
    assert sorted(store.read(outside / "test_m.json")) == ["test_capital", "test_gone"]
    result.stdout.fnmatch_lines([f"NOT written: __golden__/test_m.json: not pruned: {suite.path}/__golden__ "
                                 "is a symbolic link: * Replace the link with a real folder, or remove it."])
