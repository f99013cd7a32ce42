"""Determinism audit and Hypothesis-driven batch invariance, on the real tiny model."""

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from pytest_llmdeterminism import ConfigurationError
from pytest_llmdeterminism.engines.audit import AuditReport, AuditRow, audit
from pytest_llmdeterminism.engines.model import LLMModel
from pytest_llmdeterminism.shape import BatchShape
from pytest_llmdeterminism.strategies import (
    BatchComposition,
    BatchInvarianceError,
    assert_batch_invariant,
    batch_compositions,
    prompts,
)

POOL = ["The sky is", "Count: one,", "Hello, world!", "def add(a, b):", "Q: What is the capital of Peru? A:"]
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


def test_audit_api_measures_batch_size_effects_on_cpu(make_llm):
    found = audit(make_llm("4x32", max_new_tokens=6), "Once upon a time")
    rows = {row.source: row for row in found.rows}
    assert found.unique == 1 and not found.nondeterministic
    assert rows["batch"].max_logit_delta == 0 and not rows["batch"].tokens_changed
    # Measured on this CPU: B=4 vs B=1 moves logits by ~1e-6 (tokens unchanged here).
    assert rows["batch_size"].max_logit_delta > 0
    assert 0 < rows["batch_size"].max_logit_delta < 1e-3
    assert set(rows) == {"repeat", "batch", "batch_size", "padding", "cache", "threads"}


@given(data=st.data())
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fixed_shape_is_batch_invariant(make_llm, data):
    llm = make_llm("4x32", max_new_tokens=4)
    composition = data.draw(batch_compositions(POOL, max_companions=5, llm_model=llm))
    assert_batch_invariant(llm, "The capital of France is", composition)


class ShapeVarying:
    """A deliberately broken runner: the batch shape follows the number of prompts (B = len(batch)),
    as a naive `model.generate(tokenizer(batch, padding=True))` would."""

    def __init__(self, llm):
        self._llm = llm
        self.tokenizer = llm.tokenizer

    def generate(self, prompt):
        batch = [prompt] if isinstance(prompt, str) else list(prompt)
        view = self._llm.with_settings(batch_shape=BatchShape(len(batch), 32))
        results = view.generate(batch)
        return results[0] if isinstance(prompt, str) else results


def test_shape_varying_runner_is_caught_and_shrunk_to_a_minimal_batch(tiny):
    from pytest_llmdeterminism.shape import GenerationSettings

    llm = LLMModel(tiny, GenerationSettings(BatchShape(4, 32), 3, 0))
    broken = ShapeVarying(llm)

    def breaks(composition: BatchComposition) -> bool:
        try:
            assert_batch_invariant(broken, "The capital of France is", composition)
        except BatchInvarianceError:
            return True
        return False

    minimal = find(batch_compositions(POOL, max_companions=5), breaks,
                   settings=settings(max_examples=50, deadline=None, database=None))
    assert len(minimal.companions) == 1
    assert len(minimal.companions[0]) <= len(min(POOL, key=len))
    with pytest.raises(BatchInvarianceError, match=r"changed when batched with .* at row \d"):
        assert_batch_invariant(broken, "The capital of France is", minimal)


def test_plain_list_of_companions_and_prompt_strategy(make_llm):
    llm = make_llm("4x32", max_new_tokens=3)
    assert_batch_invariant(llm, "Count: one,", ["The sky is", "x"])
    strategy = prompts(tokenizer=llm.tokenizer, max_tokens=8)
    assert find(prompts(llm_model=llm), lambda text: len(text) > 20, settings=settings(database=None))
    example = find(strategy, lambda text: len(text) > 3, settings=settings(database=None))
    assert 0 < len(llm.tokenizer(example)["input_ids"]) <= 8


def test_a_companion_of_exactly_l_tokens_is_not_used_by_the_audit(make_llm):
    """'Hello there, how are you today?' is 16 tokens: at 4x16 it cannot be a companion (one
    position always stays padding), so the audit picks others instead of failing."""
    found = audit(make_llm("4x16", max_new_tokens=2), "The sky is", repeats=2)
    assert found.unique == 1
    assert {row.source for row in found.rows if row.ran} >= {"repeat", "batch"}


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


def test_the_sampled_audit_attributes_a_change_to_the_seed_not_to_companions(make_llm):
    llm = make_llm("4x32", max_new_tokens=8)
    found = audit(llm, "Once upon a time", do_sample=True, temperature=3.0, seed=[3])
    rows = {row.source: row for row in found.rows}
    assert found.sampling == {"sampler": "gumbel-xxh3-splitmix/1", "temperature": 3.0, "top_k": 50,
                              "top_p": 1.0, "min_p": 0.0, "seed": 3}
    # the noise is keyed by the row's own prompt: companions move neither logits nor draws
    assert not rows["batch"].moved and not rows["threads"].moved
    seed = rows["seed"]
    assert seed.change == "3 -> 4" and seed.tokens_changed and seed.max_logit_delta == 0
    assert seed.draw_margin is not None and seed.draw_margin > 0  # this seed's draw where seed 4's parted
    greedy = audit(llm, "Once upon a time", repeats=1)
    assert "seed" not in {row.source for row in greedy.rows} and greedy.sampling == {}
    with pytest.raises(ConfigurationError, match=r"audit\(seed=\.\.\.\).*give one seed"):
        audit(llm, "Once upon a time", do_sample=True, temperature=3.0, seed=[3, 4])


def test_a_changed_sampled_row_names_how_near_a_tie_its_draw_was():
    row = AuditRow("dtype", "float32 -> bfloat16", True, 4, 0.06, draw_margin=0.012)
    report = AuditReport("p", "4x32", (row,), 1, 5, {"sampler": "s/1", "temperature": 0.8, "seed": 3})
    again = AuditReport.from_json(report.to_json())
    assert again == report
    assert again.lines()[0] == "audit of 'p' at 4x32, sampled: temperature 0.8, seed 3 (s/1):"
    assert again.lines()[2].endswith("(the draw at step 4 was 0.012 from its runner-up)")
    old = {key: value for key, value in report.to_json().items() if key != "sampling"}  # before sampling
    assert AuditReport.from_json(old).sampling == {}
