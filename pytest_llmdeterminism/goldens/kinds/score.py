"""The score kind: a :class:`~pytest_llmdeterminism.generation.Score` from ``llm_model.score()`` (a
teacher-forced continuation), stored one ``positions`` line per continuation token (format 3,
``"kind": "score"``). Its entry keeps the shape format 3 gave it (``"steps": []``, ``finish_reason``
``"scored"``): the committed score goldens keep their bytes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pytest_llmdeterminism.errors import printable
from pytest_llmdeterminism.generation import TEXT_ONLY_IDS, HashDefinition, PromptForm, Score
from pytest_llmdeterminism.goldens.fields import (
    FORMAT,
    MAX_TEXT_CHARS,
    SCORED,
    TOKEN_ID_RANGE,
    VOCABULARY_IDS,
    Entry,
    named_texts,
)
from pytest_llmdeterminism.judge.compare import (
    MOVED_SHOWN,
    Comparison,
    PositionChange,
    ScoreEvidence,
    Verdict,
    batch_shape_matters,
    default_tie_margin,
    max_logprob_delta,
    near_tie,
)

# An entry's keys the fast duplicate-key proof counts for every entry (batch_shape, finish_reason,
# fingerprint, generation_config, prompt, prompt_token_ids, steps, text), and a score's "kind".
_REQUIRED_KEYS = 8 + 1
_POSITION_KEYS = 7  # hash, logprob, piece, rank, rank_margin, token, top


def score_settings(score: Score) -> dict[str, Any]:
    """What a score entry records as its settings (``generation_config``): what changes its numbers
    beyond the prompt and the continuation."""
    return {"prompt_logprobs": bool(score.prompt_logprobs), "top_k": score_top_k(score)}


class ScoreKind:
    name = "score"
    entry_type: type = Entry
    record_type: type = Score
    format = FORMAT
    step_noun = "position"
    shorten = "Score a shorter continuation"

    def to_entry(self, record: Score) -> dict[str, Any]:
        positions = [
            {"hash": h, "logprob": lp, "piece": p, "rank": r, "rank_margin": m, "token": t,
             "top": [list(pair) for pair in top]}
            for t, p, h, lp, r, m, top in zip(
                record.token_ids, record.pieces or [""] * len(record.token_ids), record.step_hashes,
                record.logprobs, record.ranks, record.rank_margins, record.top_logprobs, strict=True)
        ]
        return {
            "batch_shape": record.batch_shape,
            "finish_reason": SCORED,
            "fingerprint": dict(record.fingerprint),
            "generation_config": score_settings(record),
            "kind": self.name,
            "positions": positions,
            "prompt": record.prompt,
            "prompt_token_ids": list(record.prompt_token_ids),
            "steps": [],
            "text": record.continuation,
            **({"prompt_form": record.prompt_form} if record.prompt_form != "text" else {}),
            **({"step_hash": record.hash_definition} if record.hash_definition != "logits" else {}),
            **({"prompt_logprobs": list(record.prompt_logprobs)} if record.prompt_logprobs else {}),
        }

    def from_entry(self, entry: Entry) -> Score:
        positions = entry.positions or []
        return Score(
            prompt=entry.prompt,
            prompt_token_ids=entry.prompt_token_ids,
            continuation=entry.text,
            token_ids=tuple(p.token for p in positions),
            logprobs=tuple(p.logprob for p in positions),
            ranks=tuple(p.rank for p in positions),
            step_hashes=tuple(p.hash for p in positions),
            top_logprobs=tuple(p.top for p in positions),
            rank_margins=tuple(p.rank_margin for p in positions),
            batch_shape=entry.batch_shape,
            pieces=tuple(p.piece for p in positions),
            fingerprint=entry.fingerprint,
            prompt_form=PromptForm(entry.prompt_form),
            hash_definition=HashDefinition(entry.step_hash),
            prompt_logprobs=entry.prompt_logprobs or (),
        )

    def entry_problem(self, entry: Entry) -> str | None:
        """Its positions (at least one, each with its top-k and ids an engine produces), no steps,
        one prompt logprob per prompt token where there are any, the pieces within the limit."""
        if not entry.positions:
            return ("is a score entry (\"kind\": \"score\") without its 'positions' (one per continuation "
                    "token)")
        if entry.steps or entry.draw_margins is not None or entry.finish_reason != SCORED:
            return (f"is a score entry (\"kind\": \"score\") with a generation's fields: it has no 'steps' "
                    f"(they must be []), no 'draw_margins', and its finish_reason is {SCORED!r}")
        for index, position in enumerate(entry.positions):
            if not position.top:
                return f"position {index} has an empty 'top'"
            ids = [(f"positions[{index}].token", position.token)]
            ids += [(f"positions[{index}].top[{r}][0]", t) for r, (t, _) in enumerate(position.top)]
            for field, token in ids:
                if VOCABULARY_IDS <= token < TEXT_ONLY_IDS:
                    return f"{field}: Expected {TOKEN_ID_RANGE}, got {token}"
        if entry.prompt_logprobs is not None and len(entry.prompt_logprobs) != len(entry.prompt_token_ids):
            return (f"'prompt_logprobs' has {len(entry.prompt_logprobs)} values for "
                    f"{len(entry.prompt_token_ids)} prompt tokens")
        pieces = sum(len(p.piece) for p in entry.positions)
        if pieces > MAX_TEXT_CHARS:
            return (f"the steps' pieces together have {pieces:,} characters, more than the "
                    f"{MAX_TEXT_CHARS:,} a golden holds")
        return None

    def entry_texts(self, entry: Entry) -> Iterable[tuple[str, str]]:
        pieces = [p.piece for p in entry.positions or ()]
        return named_texts(entry.prompt, entry.text, pieces, entry.finish_reason)

    def entry_keys(self, entry: Entry) -> int:
        return (_REQUIRED_KEYS + (entry.positions is not None) + _POSITION_KEYS * len(entry.positions or ())
                + (entry.prompt_form != "text") + (entry.step_hash != "logits")
                + (entry.prompt_logprobs is not None))

    def stored_texts(self, record: Score) -> Iterable[tuple[str, str]]:
        return named_texts(record.prompt, record.continuation, record.pieces, SCORED)

    def compare(self, expected: Score, actual: Score, *, tie_margin: float | None) -> Comparison:
        return compare_scores(expected, actual, tie_margin=tie_margin)

    def sampling(self, record: Score) -> dict[str, Any]:
        return {}  # teacher-forced: nothing was drawn

    def decoded_text(self, record: Score) -> str | None:
        return None  # the continuation was given

    def text(self, record: Score) -> str:
        return record.continuation

    def report_steps(self, record: Score) -> list[tuple[str, int, float, float | None]]:
        """``(piece, token id, rank margin, the given token's logprob)`` per position."""
        return [(piece, token, margin if margin is not None else 0.0, logprob)
                for piece, token, margin, logprob in zip(record.pieces, record.token_ids, record.rank_margins,
                                                         record.logprobs, strict=False)]

    def show_lines(self, key: str, variant: str, record: Score) -> list[str]:
        """The continuation's log-likelihood, then each position's given token, its logprob, its rank,
        and how far it was from changing rank (a near tie marked)."""
        score = record
        lines = [f"{printable(key)} [{printable(variant)}]  score, shape {score.batch_shape}, log-likelihood "
                 f"{score.total:.6f} over {len(score.token_ids)} tokens",
                 f"  prompt: {score.prompt!r}", f"  continuation: {score.continuation!r}"]
        tie_margin = default_tie_margin(str(score.fingerprint.get("dtype", "float32")))
        pieces = score.pieces or ("",) * len(score.token_ids)
        for position, (piece, token, logprob, rank, margin) in enumerate(
                zip(pieces, score.token_ids, score.logprobs, score.ranks, score.rank_margins, strict=True)):
            shown_rank = "rank    ?" if rank is None else f"rank {rank:>4}"
            shown_margin = "" if margin is None else f" rank margin {margin:8.3f}"
            tie = f"  <- near tie (< {tie_margin:g})" if margin is not None and margin < tie_margin else ""
            lines.append(f"  {position:>4}  {piece!r:<16} id {token:<7} logprob {logprob:10.6f} {shown_rank}"
                         f"{shown_margin}{tie}")
        return [*lines, ""]


# -- comparing two scores --------------------------------------------------------------------------

def score_input_changes(expected: Score, actual: Score) -> tuple[tuple[str, Any, Any], ...]:
    """What went into two scores and differs: the prompt, the continuation, the batch shape (as for
    generations), the settings (whether prompt logprobs were asked for, the top-k recorded)."""
    changes: list[tuple[str, Any, Any]] = []
    if expected.prompt_token_ids != actual.prompt_token_ids:
        changes.append(("prompt_token_ids", expected.prompt_token_ids, actual.prompt_token_ids))
    if expected.token_ids != actual.token_ids:
        changes.append(("continuation", expected.token_ids, actual.token_ids))
    if batch_shape_matters(expected, actual):
        changes.append(("batch_shape", expected.batch_shape, actual.batch_shape))
    asked = bool(expected.prompt_logprobs), bool(actual.prompt_logprobs)
    if asked[0] != asked[1]:
        changes.append(("settings.prompt_logprobs", *asked))
    if score_top_k(expected) != score_top_k(actual):
        changes.append(("settings.top_k", score_top_k(expected), score_top_k(actual)))
    return tuple(changes)


def _rank_changed(expected: int | None, actual: int | None, expected_k: int, actual_k: int) -> bool:
    """The given token's rank changed. ``None`` is a rank the engine did not say (outside its top-k,
    a server's): a change only where the other side's rank falls inside that top-k, so a rank
    known on one side only (two engines) is no change by itself."""
    if expected == actual:
        return False
    if expected is None:
        return actual is not None and actual <= expected_k
    if actual is None:
        return expected <= actual_k
    return True


def score_top_k(score: Score) -> int:
    """How many best tokens each position of ``score`` records (``llm_model.score(top_k=...)``)."""
    return max(map(len, score.top_logprobs), default=0)


def compare_scores(expected: Score, actual: Score, *, tie_margin: float | None = None) -> Comparison:
    """Two scores of the same continuation, position by position: IDENTICAL (every hash equal),
    LOGIT_DRIFT (logprobs moved, no rank changed), RANK_FLIP (a given token's rank changed at a near
    tie: its golden rank margin below ``tie_margin``, or within the drift of the score's other
    positions), REGRESSION (a rank changed where the golden was confident), INPUT_CHANGED (prompt,
    continuation or settings). As for generations, the size of the drift is the profile's to judge."""
    changes = score_input_changes(expected, actual)
    if changes:
        return Comparison(Verdict.INPUT_CHANGED, input_changes=changes)
    positions = len(expected.token_ids)
    definitions: tuple[str, str] | None = (expected.hash_definition, actual.hash_definition)
    if expected.hash_definition != actual.hash_definition:
        first_hash: int | None = 0
    else:
        definitions, first_hash = None, next(
            (t for t in range(positions) if expected.step_hashes[t] != actual.step_hashes[t]), None)
    dtype = expected.fingerprint.get("dtype", "")
    margin = tie_margin if tie_margin is not None else default_tie_margin(dtype)
    ks = score_top_k(expected), score_top_k(actual)
    reranked = {t for t in range(positions) if _rank_changed(expected.ranks[t], actual.ranks[t], *ks)}
    deltas = _position_deltas(expected, actual)
    highest = sorted(range(positions), key=lambda t: -deltas[t])[:2]  # the drift elsewhere of any position

    def elsewhere(t: int) -> float:
        return max((deltas[s] for s in highest if s != t), default=0.0)

    changed = [PositionChange(t, expected.token_ids[t], expected.logprobs[t], actual.logprobs[t],
                              expected.ranks[t], actual.ranks[t], expected.rank_margins[t], elsewhere(t))
               for t in range(positions) if expected.logprobs[t] != actual.logprobs[t] or t in reranked]
    moved = sorted((c for c in changed if c.delta > 0), key=lambda c: (-c.delta, c.position))
    ranks = tuple(c for c in changed if c.position in reranked)
    delta = max(deltas, default=0.0)
    evidence = ScoreEvidence(positions, tuple(moved[:MOVED_SHOWN]), len(moved), ranks, expected.total,
                             actual.total)
    confident = [c for c in ranks if not near_tie(c.rank_margin, margin, c.drift_elsewhere)]
    if confident:
        verdict = Verdict.REGRESSION
    elif ranks:
        verdict = Verdict.RANK_FLIP
    elif first_hash is None and not moved:
        verdict = Verdict.IDENTICAL
    else:
        verdict = Verdict.LOGIT_DRIFT
    return Comparison(verdict, first_hash_step=first_hash, steps_compared=positions, total_steps=positions,
                      max_logprob_delta=delta, tie_margin=margin, hash_definitions=definitions,
                      score=evidence)


def _position_deltas(expected: Score, actual: Score) -> list[float]:
    """Per position: the largest |Δlogprob| of the given token and the top-k ids both sides share."""
    if expected.logprobs == actual.logprobs and expected.top_logprobs == actual.top_logprobs:
        return [0.0] * len(expected.token_ids)  # the common case, compared at C speed
    return [max(abs(expected.logprobs[t] - actual.logprobs[t]),
                max_logprob_delta(expected.top_logprobs[t:t + 1], actual.top_logprobs[t:t + 1]))
            for t in range(len(expected.token_ids))]


SCORE = ScoreKind()
