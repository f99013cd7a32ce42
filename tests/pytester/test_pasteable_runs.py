"""Messages you can paste: every setting a message suggests works in the file it names, the config
blocks of the README and the docs load as written, a mistyped option names the real one, a failure
prints in full once."""

from __future__ import annotations

import re

import pytest

from tests.helpers import ROOT
from tests.helpers.models import in_hub_cache
from tests.helpers.pasteable import README, config_blocks

DOCS = sorted((ROOT / "docs").rglob("*.md"))
LOADS_THE_MODEL = """
def test_configured(llm_model):
    assert llm_model.tokenizer is not None
"""


DOC_BLOCKS = [(path, *block) for path in [README, *DOCS] for block in config_blocks(path)]


def write_config(pytester: pytest.Pytester, language: str, text: str) -> None:
    if language == "toml":
        pytester.makepyprojecttoml(text if "[tool.pytest.ini_options]" in text
                                   else f"[tool.pytest.ini_options]\n{text}")
    else:  # a fragment (one setting) goes under [pytest]
        pytester.makefile(".ini", pytest=text if "[pytest]" in text else f"[pytest]\n{text}")


@pytest.mark.parametrize(("path", "language", "text"), DOC_BLOCKS,
                         ids=[f"{path.stem}-{language}-{n}"
                              for n, (path, language, _) in enumerate(DOC_BLOCKS)])
def test_each_readme_and_docs_config_block_loads_as_written(pytester, hub_cache, path, language, text):
    for repo in re.findall(r'^llm_model = "?([\w.-]+/[\w.-]+)"?$', text, re.MULTILINE):
        in_hub_cache(hub_cache, repo, "0" * 40)  # a hub id the page names, cached as `hf download` would
    write_config(pytester, language, text)
    pytester.makepyfile(LOADS_THE_MODEL if "llm_model" in text else "def test_configured(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-3000:] + result.stderr.str()[-2000:]


def _suggested(message: str) -> dict[str, str]:
    """The three forms of the setting a message suggests."""
    match = re.search(r"(--llm-[a-z-]+=\S+) \(pytest\.ini: (llm_\w+ = [^;]+); pyproject\.toml: (llm_\w+ = "
                      r"\"[^\"]*\")\)",
                      message)
    assert match, message
    return {"flag": match[1], "ini": match[2], "toml": match[3]}


TOO_LONG = """
def test_long(llm_model):
    llm_model.generate("one two three four five six seven eight nine ten eleven twelve", max_new_tokens=1)
"""


def test_the_prompt_too_long_fix_works_pasted_into_each_file(pytester):
    pytester.makeini("[pytest]\nllm_model = builtin:tiny\nllm_batch_shape = 2x8\n")
    pytester.makepyfile(TOO_LONG)
    refused = pytester.runpytest("-p", "no:cacheprovider")
    refused.assert_outcomes(failed=1)
    suggested = _suggested(refused.stdout.str())
    assert suggested["ini"].startswith("llm_batch_shape = 2x")
    pytester.makeini(f"[pytest]\nllm_model = builtin:tiny\n{suggested['ini']}\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    (pytester.path / "tox.ini").unlink()
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\nllm_model = "builtin:tiny"\n'
                               f'{suggested["toml"]}\n')
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    (pytester.path / "pyproject.toml").unlink()
    pytester.runpytest("-p", "no:cacheprovider", "--llm-model=builtin:tiny",
                       suggested["flag"]).assert_outcomes(passed=1)


def test_a_prompt_over_the_quick_length_bound_is_counted_and_the_suggested_shape_fits(pytester):
    """31 tokens under 2x4: the length bound alone (at least 6) would suggest 2x8, which fails again
    once pasted; the prompt is counted in full and the suggestion holds it."""
    pytester.makeini("[pytest]\nllm_model = builtin:tiny\nllm_batch_shape = 2x4\n")
    pytester.makepyfile("""
        def test_story(llm_model):
            llm_model.generate("Once upon a time there was a little girl who lived in", max_new_tokens=1)
    """)
    refused = pytester.runpytest("-p", "no:cacheprovider")
    refused.assert_outcomes(failed=1)
    refused.stdout.fnmatch_lines(["*has 31 tokens but llm_batch_shape '2x4' allows 3*"])
    assert "at least" not in refused.stdout.str()
    suggested = _suggested(refused.stdout.str())
    assert suggested["ini"] == "llm_batch_shape = 2x32"
    pytester.makeini(f"[pytest]\nllm_model = builtin:tiny\n{suggested['ini']}\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_the_no_model_hint_works_pasted_into_pytest_ini(pytester):
    pytester.makepyfile(LOADS_THE_MODEL)
    refused = pytester.runpytest("-p", "no:cacheprovider", "--llm-seed=0")
    refused.assert_outcomes(errors=1)
    suggested = _suggested(refused.stdout.str())
    pytester.makeini(f"[pytest]\n{suggested['ini']}\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


@pytest.mark.parametrize(("typed", "line"), [
    ("--llm-golden-updat", ("ERROR: --llm-golden-updat: no such option; did you mean --llm-golden-update? "
                           "(pytest does not accept abbreviated options)")),
    ("--llm-golden-updat=new", ("ERROR: --llm-golden-updat = 'new': no such option; did you mean "
                               "--llm-golden-update? (pytest does not accept abbreviated options)")),
    ("--llm-modle=x", "ERROR: --llm-modle = 'x': no such option; did you mean --llm-model?"),
])
def test_a_truncated_or_misspelled_option_names_the_real_one(pytester, typed, line):
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest(typed)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([line])


CHANGED_INPUT = """
def test_x(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The sky is", max_new_tokens=2{extra}))
"""


def test_a_failure_prints_its_full_message_once_and_one_line_in_the_short_summary(suite, monkeypatch):
    suite.makepyfile(CHANGED_INPUT.format(extra=""))
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    suite.makepyfile(CHANGED_INPUT.format(extra=", repetition_penalty=1.5"))
    monkeypatch.setenv("CI", "true")  # pytest prints the whole crash message in CI (and under -vv)
    for args in ((), ("-vv",)):
        result = suite.runpytest(*args)
        result.assert_outcomes(failed=1)
        lines = result.outlines
        assert sum("generation_config.repetition_penalty: 1.0 -> 1.5" in line for line in lines) == 1
        summary = lines[next(i for i, line in enumerate(lines) if "short test summary info" in line) + 1:]
        assert summary[0].startswith("FAILED ") and "INPUT_CHANGED" in summary[0]
        assert "1 failed" in summary[1], summary
