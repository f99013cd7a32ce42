"""The plugin's own sampler: faithful to the model's distribution (chi-square, with a negative
control), keyed by the row's own input alone, and pinned so that its noise never changes silently."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pytest_llmdeterminism.errors import ConfigurationError, NonFiniteLogitsError
from pytest_llmdeterminism.sampling import (
    DEFAULT_TOP_K,
    MAX_SEED,
    SAMPLER,
    Draw,
    SamplingConfig,
    _exp_nonpositive,
    _nucleus,
    _token_hashes,
    _unit,
    draw,
    draw_batch,
    gumbel,
    noise_key,
    uniform,
)

PROMPT = "def f(x):"  # the tiny model's flattest next-token distribution found (entropy 2.8 nats)
SEEDS = range(2000)


@pytest.fixture(scope="module")
def model_row(tiny):
    """The tiny model's own next-token logits (float32) and the prompt's ids."""
    ids = tiny.tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = tiny.model(ids).logits[0, -1].float()
    return logits, ids[0].tolist()


def _chi2_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square(dof): the regularised upper gamma Q(dof/2, statistic/2)."""
    a, x = dof / 2, statistic / 2
    if x <= 0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:  # the series of P, then Q = 1 - P
        term = total = 1 / a
        n = a
        while abs(term) > abs(total) * 1e-16:
            n += 1
            term *= x / n
            total += term
        return max(0.0, 1 - total * math.exp(log_front))
    # Lentz's continued fraction for Q
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-16:
            break
    return math.exp(log_front) * h


def test_the_chi_square_survival_function_matches_known_values():
    # Reference values (scipy.stats.chi2.sf): the table every statistics book prints.
    assert _chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)
    assert _chi2_sf(18.307038053275146, 10) == pytest.approx(0.05, rel=1e-9)
    assert _chi2_sf(2.5582121601872063, 10) == pytest.approx(0.99, rel=1e-9)
    assert _chi2_sf(0.0, 3) == 1.0


def _expected(logits: torch.Tensor, *, temperature: float, top_k: int = 50, top_p: float = 1.0,
              min_p: float = 0.0) -> np.ndarray:
    """The distribution the cut leaves, written independently of the module (torch, float64); top_k
    defaults to transformers' 50, as the sampler's does."""
    scores = logits.double() / temperature
    keep = torch.ones_like(scores, dtype=torch.bool)
    if top_k:
        keep &= scores >= torch.topk(scores, top_k).values[-1]
    if top_p < 1:
        probs = torch.softmax(scores.masked_fill(~keep, -math.inf), -1)
        ranked = torch.argsort(-probs, stable=True)
        above = torch.cumsum(probs[ranked], 0) - probs[ranked]
        nucleus = torch.zeros_like(keep)
        nucleus[ranked[above < top_p]] = True
        keep &= nucleus
    if min_p:
        probs = torch.softmax(scores.masked_fill(~keep, -math.inf), -1)
        keep &= probs >= min_p * probs.max()
    return torch.softmax(scores.masked_fill(~keep, -math.inf), -1).numpy()


def _counts(logits: torch.Tensor, ids: list[int], **settings: float) -> np.ndarray:
    counts = np.zeros(logits.numel(), dtype=np.int64)
    for seed in SEEDS:
        config = SamplingConfig(seed=seed, **settings)  # type: ignore[arg-type]
        counts[draw(logits, config, key=config.noise_key(ids), step=0).token_id] += 1
    return counts


def _goodness_of_fit(counts: np.ndarray, probs: np.ndarray) -> float:
    """The chi-square p-value of ``counts`` under ``probs``; bins expecting fewer than 5 draws are
    pooled (the pool joins the smallest bin if it still expects fewer than 5)."""
    expected = probs * counts.sum()
    assert counts[probs == 0].sum() == 0, "a token outside the cut was drawn"
    order = np.argsort(expected)
    bins_e, bins_o = [], []
    pool_e = pool_o = 0.0
    for token in order:
        if probs[token] == 0:
            continue
        if expected[token] < 5:
            pool_e += expected[token]
            pool_o += counts[token]
        else:
            bins_e.append(expected[token])
            bins_o.append(counts[token])
    if pool_e:
        if pool_e < 5 and bins_e:
            bins_e[0] += pool_e
            bins_o[0] += pool_o
        else:
            bins_e.append(pool_e)
            bins_o.append(pool_o)
    assert len(bins_e) >= 3, f"too few bins for a test with power: {bins_e}"
    statistic = sum((o - e) ** 2 / e for o, e in zip(bins_o, bins_e, strict=True))
    return _chi2_sf(statistic, len(bins_e) - 1)


CUTS = [
    {"temperature": 0.7},
    {"temperature": 1.0},
    {"temperature": 1.5},
    {"temperature": 1.0, "top_k": 8},
    {"temperature": 1.0, "top_p": 0.8},
    {"temperature": 1.0, "min_p": 0.05},
    {"temperature": 1.0, "top_k": 0},  # no cut at all
]


@pytest.mark.parametrize("settings", CUTS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_draws_follow_the_models_distribution_and_a_wrong_temperature_is_rejected(model_row, settings):
    logits, ids = model_row
    counts = _counts(logits, ids, **settings)
    faithful = _goodness_of_fit(counts, _expected(logits, **settings))
    wrong = _goodness_of_fit(counts, _expected(logits, **{**settings,
                                                          "temperature": settings["temperature"] * 1.3}))
    assert (faithful > 1e-3, wrong < 1e-6) == (True, True), (faithful, wrong)


def test_the_cut_keeps_exactly_what_transformers_keeps(model_row):
    """Which tokens can be drawn at all: the support of 2000 draws lies inside the reference cut,
    and every draw's ``kept`` is the size of that cut."""
    logits, ids = model_row
    for settings in CUTS[3:]:
        support = int((_expected(logits, **settings) > 0).sum())
        config = SamplingConfig(seed=1, **settings)  # type: ignore[arg-type]
        assert draw(logits, config, key=config.noise_key(ids), step=0).kept == support, settings


def test_same_seed_input_and_step_give_the_same_token_and_other_seeds_other_tokens(model_row):
    logits, ids = model_row
    config = SamplingConfig(temperature=1.0, seed=7)
    first = draw(logits, config, key=config.noise_key(ids), step=5)
    assert draw(logits.clone(), config, key=noise_key(7, list(ids)), step=5) == first
    tokens = {draw(logits, SamplingConfig(seed=s), key=noise_key(s, ids), step=5).token_id
              for s in range(200)}
    steps = {draw(logits, config, key=config.noise_key(ids), step=t).token_id for t in range(200)}
    assert (len(tokens) >= 10, len(steps) >= 10) == (True, True)


def test_a_rows_draw_depends_on_the_row_alone_not_its_position_or_companions(model_row):
    logits, ids = model_row
    config = SamplingConfig(temperature=1.0, top_p=0.95, seed=3)
    others = torch.randn(5, logits.numel(), generator=torch.Generator().manual_seed(0)) * 3
    keys = [config.noise_key(ids)] + [config.noise_key([9, i]) for i in range(3)]
    for step in range(20):
        alone = draw(logits, config, key=keys[0], step=step)
        front = draw_batch(torch.stack([logits, *others[:3]]), config, keys=keys, step=step)
        back = draw_batch(torch.stack([others[3], others[4], logits]), config,
                          keys=[keys[1], keys[3], keys[0]], step=step)
        assert (front[0], back[2]) == (alone, alone)
        assert front[1:] == [draw(row, config, key=k, step=step)
                             for row, k in zip(others[:3], keys[1:], strict=True)]


def test_a_batch_takes_one_config_per_row():
    logits = torch.randn(2, 300, generator=torch.Generator().manual_seed(1)) * 2
    configs = [SamplingConfig(temperature=0.5, seed=1), SamplingConfig(temperature=2.0, top_k=3, seed=2)]
    keys = [c.noise_key([1]) for c in configs]
    assert draw_batch(logits, configs, keys=keys, step=0) == [
        draw(logits[i], configs[i], key=keys[i], step=0) for i in range(2)]


@pytest.mark.parametrize("settings", [{"temperature": 1.0}, {"temperature": 0.6, "top_k": 40},
                                      {"temperature": 1.3, "top_p": 0.9, "min_p": 0.01}])
def test_winner_and_margin_are_those_of_the_exact_noise_over_every_token(model_row, settings):
    """The draw screens with a float64 log, then decides with exact noise: the result must equal the
    brute force with exact noise on every token. The margin is the nearest way the draw can change:
    another kept token's perturbed score passing the winner's, or a token the cut left out rising to
    every floor of the cut (the lowest score top-k / top-p kept, min-p's threshold) and passing it."""
    logits, ids = model_row
    scores = logits.double().numpy() / settings["temperature"]
    support = np.flatnonzero(_expected(logits, **settings) > 0)
    ranked = np.flatnonzero(_expected(logits, **{**settings, "min_p": 0.0}) > 0)
    floors = [scores[ranked].min()] if ranked.size < scores.size else []
    if settings.get("min_p"):
        floors.append(scores.max() + math.log(settings["min_p"]))
    for seed in range(8):
        config = SamplingConfig(seed=seed, **settings)  # type: ignore[arg-type]
        key = config.noise_key(ids)
        perturbed = scores + np.array(gumbel(key, seed, list(range(scores.size))))
        winner = int(support[np.argmax(perturbed[support])])
        others = [perturbed[winner] - perturbed[t] for t in support if t != winner]
        left_out = [max(*(f - scores[t] for f in floors), perturbed[winner] - perturbed[t])
                    for t in np.setdiff1d(np.arange(scores.size), support)]
        assert floors and left_out  # every setting here cuts
        # the winner falls out once a left-out token's score (or min-p's floor) reaches its own
        falls_out = [scores[winner] - scores[np.setdiff1d(np.arange(scores.size), support)].max()]
        falls_out += [scores[winner] - floors[-1]] if settings.get("min_p") else []
        found = draw(logits, config, key=key, step=seed)
        assert (found.token_id, found.kept) == (winner, support.size)
        assert found.margin == pytest.approx(min(others + left_out + falls_out), rel=1e-12, abs=1e-12)
        assert found.margin <= min(others)


@pytest.mark.parametrize("cut", [{"top_k": 3}, {"top_k": 1}, {"top_k": 0, "min_p": 0.2},
                                 {"top_k": 8, "min_p": 0.05}], ids=str)
def test_logit_drift_changes_a_draw_only_where_its_margin_is_within_the_drift(cut):
    """What SAMPLE_FLIP relies on: logits moved by at most d each move a perturbed score by d / T,
    so a draw whose margin exceeds 2 d / T cannot change, even where the drift moves a token across
    the top-k or min-p boundary of the cut (a token just outside it entering and winning)."""
    rng = np.random.default_rng(0)
    changed = 0
    for case in range(400):
        logits = (rng.standard_normal(48) * 2).astype(np.float32)
        d, temperature = float(rng.choice([0.01, 0.05, 0.2])), float(rng.choice([0.5, 1.0, 2.0]))
        moved = (logits + rng.uniform(-d, d, logits.size)).astype(np.float32)
        d = float(np.abs(moved.astype(np.float64) - logits).max())  # as float32 rounded it
        config = SamplingConfig(temperature=temperature, seed=case, **cut)  # type: ignore[arg-type]
        before, after = (draw(row, config, key=case, step=0) for row in (logits, moved))
        if before.token_id != after.token_id:
            changed += 1
            assert before.margin <= 2 * d / temperature * (1 + 1e-9), (case, before, after, d, temperature)
    assert changed >= 10  # the drift does change draws: the bound is tested, not vacuous


def test_the_screening_log_is_within_its_tolerance_of_the_exact_noise():
    key = noise_key(5, [1, 2])
    tokens = np.arange(4096)
    approx = -np.log(-np.log(_unit(_token_hashes(key, 9, tokens))))
    assert np.max(np.abs(approx - np.array(gumbel(key, 9, tokens.tolist())))) < 1e-12


def test_one_kept_token_is_as_far_from_a_change_as_the_cut_and_top_k_keeps_ties_at_its_boundary():
    """top_k=1 keeps token 1 (score 3); the draw changes only once another token's score reaches 3
    (the next best scores 1), so the margin is 2. Where nothing is cut, it is infinite."""
    logits = torch.tensor([0.0, 3.0, 1.0, 1.0, 1.0, -2.0])
    assert draw(logits, SamplingConfig(top_k=1, seed=0), key=1, step=0) == Draw(1, 2.0, 1)
    assert draw(logits, SamplingConfig(top_k=2, seed=0), key=1, step=0).kept == 4
    suppressed = torch.tensor([-math.inf, 3.0, -math.inf])
    assert draw(suppressed, SamplingConfig(seed=0), key=1, step=0) == Draw(1, math.inf, 1)


def test_non_finite_logits_are_refused():
    with pytest.raises(NonFiniteLogitsError, match="at step 4 .row 2 of the batch"):
        draw_batch(torch.tensor([[0.0, 1.0]] * 2 + [[math.nan, 1.0]]), SamplingConfig(seed=0),
                   keys=[1, 2, 3], step=4)


def test_the_nucleus_of_a_partial_sort_is_that_of_the_full_sort():
    """``_nucleus`` sorts only the best tokens; with ties and a nucleus of thousands it must agree
    with a full stable sort."""
    sizes = []
    for seed, (reach_share, spread) in enumerate(((0.5, 4.0), (0.7, 2.5), (0.999, 0.5))):
        values = np.round(np.random.default_rng(seed).normal(size=20_000) * spread, 1)  # many ties
        weights = _exp_nonpositive(values - values.max())
        reach = reach_share * np.cumsum(weights)[-1]
        order = np.argsort(-values, kind="stable")
        full = order[np.concatenate(([0.0], np.cumsum(weights[order])[:-1])) < reach]
        assert np.array_equal(_nucleus(values, weights, reach), full)
        sizes.append(full.size)
    assert (sizes[0] < 256 < sizes[1] < 2048 < sizes[2]), sizes  # no regrowth, one, to the whole row


def test_the_exp_of_the_cut_is_accurate():
    x = -np.linspace(0, 744, 200_001)
    exact = np.array([math.exp(v) for v in x])
    relative = np.abs(_exp_nonpositive(x) - exact) / np.maximum(exact, 1e-300)
    assert float(relative[exact > 1e-300].max()) < 4e-16


# The cross-CPU guarantee: these numbers are the sampler's definition. If one changes, the sampler
# changed, and SAMPLER's version must change with it (goldens record it).
def test_the_noise_is_pinned():
    assert SAMPLER == "gumbel-xxh3-splitmix/1"
    key = noise_key(0, [1, 2, 3])
    assert (key, noise_key(MAX_SEED, [])) == (3351146345649969386, 11687913294787043142)
    assert uniform(key, 0, [0, 1, 511]) == [0.23094706842568746, 0.10314528798432565, 0.9067225154860389]
    assert gumbel(key, 0, [0, 1, 511]) == [-0.3822420179904012, -0.820491790196402, 2.3236165896346415]
    far = noise_key(MAX_SEED, [])
    assert (uniform(far, 1000, [49151]), gumbel(far, 1000, [49151])) == (
        [0.012992801185979341], [-1.4686482029467707])


def test_draws_are_pinned():
    logits = ((np.arange(512, dtype=np.int64) * 7919) % 1000 / 100.0).astype(np.float32)
    plain = SamplingConfig(temperature=1.0, top_k=0, seed=42)
    cut = SamplingConfig(temperature=0.7, top_k=20, top_p=0.9, min_p=0.02, seed=42)
    assert draw(logits, plain, key=plain.noise_key([5, 6, 7]), step=3) == Draw(100, 1.7118305015418755, 512)
    assert draw(logits, cut, key=cut.noise_key([5, 6, 7]), step=3) == Draw(494, 0.24653641202298537, 18)


@given(key=st.integers(0, 2**64 - 1), step=st.integers(0, 2**31),
       tokens=st.lists(st.integers(0, 2**40), min_size=1, max_size=8))
def test_u_is_strictly_inside_the_unit_interval(key, step, tokens):
    assert all(0 < u < 1 for u in uniform(key, step, tokens))


@given(h=st.one_of(st.sampled_from([0, 1, 2**11, 2**64 - 1, 2**64 - 2**11]), st.integers(0, 2**64 - 1)))
def test_u_is_exactly_the_top_bits_made_odd(h):
    u = float(_unit(np.array([h], dtype=np.uint64))[0])
    assert Fraction(u) == Fraction(2 * (h >> 12) + 1, 2**53)
    assert 2.0**-53 <= u <= 1 - 2.0**-53


@pytest.mark.parametrize(("settings", "message"), [
    ({"temperature": 0}, "temperature=0 with do_sample=True is an error"),
    ({"temperature": -1.0}, r"generate\(temperature=...\) = -1.0: expected a finite number > 0"),
    ({"temperature": math.inf}, "expected a finite number > 0"),
    ({"top_k": -1}, r"top_k=...\) = -1: expected an integer >= 0"),
    ({"top_k": True}, "expected an integer >= 0"),
    ({"top_p": 0}, "0 < top_p <= 1"),
    ({"top_p": 1.5}, "0 < top_p <= 1"),
    ({"min_p": 1}, "0 <= min_p < 1"),
    ({"min_p": math.nan}, "0 <= min_p < 1"),
    ({"seed": -1}, r"seed=...\) = -1: expected an integer from 0 to 2\*\*63 - 1"),
    ({"seed": MAX_SEED + 1}, "expected an integer from 0 to 2"),
    ({"seed": "7"}, "expected an integer from 0 to 2"),
])
def test_bad_settings_are_refused_with_what_to_pass(settings, message):
    with pytest.raises(ConfigurationError, match=message):
        SamplingConfig(**{"seed": 0, **settings})  # type: ignore[arg-type]


def test_the_default_cut_is_the_one_transformers_generate_applies(tiny, model_row):
    """transformers' generate(do_sample=True) with no sampling argument, under the library's own
    GenerationConfig (no checkpoint defaults), keeps the 50 best tokens unchanged at temperature 1
    and suppresses the rest; the sampler's defaults keep exactly those tokens."""
    from transformers import GenerationConfig

    logits, ids = model_row
    checkpoint = tiny.model.generation_config
    tiny.model.generation_config = GenerationConfig()
    try:
        out = tiny.model.generate(torch.tensor([ids]), do_sample=True, max_new_tokens=1, output_scores=True,
                                  return_dict_in_generate=True, pad_token_id=0)
    finally:
        tiny.model.generation_config = checkpoint
    processed = out.scores[0][0]
    kept_by_transformers = torch.isfinite(processed).nonzero().flatten()
    assert kept_by_transformers.numel() == DEFAULT_TOP_K == SamplingConfig(seed=0).top_k == 50
    # T = 1 leaves the scores as they are (generate's own forward differs from model_row's in the last bits)
    assert torch.allclose(processed[kept_by_transformers], logits[kept_by_transformers], atol=1e-4)
    config = SamplingConfig(seed=0)
    assert draw(logits, config, key=config.noise_key(ids), step=0).kept == DEFAULT_TOP_K
    support = np.flatnonzero(_expected(logits, temperature=1.0) > 0)
    assert support.tolist() == sorted(kept_by_transformers.tolist())


def test_the_settings_a_golden_records():
    assert SamplingConfig(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, seed=3).as_dict() == {
        "sampler": SAMPLER, "temperature": 0.7, "top_k": 50, "top_p": 0.9, "min_p": 0.05, "seed": 3}
