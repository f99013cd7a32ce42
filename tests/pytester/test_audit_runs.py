"""``--llm-audit`` in pytest runs of the tiny model: every row shown with the count of unique results,
only ``@deterministic`` tests audited and the repeats configurable, unseeded noise reported
nondeterministic, and a sampled generation audited under its own settings and seed."""


AUDIT_SUITE = """
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=6)
def test_capital(llm_model):
    llm_model.generate("The capital of France is")
"""


def test_audit_shows_every_row_and_one_unique_result_of_five(suite):
    suite.makepyfile(test_a=AUDIT_SUITE)
    result = suite.runpytest("--llm-audit", "--llm-audit-dtype=bfloat16")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "test_a.py::test_capital: audit of 'The capital of France is' at 4x32:",
        "*source*change*tokens*max |Δlogit|*what it means",
        "*repeat*1 unique of 5*same*0*no effect",
        "*batch *3 companion(s), row 3*same*0*no effect",
        "*batch_size*B 4 -> 1*",
        "*padding*L 32 -> 40*",
        "*cache*use_cache True -> False*",
        "*threads*2 -> 1*",
        "*dtype*float32 -> bfloat16*dtype changes rounding*",
        "audit summary: 1 generation(s), 0 nondeterministic; results moved by repeat 0/1, batch 0/1, *",
    ])


def test_only_deterministic_tests_are_audited_and_repeats_are_configurable(suite):
    suite.makepyfile(test_a=AUDIT_SUITE + "\ndef test_plain(llm_model):\n    llm_model.generate('x')\n")
    result = suite.runpytest("--llm-audit=3")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*repeat*1 unique of 3*", "audit summary: 1 generation(s)*"])


def test_unseeded_noise_is_reported_nondeterministic(suite):
    suite.makepyfile(
        test_noisy="""
        import numpy as np
        import torch
        from pytest_llmdeterminism import deterministic

        @deterministic(max_new_tokens=4)
        def test_noisy(llm_model):
            rng = np.random.default_rng()  # fresh OS entropy: no seed the plugin can set
            def add_noise(module, args, output):
                noise = torch.from_numpy(rng.normal(0, 1e-3, output.logits.shape).astype("float32"))
                output.logits.add_(noise)
            handle = llm_model.model.register_forward_hook(add_noise)
            try:
                llm_model.generate("The capital of France is")
            finally:
                handle.remove()
        """
    )
    result = suite.runpytest("--llm-audit")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "E*NondeterminismError: NONDETERMINISTIC: audit of 'The capital of France is' at 4x32:",
        "E*repeat*5 unique of 5*nondeterministic kernel or unseeded randomness*",
        "audit summary: 1 generation(s), 1 nondeterministic*",
    ])


SAMPLED_AUDIT_SUITE = """
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=6)
def test_story(llm_model):
    llm_model.generate(["Once upon a time", "The sky is"], do_sample=True, temperature=3.0, top_p=0.9,
                       seed=[5, 6])
"""


def test_a_sampled_generation_is_audited_under_its_own_settings_and_seed(suite):
    """Each prompt of a call with one seed per prompt is audited with its own seed (the audit runs
    one prompt at a time), under the call's temperature and cut; the seed row shows it matters."""
    suite.makepyfile(test_a=SAMPLED_AUDIT_SUITE)
    result = suite.runpytest("--llm-audit=2")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "test_a.py::test_story: audit of 'Once upon a time' at 4x32, sampled: temperature 3.0, top_k 50, "
        "top_p 0.9, seed 5 (gumbel-xxh3-splitmix/1):",
        "*repeat*1 unique of 2*same*0*no effect",
        "*batch *3 companion(s), row 3*same*0*no effect",
        "*seed*5 -> 6*",
        "test_a.py::test_story: audit of 'The sky is' at 4x32, sampled: temperature 3.0, top_k 50, "
        "top_p 0.9, seed 6 *",
        "*seed*6 -> 7*",
        "audit summary: 2 generation(s), 0 nondeterministic; results moved by *seed ?/2*",
    ])
