"""Position-canonical attention (``tensor_ops.canonical_attention``): a position's bits are a function of
its own query and the keys and values up to it, whatever the phase computing it (one prefill, a decode
step, a prefill in chunks, a prefill continuing a reused prefix) and the threads; so under the default
kernels a generation's steps are the teacher-forced score's positions, bit for bit. SDPA, and the
previous kernels, are the negative controls: the same checks find their bits moving."""

from __future__ import annotations

import pytest
import torch

from pytest_llmdeterminism.compute.kernels import Policy
from pytest_llmdeterminism.compute.tensor_ops import canonical_attention
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings
from tests.helpers.batch_invariant import on_policy
from tests.helpers.phases import CHUNKS, PHASE_PROMPTS, logits_in_chunks, logits_on_a_reused_prefix, long_ids

# (query heads, key heads, head dim): grouped 3:1 as SmolLM2, 4:1 at a wide head, 4:1, plain multi-head
HEADS = [(9, 3, 64), (4, 1, 256), (8, 2, 128), (4, 4, 80)]
KEYS = 75  # more than two key blocks, the last one partial


def qkv(heads: int, key_heads: int, dim: int, keys: int = KEYS, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(count, keys, dim, generator=generator)
                 for count in (heads, key_heads, key_heads))


def in_phases(attend, q, k, v, chunk: int) -> torch.Tensor:
    """Every position's output computed ``chunk`` positions at a time, each chunk over the keys up to
    its last position (chunk 1: decode steps)."""
    keys = k.shape[1]
    return torch.cat([attend(q[:, a:a + chunk], k[:, :a + chunk], v[:, :a + chunk])
                      for a in range(0, keys, chunk)], dim=1)


def canonical(q, k, v):
    return canonical_attention(q, k, v, q.shape[-1] ** -0.5)


def sdpa(q, k, v):
    queries, keys = q.shape[1], k.shape[1]
    allowed = torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries)
    return torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=allowed,
                                                            enable_gqa=q.shape[0] != k.shape[0])[0]


@pytest.mark.parametrize(("heads", "key_heads", "dim"), HEADS)
def test_a_positions_attention_has_the_same_bits_in_every_phase(heads, key_heads, dim):
    q, k, v = qkv(heads, key_heads, dim)
    once = canonical(q, k, v)
    torch.testing.assert_close(once, sdpa(q, k, v), rtol=0, atol=1e-5)  # it is attention
    for chunk in CHUNKS:
        assert torch.equal(in_phases(canonical, q, k, v, chunk), once), chunk
    # a prefill continuing a cache of 33 positions (a reused prefix), and a lone query over more keys
    assert torch.equal(canonical(q[:, 33:], k, v), once[:, 33:])
    assert torch.equal(canonical(q[:, 40:41], k[:, :41], v[:, :41])[:, 0], once[:, 40])


def test_values_of_another_head_size_as_multi_head_latent_attention_has_them():
    """Keys of 24 and values of 16 per head (DeepSeek-V2/V3's attention): attention still, and the
    same bits in every phase."""
    q, k, _ = qkv(4, 4, 24)
    v = torch.randn(4, KEYS, 16, generator=torch.Generator().manual_seed(1))
    once = canonical(q, k, v)
    assert once.shape == (4, KEYS, 16)
    torch.testing.assert_close(once, sdpa(q, k, v), rtol=0, atol=1e-5)
    for chunk in CHUNKS:
        assert torch.equal(in_phases(canonical, q, k, v, chunk), once), chunk


def reference(q, k, v, *, window=None, softcap=None, sinks=None):
    """Attention as transformers' eager path computes it, in float64: a sliding window (a query sees
    the keys less than ``window`` back), soft-capped scores, each head's sink logit in the sum."""
    q, k, v = (t.double() for t in (q, k, v))
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    scores = q @ k.transpose(1, 2) * q.shape[-1] ** -0.5
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    queries, keys = q.shape[1], k.shape[1]
    at = torch.arange(keys - queries, keys).view(-1, 1)
    seen = torch.arange(keys).view(1, -1) <= at
    if window is not None:
        seen &= torch.arange(keys).view(1, -1) > at - window
    scores = scores.masked_fill(~seen, float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks.double().view(-1, 1, 1).expand(-1, queries, 1)], dim=-1)
    return (torch.softmax(scores, dim=-1)[..., :keys] @ v).float()


@pytest.mark.parametrize("window", [5, 32, 40])
@pytest.mark.parametrize(("softcap", "with_sinks"), [(None, False), (50.0, False), (None, True)])
def test_sliding_windows_soft_capping_and_sinks_keep_every_phases_bits(window, softcap, with_sinks):
    """A sliding window (within a block, a block's width, across blocks; Mistral, Gemma 2 and 3,
    gpt-oss), soft-capped scores (Gemma 2) and attention sinks (gpt-oss): attention as transformers
    computes it, and a position's bits the same decoded, in chunks, and over a sliding cache that
    dropped the keys out of the window (``start``: the first kept key's position)."""
    q, k, v = qkv(*HEADS[0])
    sinks = torch.randn(q.shape[0], generator=torch.Generator().manual_seed(3)) if with_sinks else None
    shape = {"window": window, "softcap": softcap, "sinks": sinks}

    def attend(q, k, v, start=0):
        return canonical_attention(q, k, v, q.shape[-1] ** -0.5, start=start, **shape)

    once = attend(q, k, v)
    torch.testing.assert_close(once, reference(q, k, v, **shape), rtol=0, atol=1e-5)
    for chunk in CHUNKS:
        assert torch.equal(in_phases(attend, q, k, v, chunk), once), chunk
    for p in range(window, KEYS):  # a sliding cache: the last window - 1 keys before p, and p's own
        cut = p - window + 1
        assert torch.equal(attend(q[:, p:p + 1], k[:, cut:p + 1], v[:, cut:p + 1], start=cut)[:, 0],
                           once[:, p]), p


def test_sdpa_the_negative_control_moves_a_positions_bits_with_the_phase():
    """What the test above would find were attention SDPA again: decode steps and chunks differ from the
    one-shot prefill in most positions (measured: 99 of 100 at SmolLM2's heads)."""
    q, k, v = qkv(*HEADS[0], keys=100)
    once = sdpa(q, k, v)
    decoded = in_phases(sdpa, q, k, v, 1)
    torch.testing.assert_close(decoded, once, rtol=0, atol=1e-5)
    differ = sum(not torch.equal(decoded[:, p], once[:, p]) for p in range(100))
    assert differ >= 50, differ
    assert not torch.equal(in_phases(sdpa, q, k, v, 7), once)


def test_the_threads_do_not_move_the_bits():
    q, k, v = qkv(*HEADS[0])
    before = torch.get_num_threads()
    try:
        found = []
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            found.append((canonical(q, k, v), in_phases(canonical, q, k, v, 1)))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, found[0][0]) and torch.equal(b, found[0][0]) for a, b in found)


def test_a_generations_steps_are_the_score_of_its_own_tokens_bit_for_bit(tiny):
    """The default kernels (portable, batch-invariant): each generated step's logit hash is the
    teacher-forced score's at that position, for every prompt and step; on the previous kernels
    (other linears in decode, SDPA) the same comparison finds steps that differ."""
    llm = LLMModel(tiny, GenerationSettings(BatchShape.parse("4x64"), 40, 0))
    assert tiny.engine.kernels.phase_invariant

    def steps_equal() -> tuple[int, int]:
        equal = steps = 0
        for generation in llm.generate(PHASE_PROMPTS):
            score = llm.score(list(generation.prompt_token_ids), list(generation.token_ids))
            equal += sum(a == b for a, b in zip(generation.step_hashes, score.step_hashes, strict=True))
            steps += len(generation.step_hashes)
        return equal, steps

    equal, steps = steps_equal()
    assert equal == steps >= 20, (equal, steps)
    with on_policy(tiny, Policy.ONEDNN_AVX2):
        assert not tiny.engine.kernels.phase_invariant
        equal, steps = steps_equal()
    assert equal < steps, "the previous kernels no longer differ between decode and prefill: a weak control"


def test_a_chunked_prefill_and_a_reused_prefix_give_the_one_shot_bits(tiny):
    """Each of 3 prompts followed by 40 more positions: every position decoded one at a time (chunk 1),
    and in chunks of 2, 7 and 64, gives the one-shot prefill's logits; so does a continuation on a
    reused prefix's cache. The previous kernels are the negative control."""
    tail = long_ids(tiny)[:40]
    rows = [tiny.tokenizer(prompt)["input_ids"] + tail for prompt in PHASE_PROMPTS]
    once = [logits_in_chunks(tiny, ids, len(ids)) for ids in rows]
    for ids, expected in zip(rows, once, strict=True):
        for chunk in CHUNKS:
            assert torch.equal(logits_in_chunks(tiny, ids, chunk), expected), (chunk, len(ids))
    ids = rows[0]
    other = tiny.tokenizer(" and the capital of Germany")["input_ids"]
    reused = logits_on_a_reused_prefix(tiny, ids[:20], [ids[20:], other])
    assert torch.equal(reused[0], once[0])
    assert torch.equal(reused[1], logits_in_chunks(tiny, ids[:20] + other, 64))
    with on_policy(tiny, Policy.ONEDNN_AVX2):  # the negative control: SDPA and the previous linears
        moved = [chunk for chunk in CHUNKS[:3]
                 if not torch.equal(logits_in_chunks(tiny, ids, chunk), once[0])]
    assert moved, "the previous kernels give the one-shot bits in every phase: a weak control"


def test_a_window_without_a_row_of_positions_per_row_is_refused():
    """Under a sliding window a row's key positions come from its position_ids: one row of them for
    several rows (a caller's padded batch without position_ids) or none at all is refused, not
    computed from another row's positions."""
    from types import SimpleNamespace

    from pytest_llmdeterminism.compute.tensor_ops import rowwise_attention

    q, k, v = (t[None].expand(2, -1, -1, -1) for t in qkv(4, 4, 16, keys=12))
    mask = torch.ones(2, 1, 12, 12, dtype=torch.bool)
    for positions in (None, torch.arange(12)[None], torch.arange(12)[None, None].expand(3, 2, 12)):
        with pytest.raises(NotImplementedError, match="one row of position_ids per row"):
            rowwise_attention(SimpleNamespace(), q, k, v, mask, sliding_window=4, position_ids=positions)
    found, _ = rowwise_attention(SimpleNamespace(), q, k, v, mask, sliding_window=4,
                                 position_ids=torch.arange(12)[None].expand(2, 12))
    assert torch.equal(found[0], found[1])
