"""The determinism audit (``model/audit.py``) called in process on the tiny model: the batch size's
effects measured, the fixed shape batch invariant under Hypothesis, a shape-varying runner caught and
shrunk to a minimal batch, companions of exactly L tokens left out, and the sampled audit's
attribution (the seed, not the companions; how near a tie the draw was)."""

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from pytest_llmdeterminism import ConfigurationError
from pytest_llmdeterminism.model.audit import audit
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.reporting.audit import AuditReport, AuditRow
from pytest_llmdeterminism.shape import BatchShape
from pytest_llmdeterminism.strategies import (
    BatchComposition,
    BatchInvarianceError,
    assert_batch_invariant,
    batch_compositions,
    prompts,
)

POOL = ["The sky is", "Count: one,", "Hello, world!", "def add(a, b):", "Q: What is the capital of Peru? A:"]


@pytest.mark.usefixtures("previous_kernels")
def test_audit_api_measures_batch_size_effects_on_cpu(make_llm):
    """On the previous kernels (llm_batch_invariant = false) the batch size moves the logits."""
    found = audit(make_llm("4x32", max_new_tokens=6), "Once upon a time")
    rows = {row.source: row for row in found.rows}
    assert found.unique == 1 and not found.nondeterministic
    assert rows["batch"].max_logit_delta == 0 and not rows["batch"].tokens_changed
    # Measured on this CPU: B=4 vs B=1 moves logits by ~1e-6 (tokens unchanged here).
    assert rows["batch_size"].max_logit_delta > 0
    assert 0 < rows["batch_size"].max_logit_delta < 1e-3
    assert set(rows) == {"repeat", "batch", "batch_size", "padding", "cache", "threads",
                         "decode-vs-prefill", "chunked-prefill", "prefix-reuse", "speculative"}


def test_on_the_default_kernels_the_batch_size_moves_nothing(make_llm):
    rows = {row.source: row for row in audit(make_llm("4x32", max_new_tokens=6), "Once upon a time").rows}
    assert rows["batch_size"].max_logit_delta == 0 and not rows["batch_size"].tokens_changed
    assert rows["padding"].max_logit_delta == 0


def test_the_phase_rows_hold_on_the_default_kernels_and_name_the_first_position_elsewhere(tiny, make_llm):
    """``chunked-prefill`` (chunks 1, 2, 7, 64) and ``prefix-reuse``: no effect on the default kernels;
    on the previous ones (SDPA, other decode linears) the first position that differs, with the top-2
    margin of the one-forward logits there, computed here independently."""
    import torch

    from pytest_llmdeterminism.compute.kernels import Policy
    from tests.helpers.batch_invariant import on_policy

    prompt = "The capital of France is Paris, and the capital of Italy is"
    llm = make_llm("4x32", max_new_tokens=6)
    found = audit(llm, prompt, repeats=1)
    rows = {row.source: row for row in found.rows}
    for source in ("chunked-prefill", "prefix-reuse"):
        assert rows[source].ran and not rows[source].moved, rows[source]
        assert rows[source].first_step is None and rows[source].max_logit_delta == 0
    assert rows["chunked-prefill"].change == "chunks 1, 2, 7, 64"
    assert any(line.lstrip().startswith("chunked-prefill") and line.endswith("no effect")
               for line in found.lines())
    with on_policy(tiny, Policy.ONEDNN_AVX2):
        generation = llm.generate(prompt)
        moved = {row.source: row for row in audit(llm, prompt, repeats=1).rows}
        ids = list(generation.prompt_token_ids) + list(generation.token_ids)
        once = tiny.engine.phase_logits(ids, [len(ids)], llm.settings.seed)
        chunk = int(moved["chunked-prefill"].change.split(": ")[1].split()[0])
        pieces = [min(chunk, len(ids) - start) for start in range(0, len(ids), chunk)]
        other = tiny.engine.phase_logits(ids, pieces, llm.settings.seed)
    row = moved["chunked-prefill"]
    first = int(torch.nonzero((once != other).any(dim=-1))[0])
    top = torch.log_softmax(once[first], dim=-1).topk(2).values
    assert (row.first_step, row.draw_margin) == (first, float(top[0] - top[1])) and row.moved
    assert row.max_logit_delta == float((once - other).abs().max()) > 0
    report = AuditReport(prompt, "4x32", (row,), 1, 1)
    assert not row.tokens_changed  # no greedy token moved: the row names the first position that did
    assert f"(at position {first}, where the top two logprobs were {row.draw_margin:.2g} apart)" \
        in report.lines()[-1]
    assert report.lines()[-1].startswith(f"  chunked-prefill  {row.change}  ")  # the columns stay apart


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


@pytest.mark.usefixtures("previous_kernels")
def test_shape_varying_runner_is_caught_and_shrunk_to_a_minimal_batch(tiny):
    """On the previous kernels; on the batch-invariant ones, the default, such a runner is not broken."""
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
