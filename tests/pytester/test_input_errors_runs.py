"""What a test passes in that no golden can hold, in pytest runs: one clear error at the user's call,
and nothing written. A check name that is not valid Unicode, a generated text beyond a golden's limit."""

from __future__ import annotations

import pytest


def _golden_files(pytester: pytest.Pytester) -> list[str]:
    """Every golden or candidate file the project holds (the plugin's cache is not one)."""
    return sorted(str(path.relative_to(pytester.path)) for path in pytester.path.rglob("*.json")
                  if ".cache" not in path.parts)


# -- check names -----------------------------------------------------------------------------------

def test_a_check_name_that_is_not_valid_unicode_is_refused_and_nothing_is_written(suite):
    suite.makepyfile(test_names='''
        def test_named(llm_model, golden_tokens):
            generation = llm_model.generate("The capital of France is")
            golden_tokens.check(generation, name="caf\\udce9")

        def test_long_name(llm_model, golden_tokens):
            golden_tokens.check(llm_model.generate("The capital of France is"), name="x" * 1_000_001)
    ''')
    result = suite.runpytest("--llm-golden-update")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        ">*golden_tokens.check(generation, name=*",
        "E*ConfigurationError: golden_tokens.check(name=...) = 'caf\\udce9': the name holds a lone surrogate "
        "'\\udce9' at character 3, which is not valid Unicode*a golden file holding it would not read back. "
        "Pass a name of valid text*",
    ])
    result.stdout.fnmatch_lines(["E*ConfigurationError: golden_tokens.check(name=...): the name has "
                                 "1,000,001 characters, more than the 1,000,000 a golden holds; pass a short "
                                 "name"])
    assert _golden_files(suite) == []


# -- text limits -----------------------------------------------------------------------------------

def test_a_generation_whose_text_is_beyond_a_goldens_limit_is_refused_at_the_check(suite):
    suite.makepyfile(test_big='''
        import dataclasses

        def test_served(llm_model, golden_tokens):
            generation = llm_model.generate("The capital of France is")
            huge = dataclasses.replace(generation, text=" " * 8_000_000)  # an 8 MB answer (a server's, say)
            golden_tokens.check(huge)
    ''')
    for args in (["--llm-golden-update"], []):  # neither recorded nor compared (nor a candidate written)
        result = suite.runpytest(*args, "--llm-golden-artifacts=candidates")
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines([
            ">*golden_tokens.check(huge)",
            "E*ConfigurationError: golden_tokens.check(generation): its text has 8,000,000 characters, "
            "more than the 1,000,000 a golden holds, so no golden can hold this generation: nothing was "
            "recorded or compared. Generate fewer tokens (llm_model.generate(..., max_new_tokens=...)) or "
            "shorten the prompt",
        ])
        assert _golden_files(suite) == []
