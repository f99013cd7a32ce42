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
