"""Seeded sampling through a server (``model/served_sampling.py``): recorded with the server's sampler
only once the ``concurrent`` and ``seed`` rows verify; refused with their evidence otherwise. Toy
servers with known faults (``tests/helpers/served_toy.py``)."""

from __future__ import annotations

import pytest

from pytest_llmdeterminism import ConfigurationError
from pytest_llmdeterminism.decoding import DecodingConfig, resolve_generation_config
from pytest_llmdeterminism.engines import load
from pytest_llmdeterminism.engines.server.completions import request_body
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.model.served_sampling import SEEDS, Paired, seed_pairs, sign_test
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings
from tests.helpers.served_toy import Behaviour, Noise, ToyServer


@pytest.fixture
def toy():
    servers: list[ToyServer] = []

    def start(noise: Noise, seed_modulus: int = 0) -> ToyServer:
        servers.append(ToyServer(Behaviour(noise=noise, seed_modulus=seed_modulus)))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def model(server: ToyServer) -> LLMModel:
    loaded = load(server.spec(), dtype="float32", device="cpu")
    return LLMModel(loaded, GenerationSettings(BatchShape(1, 32), 3, 7))


def test_the_sign_test_is_exact():
    assert sign_test(0, 0) == 1.0
    assert sign_test(10, 0) == 2**-10
    assert sign_test(3, 3) == 42 / 64  # P(X >= 3), X ~ Binomial(6, 1/2): (20 + 15 + 6 + 1) / 64
    assert sign_test(0, 5) == 1.0


def test_a_pair_counts_only_the_seeds_where_one_side_agreed():
    paired = Paired.of("the same token", [True, True, False, True], [False, True, True, False])
    assert (paired.same, paired.other, paired.b, paired.c, paired.pairs) == (3, 2, 2, 1, 4)
    assert paired.p == 4 / 8 and not paired.shared


def _config(**overrides) -> DecodingConfig:
    return resolve_generation_config(overrides, max_new_tokens=3, eos_token_ids=[2], pad_token_id=0, seed=5)


def test_a_sampled_request_sends_the_test_settings_and_seed_and_a_greedy_one_is_unchanged():
    greedy = request_body("m", [1, 2], _config(), 5)
    assert (greedy["temperature"], greedy["top_p"], greedy["seed"]) == (0.0, 1.0, 5) and "top_k" not in greedy
    sampled = request_body("m", [1, 2], _config(do_sample=True, temperature=0.7, top_k=0, top_p=0.9), 11)
    assert {k: sampled[k] for k in ("temperature", "top_k", "top_p", "min_p", "seed")} == \
        {"temperature": 0.7, "top_k": 0, "top_p": 0.9, "min_p": 0.0, "seed": 11}


def test_a_faithful_server_is_verified_once_and_its_sample_recorded_as_its_own(toy):
    server = toy(Noise.FAITHFUL)
    llm = model(server)
    first = llm.generate("The cat", do_sample=True, temperature=0.8)
    assert first.generation_config["sampler"] == "engine:openai@toy-1"
    assert first.generation_config["seed"] == 7 and first.generation_config["temperature"] == 0.8
    assert server.log.completions[-1]["seed"] == 7 and server.log.completions[-1]["temperature"] == 0.8
    rows = llm.loaded.served_sampling.rows
    assert rows[0].startswith("concurrent: ") and rows[0].endswith("identical")
    assert rows[1].startswith("seed: with one seed, the two prompts drew the same token for ")
    seen = len(server.log.completions)
    again = llm.generate(["The cat", "The cat"], do_sample=True, temperature=0.8, seed=[7, 8])
    assert len(server.log.completions) == seen + 2  # verified once: only the two requests
    assert again[0].token_ids == first.token_ids and again[1].generation_config["seed"] == 8
    assert [c["seed"] for c in server.log.completions[-2:]] == [7, 8]


SHARED = ("the seed row failed: different prompts sent with one seed share noise ('Once upon a time' and "
          "'The weather today is': with one seed, the two prompts drew the same {} for {} of {} seeds; with "
          "different seeds, for ")


@pytest.mark.parametrize(("noise", "evidence"), [
    (Noise.SHARED, SHARED.format("token", SEEDS, SEEDS)),
    (Noise.UNIFORM, SHARED.format("rank", SEEDS, SEEDS)),
    (Noise.BATCHED, "the concurrent row failed: a sample of 'Once upon a time' (seed 1, temperature 1000) "
                    "drew other tokens among 3 concurrent requests (round 1 of 2, sent at position "),
    (Noise.IGNORED, f"the seed row failed: seed: 'Once upon a time' drew the same token for each of {SEEDS} "
                    "seeds at temperature 1000: the server ignores the request's seed"),
], ids=lambda v: v.value if isinstance(v, Noise) else "")
def test_a_server_that_cannot_hold_a_seeded_sample_is_refused_with_the_evidence(toy, noise, evidence):
    server = toy(noise)
    llm = model(server)
    with pytest.raises(ConfigurationError) as caught:
        llm.generate("The cat", do_sample=True, temperature=0.8)
    text = str(caught.value)
    assert text.startswith("llm_model.generate(do_sample=True) = True: engine:openai@toy-1 cannot draw "
                           "seeded samples that a golden can hold, so do_sample=True is refused on it: ")
    assert evidence in text and "llamacpp:PATH.gguf" in text
    seen = len(server.log.completions)
    with pytest.raises(ConfigurationError, match="refused on it"):
        llm.generate("The cat", do_sample=True, temperature=0.8)
    assert len(server.log.completions) == seen  # the verdict is kept: nothing is sent again


@pytest.mark.parametrize(("noise", "modulus", "event"), [
    (Noise.SHARED, 2, "token"), (Noise.SHARED, 16, "token"), (Noise.UNIFORM, 2, "rank")])
def test_a_server_that_reads_only_part_of_the_seed_is_refused(toy, noise, modulus, event):
    """T10: noise keyed by ``seed % 2`` or ``seed % 16`` (shared by every prompt): the other-seed pair
    must not draw with the same noise, as it did when it was always ``s + 16``."""
    server = toy(noise, modulus)
    with pytest.raises(ConfigurationError) as caught:
        model(server).generate("The cat", do_sample=True, temperature=0.8)
    assert SHARED.format(event, SEEDS, SEEDS) in str(caught.value)


def test_the_seed_rows_seeds_are_distant():
    same, other = seed_pairs()
    assert len(same) == len(other) == SEEDS and len(set(same) | set(other)) == 2 * SEEDS
    assert [s % 2 for s in same] == [0, 1] * (SEEDS // 2)  # odd and even both
    assert all(s % 2 != o % 2 for s, o in zip(same, other, strict=True))  # so apart modulo every 2**k
    assert all(0 <= s < 2**31 for s in same + other) and max(same + other) >= 2**30  # the high bits too
    assert sum((s ^ o) >> 16 != 0 for s, o in zip(same, other, strict=True)) >= SEEDS - 1


def test_a_drawn_token_below_the_best_is_accepted_only_from_a_sampled_request():
    from pytest_llmdeterminism import EngineError
    from pytest_llmdeterminism.engines.server.completions import Completion, parse_choice

    top = {"token_id:300": -0.5, "token_id:301": -1.0, "token_id:302": -2.0}
    answer = {"choices": [{"logprobs": {"tokens": ["token_id:302"], "token_logprobs": [-2.0],
                                        "top_logprobs": [top]}}]}
    import msgspec

    completion = msgspec.convert(answer, Completion)
    common = {"prompt_tokens": 2, "max_tokens": 1, "vocab_size": 512, "token_id": lambda t: int(t[9:])}
    row = parse_choice("spec", completion, sampled=True, **common)
    assert row.tokens == [302] and row.steps.top == [((300, -0.5), (301, -1.0), (302, -2.0))]
    with pytest.raises(EngineError, match="did not decode greedily at step 0"):
        parse_choice("spec", completion, **common)


def test_a_drawn_token_outside_the_returned_top_k_leaves_the_top_k_as_the_model_ranked_it():
    import msgspec

    from pytest_llmdeterminism.engines.server.completions import Completion, parse_choice

    answer = {"choices": [{"logprobs": {"tokens": ["token_id:309"], "token_logprobs": [-4.0],
                                        "top_logprobs": [{"token_id:300": -0.5, "token_id:301": -1.0}]}}]}
    row = parse_choice("spec", msgspec.convert(answer, Completion), sampled=True, prompt_tokens=2,
                       max_tokens=1, vocab_size=512, token_id=lambda t: int(t[9:]))
    assert row.tokens == [309] and row.steps.top == [((300, -0.5), (301, -1.0))]
    assert row.steps.margins == [0.5]


def test_llm_audit_of_a_sampled_server_generation_shows_the_rows_that_verified_its_sampling(toy):
    from pytest_llmdeterminism.model.audit import after_generate_hook
    from pytest_llmdeterminism.reporting.audit import ServingAudit

    server = toy(Noise.FAITHFUL)
    recorded: list[dict] = []
    llm = LLMModel(load(server.spec(slots=2), dtype="float32", device="cpu"),
                   GenerationSettings(BatchShape(1, 32), 2, 7),
                   after_generate=after_generate_hook(2, None, recorded.append))
    llm.generate("The cat", do_sample=True, temperature=0.8)
    (found,) = map(ServingAudit.from_json, recorded)
    assert found.sampling == llm.loaded.served_sampling.rows and len(found.sampling) == 2
    lines = found.lines()
    assert lines[-2] == f"  seeded sampling, verified once for the session: {found.sampling[0]}"
    assert lines[-1].startswith("  seeded sampling, verified once for the session: seed: with one seed, ")
