"""The plugin's own seeded sampler: Gumbel-max over the cut scores, with noise that is the same on
every CPU.

A draw is ``argmax(scores + g)`` over the tokens the cut keeps, where ``scores = logits / T`` and
``g`` is Gumbel noise keyed by (seed, the row's own input token ids, the step, the token id): never
by the row's index, its companions, the batch shape, the thread count or the engine. So a row's
sample depends on that row alone, and decoding stays greedy (over perturbed scores).

**The noise, exactly** (sampler :data:`SAMPLER`; changing anything below is a new version):

1. ``key = xxh3_64(seed as 8 bytes little-endian unsigned ‖ each input id as 8 bytes
   little-endian signed)`` — once per row, over the prompt's token ids without padding.
2. ``mix(z)`` is SplitMix64's finaliser on 64-bit unsigned integers:
   ``z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31``
   (all modulo 2**64), and ``GAMMA = 0x9E3779B97F4A7C15``.
3. ``step_key = mix(key + (step + 1) * GAMMA)``, ``h = mix(step_key + (token + 1) * GAMMA)``:
   the ``token + 1``-th output of a SplitMix64 stream seeded by ``step_key``. ``step`` counts the
   generated tokens: 0 draws the first new token.
4. ``u = (2 * (h >> 12) + 1) / 2**53``: the top 52 bits and a half, so ``u`` is a float64 exactly
   (an odd integer below 2**53 over a power of two) and lies in [2**-53, 1 - 2**-53], never 0 or 1.
   (53 bits plus a half would need 54 bits of significand and round.)
5. ``g = -ln(-ln(u))`` as a real number, rounded to the nearest float64. It is computed with
   :mod:`decimal` at 30 significant digits, which is software arithmetic with a correctly rounded
   ``ln``, so it is the same on every CPU. A float64 ``log`` is not: numpy dispatches to SVML on
   AVX-512 CPUs and to libm elsewhere, and libm picks an FMA variant by CPU; they differ in the last
   bits.

Everything up to step 5 is integer arithmetic, done in numpy ``uint64`` over the vocabulary (C
unsigned arithmetic, which wraps by definition; torch has no unsigned 64-bit multiply on CPU, and a
signed overflow is undefined behaviour in C++). Step 5 in :mod:`decimal` is too slow for a whole
vocabulary (its cost: ``docs/design/measurements.md``), so a draw first computes ``g``
with numpy's float64 ``log`` (accurate to a few ulps, ~1e-14 here), keeps the tokens whose
approximate perturbed score is within a generous tolerance of the second best, and computes those
few exactly. The winner and margin come only from exact values, and a token left out is provably
below two tokens that were kept.

**The cut**, in transformers' order (temperature, top-k, top-p, min-p), in float64 from the float32
logits; every operation is an IEEE-754 basic operation or an exact one, so the kept set is the
same on every CPU given the same logits bits:

- temperature: ``scores = float64(logits) / T``;
- top-k (``0`` is off; :data:`DEFAULT_TOP_K`, 50, when a test gives none, as transformers'
  ``generate``): keep the tokens whose score is at least the k-th largest (ties at the boundary are
  all kept, as in transformers);
- top-p (``1`` is off): rank the kept tokens by score, ties by lower token id; keep a token when
  the probability mass ranked strictly above it is below ``p``: the smallest prefix whose mass
  reaches ``p``. Probabilities are ``exp(score - max)`` by :func:`_exp_nonpositive` (a polynomial
  in basic operations, not the CPU's ``exp``), summed in rank order by ``cumsum``. Where tokens of
  equal score straddle the boundary, the lower id is kept (transformers keeps its sort's order);
- min-p (``0`` is off): keep ``score - max >= ln(min_p)`` (``prob >= min_p * max prob`` in log
  space; ``ln(min_p)`` correctly rounded by :mod:`decimal`).

The top token always survives the cut. Ties of perturbed scores go to the lower token id. The
**draw margin** is how far the draw is from changing: the winner's perturbed score minus the best
other kept token's, or, where the cut's boundary is nearer, how far a token the cut left out is from
being kept and winning (``max(floor - score, winner's perturbed score - its own)`` over the cut's
floors) or the winner from falling out of the cut; ``inf`` when one token is finite at all.

numpy comes with transformers; it is imported inside the functions, so loading the plugin costs nothing.

Long: one concern, the draw, with the argument that makes it exact on every CPU (this docstring)
beside the integer arithmetic it justifies; split, the proof and the code would drift apart.
"""

from __future__ import annotations

import decimal
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import xxhash

from pytest_llmdeterminism.errors import ConfigurationError, NonFiniteLogitsError, as_float, as_int

if TYPE_CHECKING:
    import numpy as np

__all__ = ["DEFAULT_TOP_K", "MAX_SEED", "RECORDED_SETTINGS", "SAMPLER", "Draw", "SamplingConfig",
           "default_change_note", "draw", "draw_batch", "gumbel", "noise_key", "settings_text", "uniform"]

SAMPLER = "gumbel-xxh3-splitmix/1"  # name/version: a golden records it; any change to the noise is /2
RECORDED_SETTINGS = ("sampler", "temperature", "top_k", "top_p", "min_p", "seed")  # what a golden records
# The largest seed every consumer takes: torch.manual_seed (below 2**64), numpy (taken mod 2**32) and an
# OpenAI-compatible server's int64 ``seed`` (vLLM's refuses more); run.options checks it at start-up.
MAX_SEED = 2**63 - 1
# transformers' generate() cuts at top_k=50 when do_sample=True and no top_k is given (its
# GenerationConfig's library default); so does a sampled test. Goldens recorded before it said 0 (off).
DEFAULT_TOP_K = 50

_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_EXACT = decimal.Context(prec=30, rounding=decimal.ROUND_HALF_EVEN)  # never the thread's context


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK
    return z ^ (z >> 31)


def noise_key(seed: int, input_ids: Sequence[int]) -> int:
    """The row's 64-bit noise key: xxh3_64 of the seed and the row's own input ids (no padding)."""
    ids = [int(t) for t in input_ids]
    return xxhash.xxh3_64_intdigest(struct.pack(f"<Q{len(ids)}q", seed, *ids))


def _step_key(key: int, step: int) -> int:
    return _mix((key + (step + 1) * _GAMMA) & _MASK)


def _token_hashes(key: int, step: int, token_ids: np.ndarray, *, whole: bool = False) -> np.ndarray:
    """``h`` for each token id (int64 array; ``whole``: it is 0..V-1), as uint64: numpy's unsigned
    arithmetic wraps."""
    import numpy as np

    z: np.ndarray = _stream_offsets(token_ids, whole) + np.uint64(_step_key(key, step))
    shifted = np.empty_like(z)
    for shift, factor in ((30, _MIX1), (27, _MIX2)):  # in place: this runs over the whole vocabulary
        np.right_shift(z, np.uint64(shift), out=shifted)
        np.bitwise_xor(z, shifted, out=z)
        np.multiply(z, np.uint64(factor), out=z)
    np.right_shift(z, np.uint64(31), out=shifted)
    np.bitwise_xor(z, shifted, out=z)
    return z


_OFFSETS: dict[int, np.ndarray] = {}  # vocabulary size: (token + 1) * GAMMA for tokens 0..V-1


def _stream_offsets(token_ids: np.ndarray, whole: bool) -> np.ndarray:
    import numpy as np

    n = token_ids.size
    if whole:
        if n not in _OFFSETS:
            _OFFSETS[n] = (np.arange(1, n + 1, dtype=np.uint64) * np.uint64(_GAMMA))
        return _OFFSETS[n]
    return (token_ids.astype(np.uint64) + np.uint64(1)) * np.uint64(_GAMMA)  # type: ignore[no-any-return]


def _unit(hashes: np.ndarray) -> np.ndarray:
    """``u = ((h >> 11) | 1) / 2**53`` (= ``(2 * (h >> 12) + 1) / 2**53``), exact in float64."""
    import numpy as np

    odd = (hashes >> np.uint64(11)) | np.uint64(1)
    return odd.astype(np.float64) * 2.0**-53  # type: ignore[no-any-return]


def uniform(key: int, step: int, token_ids: Sequence[int]) -> list[float]:
    """The uniform ``u`` of each token at this step, strictly inside (0, 1)."""
    import numpy as np

    return [float(u) for u in _unit(_token_hashes(key, step, np.asarray(token_ids, dtype=np.int64)))]


def _exact_gumbel(u: float) -> float:
    """``-ln(-ln(u))`` correctly rounded to float64 (u is a float64 exactly, so Decimal(u) is exact)."""
    return float(_EXACT.minus(_EXACT.ln(_EXACT.minus(_EXACT.ln(decimal.Decimal(u))))))


def gumbel(key: int, step: int, token_ids: Sequence[int]) -> list[float]:
    """The Gumbel noise ``g`` of each token at this step, exactly as a draw adds it."""
    return [_exact_gumbel(u) for u in uniform(key, step, token_ids)]


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """What a sampled generation draws with, validated on construction; :meth:`as_dict` is what a
    golden records. The seed enters the draw only through :func:`noise_key`.

    The defaults are transformers' library defaults for ``do_sample=True`` (``temperature=1.0``,
    ``top_k=50``, ``top_p=1.0``, no min-p), not a checkpoint's ``generation_config.json``: as for
    greedy decoding, a test's own arguments are the whole config, and the golden records them."""

    temperature: float = 1.0
    top_k: int = DEFAULT_TOP_K  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    seed: int

    def __post_init__(self) -> None:
        __tracebackhide__ = True
        # A numpy scalar (any numbers.Real, numbers.Integral for top_k and seed) is taken as the
        # plain float or int a golden records; anything else keeps its value for the error below.
        for name, plain in (("temperature", as_float), ("top_p", as_float), ("min_p", as_float),
                            ("top_k", as_int), ("seed", as_int)):
            converted = plain(getattr(self, name))
            if converted is not None:
                object.__setattr__(self, name, converted)

        def number(v: object) -> bool:
            return isinstance(v, float) and math.isfinite(v)

        def integer(v: object) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        if self.temperature == 0 and number(self.temperature):
            raise ConfigurationError(
                "llm_model.generate(temperature=...)", self.temperature,
                "temperature=0 with do_sample=True is an error, as in transformers: it is greedy decoding. "
                "For greedy decoding drop do_sample=True; to sample, pass a temperature > 0, e.g. 0.7")
        checks = (("temperature", number(self.temperature) and self.temperature > 0, "a finite number > 0"),
                  ("top_k", integer(self.top_k) and self.top_k >= 0, "an integer >= 0 (0 turns top-k off)"),
                  ("top_p", number(self.top_p) and 0 < self.top_p <= 1,
                   "a number with 0 < top_p <= 1 (1 turns top-p off)"),
                  ("min_p", number(self.min_p) and 0 <= self.min_p < 1,
                   "a number with 0 <= min_p < 1 (0 turns min-p off)"),
                  ("seed", integer(self.seed) and 0 <= self.seed <= MAX_SEED,
                   f"an integer from 0 to 2**63 - 1 ({MAX_SEED})"))
        for name, ok, expected in checks:
            if not ok:
                raise ConfigurationError(f"llm_model.generate({name}=...)", getattr(self, name),
                                         f"expected {expected}")

    def as_dict(self) -> dict[str, Any]:
        """The settings as a golden records them, led by the sampler's name and version."""
        return {"sampler": SAMPLER, "temperature": float(self.temperature), "top_k": self.top_k,
                "top_p": float(self.top_p), "min_p": float(self.min_p), "seed": self.seed}

    def noise_key(self, input_ids: Sequence[int]) -> int:
        """This config's noise key for a row whose input (prompt) ids are ``input_ids``."""
        return noise_key(self.seed, input_ids)


def settings_text(settings: Mapping[str, Any]) -> str:
    """How a sampled generation was drawn, from its recorded settings (:data:`RECORDED_SETTINGS`):
    ``sampled: temperature 0.8, top_p 0.95, seed 3 (gumbel-xxh3-splitmix/1)``; cuts that are off
    are left out."""
    off = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}
    shown = [f"{name} {settings[name]!r}" for name in RECORDED_SETTINGS[1:]
             if name in settings and settings[name] != off.get(name, object())]
    return f"sampled: {', '.join(shown)} ({settings.get('sampler')})"


def default_change_note(field: str, old: Any, new: Any) -> str | None:
    """Why a sampled golden reads INPUT_CHANGED when the cause is a changed default, not the test:
    ``field`` (``generation_config.top_k``) went from ``old`` (the golden's) to ``new`` (this run's).
    None for any other change."""
    if field == "generation_config.top_k" and old == 0 and new == DEFAULT_TOP_K and not isinstance(old, bool):
        return (f"a sampled test that passes no top_k now cuts at top_k={DEFAULT_TOP_K}, transformers' "
                "default for do_sample=True; this golden was drawn with no cut, the old default. To draw "
                "as it did, pass top_k=0 to llm_model.generate(); to take the new default, record it again "
                "with the Accept line below")
    return None


@dataclass(frozen=True)
class Draw:
    """One step's draw: the chosen token, the draw margin (how far the draw is from changing: the
    winner's perturbed score minus the runner-up's, or less where the cut's boundary is nearer;
    ``inf`` when nothing could change it) and how many tokens the cut kept."""

    token_id: int
    margin: float
    kept: int


# exp(r) for |r| <= ln(2)/2: Taylor to degree 13 (the next term is below 3e-18), Horner in basic ops.
_LN2_HI = 0.693147180369123816490  # 0x3FE62E42FEE00000: k * _LN2_HI is exact for |k| < 2**11
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700
_EXP_TERMS = tuple(1.0 / math.factorial(n) for n in range(13, -1, -1))  # exact: math.factorial is an int


def _exp_nonpositive(x: np.ndarray) -> np.ndarray:
    """``exp(x)`` for float64 ``x <= 0`` with IEEE basic operations only (no libm, no SIMD exp), so
    the bits are the same on every CPU; ``0`` below -745 (where float64 underflows anyway)."""
    import numpy as np

    x = np.maximum(x, -745.0)
    k = np.rint(x * _INV_LN2)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    p = np.full_like(r, _EXP_TERMS[0])
    for c in _EXP_TERMS[1:]:  # p = p * r + c, in place: the same two roundings, no new arrays
        np.multiply(p, r, out=p)
        np.add(p, c, out=p)
    return np.ldexp(p, k.astype(np.int32))


def _log_min_p(min_p: float) -> float:
    return float(_EXACT.ln(decimal.Decimal(min_p)))


# The scores a token the cut left out must reach to be kept: the lowest score top-k and top-p kept
# (None where they cut nothing), and min-p's threshold (None without min-p).
Floors = tuple[float | None, float | None]


def _kept(scores: np.ndarray, config: SamplingConfig) -> tuple[np.ndarray, np.ndarray, Floors]:
    """The token ids the cut keeps, ascending, their scores, and its :data:`Floors`, from the
    temperature-scaled float64 scores (``-inf``: suppressed by a processor, never kept)."""
    import numpy as np

    if np.isfinite(scores).all():
        kept, values = _vocabulary(scores.size), scores
    else:
        kept = np.flatnonzero(np.isfinite(scores))
        values = scores[kept]
    finite = kept.size
    if 0 < config.top_k < kept.size:
        kth = np.partition(values, kept.size - config.top_k)[kept.size - config.top_k]
        kept = kept[values >= kth]
        values = scores[kept]
    top = values.max()
    if config.top_p < 1:
        weights = _exp_nonpositive(values - top)
        reach = config.top_p * np.cumsum(weights)[-1]  # p * the mass, summed in token-id order
        kept = np.sort(kept[_nucleus(values, weights, reach)])
        values = scores[kept]
    ranked_floor = float(values.min()) if kept.size < finite else None
    min_p_floor = None
    if config.min_p > 0:
        threshold = _log_min_p(config.min_p)
        kept = kept[(values - top) >= threshold]
        values = scores[kept]
        min_p_floor = float(top) + threshold
    return kept, values, (ranked_floor, min_p_floor)


_VOCABULARIES: dict[int, np.ndarray] = {}


def _vocabulary(size: int) -> np.ndarray:
    import numpy as np

    if size not in _VOCABULARIES:
        _VOCABULARIES[size] = np.arange(size)
        _VOCABULARIES[size].flags.writeable = False
    return _VOCABULARIES[size]


def _nucleus(values: np.ndarray, weights: np.ndarray, reach: float) -> np.ndarray:
    """Positions of the tokens whose mass ranked strictly above them (by score, ties by lower
    position; summed in rank order) is below ``reach``. Sorts only the best ``m`` tokens, growing
    ``m`` until the nucleus ends inside them: the same answer as sorting the whole row."""
    import numpy as np

    m = 256
    while True:
        if m >= values.size:
            best = np.arange(values.size)
        else:  # every token scoring at least the m-th best, so ties at the boundary all come in
            best = np.flatnonzero(values >= np.partition(values, values.size - m)[values.size - m])
            # Their mass in any order errs from the rank-order sum by far less than this margin: well
            # short of ``reach``, the nucleus ends beyond them, and sorting them would be wasted.
            if weights[best].sum() < reach * (1 - 1e-9):
                m *= 8
                continue
        order = best[np.argsort(-values[best], kind="stable")]  # ``best`` ascends: ties by position
        mass = np.cumsum(weights[order])
        if mass[-1] >= reach or best.size == values.size:
            above = np.concatenate(([0.0], mass[:-1]))
            return order[above < reach]
        m *= 8


def _checked_scores(logits: Any, temperature: float, *, step: int, row: int) -> np.ndarray:
    import numpy as np

    if hasattr(logits, "detach"):  # a torch tensor, on any device and in any float dtype
        logits = logits.detach().float().cpu().numpy()
    row_logits = np.asarray(logits, dtype=np.float32)
    if row_logits.ndim != 1 or row_logits.size == 0:
        raise ValueError(f"expected one row of logits (a 1-d float tensor), got shape {row_logits.shape}")
    if not np.isfinite(row_logits).all() and (
            np.isnan(row_logits).any() or np.isposinf(row_logits).any() or np.isneginf(row_logits).all()):
        raise NonFiniteLogitsError(step, row)
    scores = row_logits.astype(np.float64)
    np.divide(scores, float(temperature), out=scores)
    if np.isposinf(scores).any() or np.isneginf(scores).all():  # only a tiny temperature overflows
        raise ConfigurationError("llm_model.generate(temperature=...)", temperature,
                                 "divides these logits beyond float64's range; use a larger temperature")
    return scores


# Screening: a float64 log errs by a few ulps of |g| <= 37; this tolerance is orders of magnitude wider.
def _tolerance(value: float) -> float:
    return 1e-9 * (1.0 + abs(value))


_SCREEN = 16  # the best-scoring tokens whose noise is computed first


def draw(logits: Any, config: SamplingConfig, *, key: int, step: int, row: int = 0) -> Draw:
    """Draw one token from one row of raw logits (float32, vocabulary size V; -inf marks a token a
    processor suppressed). ``key`` is the row's :func:`noise_key`; ``step`` counts generated tokens
    from 0; ``row`` only names the row in an error.

    The noise is hashed for every kept token, but turned into a float only where it can matter:
    the second-best perturbed score among the ``_SCREEN`` best-scoring tokens sets how large ``g``
    a token with a lower score needs, which is a threshold on its integer ``h`` (``g`` grows with
    ``h``). The survivors' approximate perturbed scores pick the few whose noise is computed exactly.
    """
    import numpy as np

    scores = _checked_scores(logits, config.temperature, step=step, row=row)
    kept, values, floors = _kept(scores, config)
    if kept.size == 1:
        winner = int(kept[0])
        perturbed = float(scores[winner]) + gumbel(key, step, [winner])[0]
        return Draw(winner, _boundary_margin(scores, kept, floors, winner, perturbed, math.inf, key=key,
                                             step=step), 1)
    hashes = _token_hashes(key, step, kept, whole=kept is _VOCABULARIES.get(scores.size))
    pool = np.arange(kept.size)
    if kept.size > 4 * _SCREEN:
        ranked = np.argpartition(values, (kept.size - _SCREEN - 1, kept.size - _SCREEN))
        best, rest_max = ranked[kept.size - _SCREEN:], float(values[ranked[kept.size - _SCREEN - 1]])
        approx = values[best] - np.log(-np.log(_unit(hashes[best])))
        second = float(np.partition(approx, _SCREEN - 2)[_SCREEN - 2])
        needed = second - 2 * _tolerance(second) - rest_max  # the least g that can reach the top two
        least_u = math.exp(-math.exp(-needed)) if needed > -3.7 else 0.0  # g >= -3.6 always
        least = max(0, math.floor(least_u * 2.0**53) - 4)  # a few units lower: math.exp may err by an ulp
        pool = np.union1d(best, np.flatnonzero((hashes >> np.uint64(11)) >= np.uint64(least)))
    approx = values[pool] - np.log(-np.log(_unit(hashes[pool])))
    second = float(np.partition(approx, approx.size - 2)[approx.size - 2])
    candidates = pool[approx >= second - _tolerance(second)]
    exact = sorted((-(float(values[i]) + _exact_gumbel(u)), int(kept[i]))
                   for i, u in zip(candidates, _unit(hashes[candidates]), strict=True))
    (best_score, winner), (runner_up, _) = exact[0], exact[1]
    margin = _boundary_margin(scores, kept, floors, winner, -best_score, runner_up - best_score, key=key,
                              step=step)
    return Draw(winner, margin, int(kept.size))


def _boundary_margin(scores: np.ndarray, kept: np.ndarray, floors: Floors, winner: int,
                     perturbed: float, margin: float, *, key: int, step: int) -> float:
    """``margin`` (the winner's perturbed score minus the best other kept token's), lowered where the
    cut's boundary is nearer: a token the cut left out wins once its score rises to every threshold
    and its perturbed score passes the winner's, so it is ``max(threshold - score, winner's perturbed
    score - its own)`` away; the winner may leave the cut once the best left-out score (even the best
    score can fall below the k-th) or min-p's threshold reaches it. Only tokens whose score lies within
    ``margin`` of the thresholds can be nearer; their noise is screened, then computed exactly."""
    import numpy as np

    thresholds = [floor for floor in floors if floor is not None]
    if not thresholds:
        return margin
    inside = np.zeros(scores.size, dtype=bool)
    inside[kept] = True
    outside = np.flatnonzero(~inside & np.isfinite(scores))
    if outside.size == 0:
        return margin
    own = float(scores[winner])  # it falls out once a left-out score, or min-p's floor, reaches it
    margin = min(margin, own - float(scores[outside].max()),
                 own - floors[1] if floors[1] is not None else math.inf)
    highest = max(thresholds)
    near = outside[scores[outside] > highest - margin] if math.isfinite(margin) else outside
    if near.size == 0:
        return margin
    near_scores = scores[near]
    gap = np.max([t - near_scores for t in thresholds], axis=0)
    noise = -np.log(-np.log(_unit(_token_hashes(key, step, near))))  # screening only: a few ulps off
    approx = np.maximum(gap, perturbed - (near_scores + noise))
    least = float(approx.min())
    candidates = np.flatnonzero(approx <= least + _tolerance(least) + _tolerance(perturbed))
    exact = [max(float(gap[i]), perturbed - (float(near_scores[i]) + g))
             for i, g in zip(candidates, gumbel(key, step, [int(t) for t in near[candidates]]), strict=True)]
    return min(margin, *exact)


def draw_batch(logits: Any, configs: SamplingConfig | Sequence[SamplingConfig], *, keys: Sequence[int],
               step: int) -> list[Draw]:
    """:func:`draw` for each row of a (rows x V) logits batch: row ``i`` uses ``keys[i]`` and its
    config (one for all rows, or one per row). Each row's result is exactly its one-row draw."""
    import numpy as np

    batch = np.asarray(logits, dtype=np.float32)
    if batch.ndim != 2 or batch.shape[0] != len(keys):
        raise ValueError(f"expected logits of shape (rows, V) with one key per row; got shape "
                         f"{batch.shape} and {len(keys)} keys")
    per_row = [configs] * len(keys) if isinstance(configs, SamplingConfig) else list(configs)
    if len(per_row) != len(keys):
        raise ValueError(f"expected one config per row ({len(keys)}), got {len(per_row)}")
    return [draw(batch[i], per_row[i], key=keys[i], step=step, row=i) for i in range(len(keys))]
