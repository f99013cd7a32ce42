"""Configuration in pytest runs: an absurd ini shape stops pytest before any test, a misspelt setting
stops the run once with a suggestion in every kind of configuration file, a conftest's own settings
are no typos; the thread count is restored, ``--help`` lists every report format and device, and
several reports are written in one run."""

from __future__ import annotations

import pytest

from tests.helpers.projects import usage_error


def test_absurd_ini_shape_stops_pytest_before_any_test(pytester):
    result = usage_error(pytester, "llm_batch_shape = 1x100000000")
    result.stderr.fnmatch_lines([("ERROR: llm_batch_shape = '1x100000000': L = 100,000,000 is above 131,072; "
                                  "100,000,000 tokens per batch*")])


def test_deterministic_restores_the_thread_count(suite):
    suite.makepyfile("""
        import torch
        from pytest_llmdeterminism import deterministic

        BEFORE = torch.get_num_threads()

        @deterministic
        def test_changes_threads():
            torch.set_num_threads(1 if BEFORE > 1 else 2)

        def test_after():
            assert torch.get_num_threads() == BEFORE
        """)
    suite.runpytest("-p", "no:randomly").assert_outcomes(passed=2)


@pytest.mark.parametrize(("ini", "args", "message"), [
    ("llm_modle = builtin:tiny", [],
     "ERROR: llm_modle = 'builtin:tiny': not a pytest-llmdeterminism ini setting; did you mean 'llm_model'?"),
    ("llm_model = builtin:tiny", ["--llm-batch-shap=4x32"],
     "ERROR: --llm-batch-shap = '4x32': no such option; did you mean --llm-batch-shape? "
     "(pytest does not accept *"),
    ("llm_model = builtin:tiny", ["--llm-report=a.md", "--llm-report=b.md"],
     "ERROR: --llm-report = *two .md reports; give one path per format*"),
])
def test_a_misspelled_setting_stops_the_run_once_with_a_suggestion(pytester, ini, args, message):
    result = usage_error(pytester, ini, *args)
    result.stderr.fnmatch_lines([message])
    assert result.stderr.str().count("ERROR:") == 1


_PYTEST_9 = pytest.mark.skipif(pytest.version_tuple < (9,), reason="pytest 9 reads this table")


@pytest.mark.parametrize(("name", "text", "args"), [
    ("pytest.ini", "[pytest]\nllm_modle = builtin:tiny\n", []),
    ("tox.ini", "[pytest]\nllm_modle = builtin:tiny\n", []),
    ("setup.cfg", "[tool:pytest]\nllm_modle = builtin:tiny\n", []),
    ("pyproject.toml", '[tool.pytest.ini_options]\nllm_modle = "builtin:tiny"\n', []),
    pytest.param("pyproject.toml", '[tool.pytest]\nllm_modle = "builtin:tiny"\n', [], marks=_PYTEST_9),
    pytest.param("pytest.toml", '[pytest]\nllm_modle = "builtin:tiny"\n', [], marks=_PYTEST_9),
    ("custom.ini", "[pytest]\nllm_modle = builtin:tiny\n", ["-c", "custom.ini"]),
    ("pytest.ini", "[pytest]\n", ["-o", "llm_modle=builtin:tiny"]),
])
def test_a_misspelled_key_is_found_in_every_kind_of_configuration_file(pytester, name, text, args):
    """The keys come from the file pytest chose (``config.inipath``), in the section that kind of
    file keeps pytest's settings in, and from ``-o``."""
    (pytester.path / name).write_text(text)
    result = usage_error(pytester, None, *args)
    result.stderr.fnmatch_lines(["ERROR: llm_modle = 'builtin:tiny': not a pytest-llmdeterminism ini "
                                 "setting; did you mean 'llm_model'?"])


def test_settings_a_conftest_declares_are_not_typos(pytester):
    pytester.makeconftest("""
        def pytest_addoption(parser):
            parser.addini("llm_judge_model", "another plugin's setting")
            parser.addoption("--llm-judge")
    """)
    pytester.makeini("[pytest]\nllm_model = builtin:tiny\nllm_judge_model = gpt\n")
    pytester.makepyfile("def test_a(): pass")
    pytester.runpytest("--llm-judge=x").assert_outcomes(passed=1)


def test_help_lists_every_report_format_and_device(pytester):
    text = " ".join(pytester.runpytest("--help").stdout.str().split())
    assert (".json (machine-readable), .md (pull-request comment) or .html (for reviewers); repeat the "
            "option") in text
    assert "auto, cpu, mps, cuda or cuda:N" in text


def test_several_reports_are_written_in_one_run(suite):
    suite.makepyfile("""
        from pytest_llmdeterminism import deterministic

        @deterministic(max_new_tokens=2)
        def test_a(llm_model, golden_tokens):
            golden_tokens.check(llm_model.generate("The sky is"))
    """)
    result = suite.runpytest("--llm-golden-update", "--llm-report=r.json", "--llm-report=r.md",
                             "--llm-report=r.html")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["wrote r.json (report)", "wrote r.md (report)", "wrote r.html (report)"])
    assert all((suite.path / name).stat().st_size > 0 for name in ("r.json", "r.md", "r.html"))
