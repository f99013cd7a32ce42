"""Generation settings in pytest runs: sampling arguments without ``do_sample=True`` fail at the user's
line naming it, and a marker takes numpy integers as plain ints."""


def test_sampling_without_do_sample_fails_at_the_users_line_naming_do_sample(suite):
    suite.makepyfile(
        """
        from pytest_llmdeterminism import deterministic

        @deterministic
        def test_sampled(llm_model):
            llm_model.generate("The capital of France is", temperature=0.7)
        """
    )
    result = suite.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        ">*llm_model.generate(*temperature=0.7)",
        "E*SamplingRefusedError: llm_model.generate(temperature=0.7) refused: a temperature only matters "
        "when sampling*pass do_sample=True with it*",
    ])


def test_a_marker_takes_numpy_integers_as_plain_ints(suite):
    suite.makepyfile(
        """
        import numpy as np
        from pytest_llmdeterminism import deterministic

        @deterministic(seed=np.int64(3), max_new_tokens=np.int32(2))
        def test_sampled(llm_model):
            generation = llm_model.generate("The capital of France is", do_sample=True, temperature=0.7)
            seed = generation.generation_config["seed"]
            assert seed == 3 and type(seed) is int
            assert len(generation.token_ids) == 2

        @deterministic(seed=True)
        def test_bool(llm_model):
            pass
        """
    )
    result = suite.runpytest()
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*@deterministic(seed=...) in test_a_marker_takes*::test_bool = True: "
                                 "expected an integer*"])


def test_the_docs_speculation_block_is_identical_to_the_plain_golden(suite):
    """docs/writing-tests.md's speculation block, as written, against the golden the same test recorded
    without speculation: IDENTICAL, the golden file untouched."""
    from tests.helpers import ROOT

    page = (ROOT / "docs" / "writing-tests.md").read_text(encoding="utf-8")
    section = page.split("## Speculative decoding, checked against plain greedy decoding", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    header = "from pytest_llmdeterminism import deterministic\n\n"
    suite.makepyfile(test_docs=header + block.replace(', prompt_lookup_num_tokens=5', ''))
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    (golden,) = suite.path.glob("__golden__/*.json")
    recorded = golden.read_bytes()
    suite.makepyfile(test_docs=header + block)
    checked = suite.runpytest("-s")
    checked.assert_outcomes(passed=1)
    checked.stdout.fnmatch_lines(["*Speculated(method='prompt_lookup', passes=*",
                                  "*golden checks: 1 IDENTICAL*"])
    assert golden.read_bytes() == recorded
