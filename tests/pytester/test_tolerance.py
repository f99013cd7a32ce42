"""Tolerance profiles: parsing, defaults per device and dtype, and which verdicts each accepts."""




from tests.helpers.projects import usage_error


def test_bad_ini_tolerance_is_a_usage_error(pytester):
    result = usage_error(pytester, "llm_tolerance = fuzzy")
    result.stderr.fnmatch_lines(
        ["ERROR: llm_tolerance = 'fuzzy': expected one of exact, tokens, close, near_tie*"])
