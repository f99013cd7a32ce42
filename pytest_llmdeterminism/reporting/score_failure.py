"""The text of a failing score check (a teacher-forced continuation's logprobs): its
headline (where the logprobs moved, the rank change that decided the verdict) and its evidence
lines (the positions that moved most, every rank change, the log-likelihood before and after).
:mod:`~pytest_llmdeterminism.reporting.failure` puts them in a failure's text."""

from __future__ import annotations

from pytest_llmdeterminism.judge.compare import Comparison, PositionChange, Verdict, near_tie
from pytest_llmdeterminism.reporting.text import Decode, delta, hashes_text, tie_text, token_text


def score_headline(comparison: Comparison, decode: Decode, failed: str) -> str:
    """A score's verdict: where it moved, the rank change that decided it, the condition that failed."""
    assert comparison.score is not None
    evidence, verdict = comparison.score, comparison.verdict.value
    where = (f"{evidence.moved_positions} of {evidence.positions} positions' logprobs moved, "
             f"max |Δlogprob| in top-k {delta(comparison.max_logprob_delta)}")
    if comparison.hash_definitions is not None:
        where += (f" (golden {hashes_text(comparison, 0)}, this run {hashes_text(comparison, 1)}: "
                  "not comparable bit for bit)")
    # The rank change that decided the verdict: a confident one (a REGRESSION), else a near tie's.
    confident = [c for c in evidence.rank_changes
                 if not near_tie(c.rank_margin, comparison.tie_margin, c.drift_elsewhere)]
    flips = confident or (evidence.rank_changes if comparison.verdict is Verdict.RANK_FLIP else ())
    if flips:
        c = flips[0]
        name = "golden rank margin"
        margin = (f"{name} unknown: not a near tie" if c.rank_margin is None else
                  tie_text(c.rank_margin, comparison.tie_margin, c.drift_elsewhere, name=name))
        where = (f"the rank of {token_text(c.token, decode)} at position {c.position} changed "
                 f"{_rank(c.expected_rank)} -> {_rank(c.actual_rank)}; {margin}; {where}")
    lead = f"{verdict} (score) at position {comparison.first_hash_step}"
    return f"{lead} — {failed}; {where}" if failed else f"{lead} — {where}"


def _rank(rank: int | None) -> str:
    return "outside the top-k" if rank is None else f"#{rank}"


def score_lines(comparison: Comparison, decode: Decode) -> list[str]:
    """The evidence of two scores: the positions that moved most (token, old and new logprob), every
    rank change, and the continuation's log-likelihood before and after."""
    assert comparison.score is not None
    evidence = comparison.score
    lines = [f"  log-likelihood of the continuation ({evidence.positions} tokens): "
             f"{evidence.expected_total:.6f} -> {evidence.actual_total:.6f} "
             f"(Δ {evidence.actual_total - evidence.expected_total:+.3g})"]
    if evidence.moved:
        shown = len(evidence.moved)
        lines.append(f"  the {shown} of {evidence.moved_positions} moved positions that moved most "
                     "(position, token, logprob golden -> now):")
        lines += [f"    {_position(change, decode)}" for change in evidence.moved]
    others = [c for c in evidence.rank_changes if c not in evidence.moved]
    if evidence.rank_changes:
        lines.append(f"  the given token's rank changed at {len(evidence.rank_changes)} position(s): "
                     + ", ".join(f"{c.position} ({_rank(c.expected_rank)} -> {_rank(c.actual_rank)})"
                                 for c in evidence.rank_changes[:8]))
    lines += [f"    {_position(change, decode)}" for change in others[:3]]
    return lines


def _position(change: PositionChange, decode: Decode) -> str:
    rank = (f", rank {_rank(change.expected_rank)} -> {_rank(change.actual_rank)}"
            if change.expected_rank != change.actual_rank else "")
    return (f"[{change.position}] {token_text(change.token, decode)}: {change.expected_logprob:.6f} -> "
            f"{change.actual_logprob:.6f} (Δ {change.actual_logprob - change.expected_logprob:+.3g}{rank})")
