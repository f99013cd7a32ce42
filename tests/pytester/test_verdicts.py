"""Verdicts from real CPU numeric effects on the tiny model, judged by tolerance profiles."""

import json

import pytest

from tests.helpers.models import boosted_token_copy, perturbed_tiny_copy
from tests.helpers.projects import read_goldens

GOLDEN = "__golden__/test_v.json"


def write_suite(suite, prompt="The cat sat on the", extra="", max_new_tokens=4):
    suite.makepyfile(test_v=f"""
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens={max_new_tokens}{extra})
def test_case(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate({prompt!r}))
""")


def golden_entry(suite, variant="cpu/float32"):
    return read_goldens(suite, GOLDEN)["test_case"][variant]


@pytest.fixture
def recorded(suite):
    write_suite(suite)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    return suite


def test_tiny_weight_noise_is_logit_drift_failing_exact_passing_tokens(recorded, tmp_path):
    drifted = perturbed_tiny_copy(tmp_path / "drifted", scale=1e-4)
    exact = recorded.runpytest(f"--llm-model={drifted}")
    exact.assert_outcomes(failed=1)
    exact.stdout.fnmatch_lines(["E*LOGIT_DRIFT at step 0 — same tokens, logits differ*fails under 'exact'"])
    tokens = recorded.runpytest(f"--llm-model={drifted}", "--llm-tolerance=tokens")
    tokens.assert_outcomes(passed=1)
    tokens.stdout.fnmatch_lines(["golden checks: 1 LOGIT_DRIFT"])
    close = recorded.runpytest(f"--llm-model={drifted}", "--llm-tolerance=close(atol=1e-2)")
    close.assert_outcomes(passed=1)


def test_flip_at_a_near_tie_step_is_tie_flip_or_regression_by_margin(recorded, tmp_path):
    golden = golden_entry(recorded)
    first_step = golden["steps"][0]
    assert first_step["margin"] < 0.1  # the tiny model's cat/mat coin flip
    runner_up = first_step["top"][1][0]
    flipped = boosted_token_copy(tmp_path / "flipped", runner_up, factor=1.02)

    above = recorded.runpytest(f"--llm-model={flipped}", "--llm-tolerance=near_tie(margin=0.1, atol=0.1)")
    above.assert_outcomes(passed=1)
    above.stdout.fnmatch_lines(["golden checks: 1 TIE_FLIP"])

    below = recorded.runpytest(f"--llm-model={flipped}", "--llm-tolerance=near_tie(margin=0.05, atol=0.1)")
    below.assert_outcomes(failed=1)
    below.stdout.fnmatch_lines([
        (f"E*REGRESSION at step 0 — expected * (id {first_step['token']}), got * (id {runner_up}); "
        f"golden margin {first_step['margin']:.3g} >= tie margin 0.05: not a near tie — fails under "
        "'near_tie(margin=0.05, atol=0.1)'"),
    ])
    exact = recorded.runpytest(f"--llm-model={flipped}", "--llm-tolerance=exact")
    exact.assert_outcomes(failed=1)
    # The marker's tolerance is the most specific setting and wins over the command line.
    write_suite(recorded, extra=", tolerance='near_tie(margin=0.1, atol=0.1)'")
    marked = recorded.runpytest(f"--llm-model={flipped}", "--llm-tolerance=exact")
    marked.assert_outcomes(passed=1)


def test_large_weight_noise_is_a_regression_under_every_profile(suite, tmp_path):
    write_suite(suite, prompt="Q: What is the capital of Japan? A:")
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    broken = perturbed_tiny_copy(tmp_path / "broken", scale=0.5, seed=0)
    for profile in ("exact", "tokens", "close(atol=100)", "near_tie(margin=0.5, atol=100)"):
        result = suite.runpytest(f"--llm-model={broken}", f"--llm-tolerance={profile}")
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines([f"E*REGRESSION at step 0*not a near tie — fails under '{profile}'"])


def test_changed_prompt_is_input_changed_and_every_report_shows_both_inputs(recorded):
    write_suite(recorded, prompt="The cat sat on a")
    result = recorded.runpytest("--llm-report=r.json", "--llm-report=r.md", "--llm-report=r.html")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "E*INPUT_CHANGED — prompt_token_ids — fails under 'exact'",
        "E*the input changed, so outputs were not compared (recorded -> now):",
        "E*prompt: 'The cat sat on the' -> 'The cat sat on a'",
        "E*prompt_token_ids differ from position * (* -> * ids): [[]*] -> [[]*]",
    ])
    assert "context:" not in result.stdout.str()
    (check,) = json.loads((recorded.path / "r.json").read_text())["checks"]
    old, new = check["inputs"]["expected"], check["inputs"]["actual"]
    assert (old["prompt"], new["prompt"]) == ("The cat sat on the", "The cat sat on a")
    first = check["first_input_difference"]
    assert (old["prompt_token_ids"][first - old["ids_from"]]
            != new["prompt_token_ids"][first - new["ids_from"]])
    assert old["prompt_form"] == "text"
    assert old["ids_total"] == len(golden_entry(recorded)["prompt_token_ids"])
    markdown = (recorded.path / "r.md").read_text()
    assert "### Inputs that changed" in markdown
    assert "prompt: 'The cat sat on the' → 'The cat sat on a'" in markdown
    assert f"prompt token ids differ from position {first}" in markdown
    page = (recorded.path / "r.html").read_text()
    assert "recorded input" in page and "new input" in page and "recorded output" in page
    assert "The·cat·sat·on·<mark>the</mark>" in page and "The·cat·sat·on·<mark>a</mark>" in page
    assert f"ids differ from position {first}" in page


def test_changed_batch_shape_is_an_input_change_showing_both_inputs(recorded):
    """On the previous kernels (llm_batch_invariant = false) the batch shape is part of every golden."""
    previous = "--llm-batch-invariant=false"
    recorded.runpytest("--llm-golden-update", previous, "--llm-tolerance=exact").assert_outcomes(passed=1)
    result = recorded.runpytest("--llm-batch-shape=2x40", previous)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "E*INPUT_CHANGED — batch_shape — fails*",
        "E*the input changed, so outputs were not compared (recorded -> now):",
        "E*batch_shape: '4x32' -> '2x40'",
        "E*prompt: unchanged, 'The cat sat on the' (* ids, the same)",
    ])


def test_a_larger_budget_judges_the_goldens_steps_and_asks_to_record_the_new_ones(suite, tmp_path):
    write_suite(suite, prompt="Count: one,", max_new_tokens=3)  # ' two, three.' and EOS take 5 steps
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    assert golden_entry(suite)["finish_reason"] == "length"  # the golden ran out of budget
    write_suite(suite, prompt="Count: one,", max_new_tokens=8)
    longer = suite.runpytest()
    longer.assert_outcomes(passed=1)
    longer.stdout.fnmatch_lines([
        "golden checks: 1 IDENTICAL",
        ("'test_case': max_new_tokens 3 -> 8: judged on the golden's 3 step(s) only; steps 3–4 are new and "
         "not judged. The golden ends where its budget did: re-record it to cover the new steps: pytest "
         "test_v.py::test_case --llm-golden-update"),
    ])
    drifted = perturbed_tiny_copy(tmp_path / "drifted", scale=1e-4)
    failing = suite.runpytest(f"--llm-model={drifted}")
    failing.assert_outcomes(failed=1)
    failing.stdout.fnmatch_lines(["E*LOGIT_DRIFT at step 0 — same tokens*", "E*all 3 tokens match*",
                                  "E*max_new_tokens 3 -> 8: judged on the golden's 3 step(s) only; steps "
                                  "3–4 are new*"])
    # Updating records the missing steps of a passing check too; the golden then ends at EOS,
    # complete, and a larger budget still expects that stop.
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    assert len(golden_entry(suite)["steps"]) == 5 and golden_entry(suite)["finish_reason"] == "eos"
    write_suite(suite, prompt="Count: one,", max_new_tokens=12)
    again = suite.runpytest()
    again.assert_outcomes(passed=1)
    again.stdout.fnmatch_lines([("'test_case': max_new_tokens 8 -> 12: the golden ended (EOS) within both "
                                "budgets, so it was judged in full")])
    write_suite(suite, prompt="Count: one,", max_new_tokens=2)
    shorter = suite.runpytest()
    shorter.assert_outcomes(passed=1)
    shorter.stdout.fnmatch_lines([("'test_case': max_new_tokens 8 -> 2: judged on the first 2 step(s); the "
                                  "golden's steps 2–4 lie beyond this run's budget")])


def test_bf16_against_an_fp32_golden_names_the_dtype_and_variants_coexist(recorded):
    # the dtype alone changes: the float32 golden on the kernels bfloat16 runs (not batch-invariant)
    previous = "--llm-batch-invariant=false"
    recorded.runpytest("--llm-golden-update", previous, "--llm-tolerance=exact").assert_outcomes(passed=1)
    missing = recorded.runpytest("--llm-dtype=bfloat16")
    missing.assert_outcomes(failed=1)
    missing.stdout.fnmatch_lines([("E*no golden recorded for 'test_case'*[[]'cpu/bfloat16'] (this test has "
                                  "goldens for 'cpu/float32'; compare with one of them via "
                                  "--llm-golden-fallback).")])
    # Another dtype is another environment: by default judged with bf16's near-tie tolerance...
    across = recorded.runpytest("--llm-dtype=bfloat16", "--llm-golden-fallback",
                                "--llm-golden-artifacts=cands")
    across.assert_outcomes(passed=1)
    across.stdout.fnmatch_lines([
        "golden checks: 1 LOGIT_DRIFT",
        ("*compared across environments: dtype 'float32' → 'bfloat16'; tolerance near_tie(margin=0.5, "
         "atol=0.1) by default; the golden is another variant (dtype), whose numbers differ by design: "
         "record this run's own 'cpu/bfloat16' golden beside it by re-running with --llm-golden-update "
         "(variants coexist, and each run compares with its own unless --llm-golden-fallback is given)"),
        "wrote cands/__golden__/test_v.json (1 candidate(s))",
    ])
    # Passing against a fallback still leaves this run's own variant missing: it is a candidate.
    candidate = json.loads((recorded.path / "cands" / GOLDEN).read_text())["goldens"]["test_case"]
    assert list(candidate) == ["cpu/bfloat16"]
    # ... and exactly when the user says so.
    fallback = recorded.runpytest("--llm-dtype=bfloat16", "--llm-golden-fallback", "--llm-tolerance=exact")
    fallback.assert_outcomes(failed=1)
    fallback.stdout.fnmatch_lines([
        "E*compared across environments: dtype 'float32' → 'bfloat16'; tolerance exact as set; the golden is "
        "another variant*",
        "E*dtype: 'float32' -> 'bfloat16'",
        "E*golden: __golden__/test_v.json [[]'test_case'][[]'cpu/float32']",
        "*'test_case': no 'cpu/bfloat16' golden; compared with 'cpu/float32' (--llm-golden-fallback)",
    ])
    before = golden_entry(recorded)
    recorded.runpytest("--llm-dtype=bfloat16", "--llm-golden-update").assert_outcomes(passed=1)
    assert golden_entry(recorded) == before  # updating bf16 never touches the fp32 variant
    assert golden_entry(recorded, "cpu/bfloat16")["fingerprint"]["dtype"] == "bfloat16"
    recorded.runpytest("--llm-dtype=bfloat16").assert_outcomes(passed=1)
    recorded.runpytest("--llm-dtype=float32").assert_outcomes(passed=1)


def test_bf16_drift_beyond_the_default_tolerance_is_told_to_record_its_variant_not_exact(recorded):
    """Same tokens, logits moved more than bf16's default atol: the fix is a bf16 golden variant or
    a wider tolerance, never --llm-tolerance=exact (which fails every cross-dtype check)."""
    # the dtype alone changes: the float32 golden on the kernels bfloat16 runs (not batch-invariant)
    recorded.runpytest("--llm-golden-update", "--llm-batch-invariant=false", "--llm-tolerance=exact")
    path = recorded.path / GOLDEN
    document = json.loads(path.read_text())
    for step in document["goldens"]["test_case"]["cpu/float32"]["steps"]:
        step["top"] = [[token, logprob - 0.3] for token, logprob in step["top"]]  # drift the golden by 0.3
    path.write_text(json.dumps(document))
    result = recorded.runpytest("--llm-dtype=bfloat16", "--llm-golden-fallback")
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert "--llm-tolerance=exact" not in output
    result.stdout.fnmatch_lines([
        ("E*LOGIT_DRIFT at step 0 — same tokens, logits differ; max |Δlogprob| in top-k 0.* > atol 0.1 — "
         "fails under 'near_tie(margin=0.5, atol=0.1)'"),
        ("E*compared across environments: dtype 'float32' → 'bfloat16'; *the golden is another variant "
         "(dtype)*record this run's own 'cpu/bfloat16' golden beside it by re-running with "
         "--llm-golden-update*; to pass bfloat16 drift of this size instead (max |Δlogprob| 0.*): "
         "--llm-tolerance='near_tie(margin=0.5, atol=0.5)'"),
        "E*Accept with: pytest test_v.py::test_case --llm-dtype=bfloat16 --llm-golden-update",
    ])
    # Each suggested fix works: the wider tolerance passes, the accept command records cpu/bfloat16.
    recorded.runpytest("--llm-dtype=bfloat16", "--llm-golden-fallback",
                       "--llm-tolerance=near_tie(margin=0.5, atol=0.5)").assert_outcomes(passed=1)
    recorded.runpytest("test_v.py::test_case", "--llm-dtype=bfloat16",
                       "--llm-golden-update").assert_outcomes(passed=1)
    assert golden_entry(recorded, "cpu/bfloat16")["fingerprint"]["dtype"] == "bfloat16"
    own = recorded.runpytest("--llm-dtype=bfloat16", "--llm-golden-fallback")
    own.assert_outcomes(passed=1)
    own.stdout.fnmatch_lines(["golden checks: 1 IDENTICAL"])


def test_edited_version_field_is_shown_as_an_environment_change(recorded, tmp_path):
    path = recorded.path / GOLDEN
    document = json.loads(path.read_text())
    document["goldens"]["test_case"]["cpu/float32"]["fingerprint"]["transformers"] = "4.57.1"
    path.write_text(json.dumps(document))
    drifted = perturbed_tiny_copy(tmp_path / "drifted", scale=1e-4)
    result = recorded.runpytest(f"--llm-model={drifted}", "--llm-tolerance=exact")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E*environment changed (expected -> got):",
                                 "E*transformers: '4.57.1' -> '*'"])


def test_assert_equal_on_generations_renders_like_a_golden_check(suite, tmp_path):
    suite.makepyfile(
        """
        def test_eq(llm_model):
            a = llm_model.generate("The cat sat on the", max_new_tokens=3)
            b = llm_model.generate("The cat sat on the", max_new_tokens=3, repetition_penalty=3.0)
            assert a == b
        """
    )
    result = suite.runpytest()
    result.assert_outcomes(failed=1)
    # golden (right) -> actual (left)
    result.stdout.fnmatch_lines(["E*Generation == Generation: INPUT_CHANGED — "
                                 "generation_config.repetition_penalty*",
                                 "E*generation_config.repetition_penalty: 3.0 -> 1.0"])


def _as_if_recorded_natively_elsewhere(recorded):
    """Edit the golden's fingerprint as a native run on another CPU would have written it."""
    path = recorded.path / GOLDEN
    document = json.loads(path.read_text())
    fingerprint = document["goldens"]["test_case"]["cpu/float32"]["fingerprint"]
    fingerprint.update(cpu_numerics="native", cpu_capability="AVX512", mkl_cbwr="OFF",
                       device_name="Intel(R) Xeon(R) Platinum 8488C")
    path.write_text(json.dumps(document))


def test_default_tolerance_follows_the_environment_and_a_regression_fails_in_both(recorded, tmp_path):
    drifted = perturbed_tiny_copy(tmp_path / "drifted", scale=1e-4)
    broken = perturbed_tiny_copy(tmp_path / "broken", scale=0.5)
    same = recorded.runpytest(f"--llm-model={drifted}")
    same.assert_outcomes(failed=1)
    same.stdout.fnmatch_lines(["E*LOGIT_DRIFT at step 0*fails under 'exact'"])
    assert "compared across environments" not in same.stdout.str()
    recorded.runpytest(f"--llm-model={broken}").stdout.fnmatch_lines(["E*REGRESSION at step*fails "
                                                                      "under 'exact'"])

    _as_if_recorded_natively_elsewhere(recorded)
    across = recorded.runpytest(f"--llm-model={drifted}")
    across.assert_outcomes(passed=1)
    across.stdout.fnmatch_lines([
        "golden checks: 1 LOGIT_DRIFT",
        ("compared across environments: *cpu_numerics 'native' → 'portable'*cpu_capability 'AVX512' → "
         "'AVX2'*tolerance near_tie(margin=0.05, atol=0.001) by default; to compare exactly again*"),
    ])
    regression = recorded.runpytest(f"--llm-model={broken}")
    regression.assert_outcomes(failed=1)
    regression.stdout.fnmatch_lines([
        "E*REGRESSION at step*fails under 'near_tie(margin=0.05, atol=0.001)'",
        "E*compared across environments: *cpu_numerics 'native' → 'portable'*by default*",
    ])
    assert recorded.runpytest(f"--llm-model={drifted}", "--llm-tolerance=exact").ret == 1  # explicit wins


def test_a_changed_chat_template_is_input_changed_showing_both_rendered_prompts(suite, tmp_path):
    import shutil

    from pytest_llmdeterminism.engines import BUILTIN_MODELS

    suite.makepyfile(test_chat="""
        from pytest_llmdeterminism import deterministic

        @deterministic(max_new_tokens=3)
        def test_chat(llm_model, golden_tokens):
            question = {"role": "user", "content": "What is the capital of Japan?"}
            golden_tokens.check(llm_model.generate([question]))
    """)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    edited = tmp_path / "edited"
    shutil.copytree(BUILTIN_MODELS["tiny"], edited)
    template = edited / "chat_template.jinja"
    template.write_text(template.read_text().replace("Q: ", "Question: "))
    result = suite.runpytest(f"--llm-model={edited}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "E*golden mismatch in 'test_chat': INPUT_CHANGED — prompt_token_ids — fails under*",
        ("E*prompt (chat, rendered): '<|bos|>Q: What is the capital of Japan? A:' -> "
         "'<|bos|>Question: What is the capital of Japan? A:'"),
        "E*chat_template_hash: '*' -> '*'",
    ])


def test_by_default_a_changed_batch_shape_is_identical_and_the_golden_keeps_its_shape(recorded):
    """On the batch-invariant kernels, the default, the shape is informational: the golden recorded at
    4x32 reads IDENTICAL at 2x40 under exact comparison, and is not rewritten."""
    before = golden_entry(recorded)
    result = recorded.runpytest("--llm-batch-shape=2x40", "--llm-tolerance=exact")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["golden checks: 1 IDENTICAL"])
    assert golden_entry(recorded) == before and before["batch_shape"] == "4x32"
