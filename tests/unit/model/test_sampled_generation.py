"""Sampled generation (``do_sample=True``) with the plugin's own seeded sampler, in process on the
tiny model: a row's sample depends on its seed and its own prompt alone, a sampled golden round-trips
and another setting is an input change, seeds must match the prompts, engines that cannot own the
draw refuse, and a flip at a near tie of the draw is SAMPLE_FLIP, a confident one a regression.
The sampler's faithfulness (chi-square over many seeds, and a wrong temperature as the negative
control) is tested in ``tests/unit/test_sampling.py``; sampled goldens in pytest runs in
``tests/pytester/test_sampled_generation_runs.py``."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from pytest_llmdeterminism.errors import ConfigurationError
from pytest_llmdeterminism.goldens import schema
from pytest_llmdeterminism.goldens.kinds.generation import input_changes
from pytest_llmdeterminism.judge.compare import Verdict, compare

PROMPT = "Once upon a time"
SAMPLED = {"do_sample": True, "temperature": 1.5}


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def test_a_rows_sample_depends_on_its_seed_and_prompt_alone(make_llm, threads):
    alone = make_llm("1x32").generate(PROMPT, **SAMPLED, seed=3)
    batched = make_llm("4x32").generate(["Hello there", "x y z", PROMPT], **SAMPLED, seed=[1, 2, 3])
    first_row = make_llm("4x32").generate([PROMPT, "The weather today is"], **SAMPLED, seed=[3, 9])
    threads(1)
    one_thread = make_llm("4x32").generate(PROMPT, **SAMPLED, seed=3)
    for other in (batched[2], first_row[0], one_thread):
        assert other.token_ids == alone.token_ids
        # the batch shape moves the logits by ~1e-6 (unless llm_batch_invariant), not the sample
        assert other.draw_margins == pytest.approx(alone.draw_margins, abs=1e-4)
    # within one shape: the same bits at another row, among other companions, at 1 and 2 threads
    assert batched[2].step_hashes == first_row[0].step_hashes == one_thread.step_hashes
    assert batched[2].draw_margins == first_row[0].draw_margins == one_thread.draw_margins
    assert len(alone.draw_margins) == len(alone.token_ids) and all(m >= 0 for m in alone.draw_margins)
    assert alone.generation_config["seed"] == 3 and alone.generation_config["do_sample"] is True


def test_different_seeds_give_different_samples_and_greedy_is_not_one_of_them_by_default(make_llm):
    llm = make_llm("4x32", max_new_tokens=10)
    samples = {llm.generate(PROMPT, **SAMPLED, seed=seed).token_ids for seed in range(8)}
    assert len(samples) >= 4, samples
    greedy = llm.generate(PROMPT)
    assert greedy.draw_margins == () and "sampler" not in greedy.generation_config
    # the test's own seed is the default: @deterministic(seed=...) decides the sample
    assert make_llm(max_new_tokens=10, seed=5).generate(PROMPT, **SAMPLED).token_ids == \
        llm.generate(PROMPT, **SAMPLED, seed=5).token_ids


def test_a_sampled_golden_round_trips_and_another_setting_is_an_input_change(make_llm):
    llm = make_llm("4x32")
    recorded = llm.generate(PROMPT, **SAMPLED, seed=3, top_k=20)
    entry = json.loads(json.dumps(schema.to_entry(recorded)))
    assert schema.from_entry(entry) == recorded and entry["draw_margins"] == list(recorded.draw_margins)
    assert compare(schema.from_entry(entry), llm.generate(PROMPT, **SAMPLED, seed=3, top_k=20)).verdict \
        is Verdict.IDENTICAL
    for changed, field in (({"seed": 4, "top_k": 20}, "generation_config.seed"),
                           ({"seed": 3, "top_k": 10}, "generation_config.top_k")):
        names = [name for name, _, _ in input_changes(recorded, llm.generate(PROMPT, **SAMPLED, **changed))]
        assert names == [field]
    greedy = [name for name, _, _ in input_changes(recorded, llm.generate(PROMPT))]
    assert "generation_config.do_sample" in greedy and "generation_config.temperature" in greedy
    assert "draw_margins" not in schema.to_entry(llm.generate(PROMPT))  # greedy goldens never carry it


def test_without_top_k_a_sampled_test_cuts_at_transformers_default_and_records_it(make_llm):
    """No top_k (or top_k=None) is transformers' generate() default, top_k=50, and the golden records
    50; the tiny checkpoint's generation_config.json (top_k 20, temperature 0.7) is not applied.
    top_k=0 is no cut: other samples, recorded as 0."""
    llm = make_llm("4x32")
    prompts, seeds = [PROMPT] * 8, list(range(8))
    default = llm.generate(prompts, **SAMPLED, seed=seeds)
    assert {(g.generation_config["top_k"], g.generation_config["temperature"]) for g in default} \
        == {(50, 1.5)}
    for same in (llm.generate(prompts, **SAMPLED, seed=seeds, top_k=50),
                 llm.generate(prompts, **SAMPLED, seed=seeds, top_k=None)):
        assert [compare(g, s).verdict for g, s in zip(default, same, strict=True)] == [Verdict.IDENTICAL] * 8
    no_cut = llm.generate(prompts, **SAMPLED, seed=seeds, top_k=0)
    assert {g.generation_config["top_k"] for g in no_cut} == {0}
    assert [g.token_ids for g in no_cut] != [g.token_ids for g in default]


def test_n_samples_of_one_prompt_need_n_seeds(make_llm):
    """The docs' recipe: one seed gives one sample however often the prompt is repeated (the noise is
    keyed by the seed and the prompt's own ids); seed=list(range(n)) gives n samples."""
    llm = make_llm("4x32")
    n = 6
    one_seed = llm.generate([PROMPT] * n, **SAMPLED, seed=3)
    assert len({sample.token_ids for sample in one_seed}) == 1
    samples = llm.generate([PROMPT] * n, **SAMPLED, seed=list(range(n)))
    assert [sample.generation_config["seed"] for sample in samples] == list(range(n))
    assert len({sample.token_ids for sample in samples}) >= 3


def test_seeds_must_match_the_prompts(make_llm):
    with pytest.raises(ConfigurationError, match=r"expected one seed per prompt \(2\)"):
        make_llm().generate([PROMPT, "Hello"], **SAMPLED, seed=[1, 2, 3])


@pytest.mark.parametrize("engine", ["openai", "vllm"])
def test_engines_that_cannot_own_the_draw_refuse_sampling(tiny, engine):
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    never = SimpleNamespace(name=engine, runs_rows_alone=True, owns_sampling=False, supports_audit=False,
                            eos_token_ids=lambda: [2],
                            run=lambda *args: pytest.fail("a refused call must not run"))
    loaded = SimpleNamespace(**{**vars(tiny), "engine": never, "spec": f"{engine}:x"})
    llm = LLMModel(loaded, GenerationSettings(BatchShape(1, 32), 4, 0))
    with pytest.raises(ConfigurationError, match=f"sampling is not available on the {engine} engine.*"
                                                 "Test sampled generation on the transformers backend"):
        llm.generate(PROMPT, **SAMPLED)


def test_a_flip_at_a_near_tie_of_the_draw_is_sample_flip_and_a_confident_draw_a_regression(make_llm):
    """The golden's draw at step 1 planted as another token: with a draw margin below the tie margin over
    T it is SAMPLE_FLIP, which near_tie tolerates and exact does not; with a wide one, REGRESSION."""
    import dataclasses

    from pytest_llmdeterminism.judge.tolerance import Profile, ProfileName

    llm = make_llm("4x32", max_new_tokens=8)
    run = llm.generate(PROMPT, **SAMPLED, seed=3)
    assert len(run.token_ids) >= 3
    other = next(token for token, _ in run.top_logprobs[1] if token != run.token_ids[1])

    def planted(draw_margin: float):
        tokens = list(run.token_ids)
        tokens[1] = other
        margins = list(run.draw_margins)
        margins[1] = draw_margin
        return dataclasses.replace(run, token_ids=tuple(tokens), draw_margins=tuple(margins))

    near = compare(planted(0.01), run)  # 0.01 < 0.05 / 1.5
    assert near.verdict is Verdict.SAMPLE_FLIP and near.divergence.step == 1
    assert near.divergence.draw_margin == 0.01 and near.divergence.temperature == 1.5
    assert Profile(ProfileName.NEAR_TIE).accepts(near) and not Profile(ProfileName.EXACT).accepts(near)
    far = compare(planted(0.5), run)  # 0.5 >= 0.05 / 1.5
    assert far.verdict is Verdict.REGRESSION
    assert not Profile(ProfileName.NEAR_TIE).accepts(far)
    # greedy goldens keep their own rule: no draw margins, no SAMPLE_FLIP
    greedy = llm.generate(PROMPT)
    assert compare(dataclasses.replace(greedy, token_ids=(other, *greedy.token_ids[1:])), greedy).verdict \
        in (Verdict.TIE_FLIP, Verdict.REGRESSION)
