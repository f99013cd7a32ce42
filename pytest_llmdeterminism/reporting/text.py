"""Pieces of text every report shares: a value shortened to fit a line, a logprob change, the label
of a prompt's form, where two texts or id lists first differ, a token and what a side's hashes
hash, and a report entry's margin, drift, score evidence, sampling settings and budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pytest_llmdeterminism.judge.compare import Comparison, Verdict, first_token_divergence, within_drift
from pytest_llmdeterminism.sampling import settings_text

_MAX_IDS_SHOWN = 12

Decode = Callable[[int], str]  # token id -> its text


def form_label(old: str, new: str) -> str:
    """`` (chat, rendered)`` for a prompt that was a chat conversation; both forms where they differ."""
    if old != new:
        return f" ({old} -> {new})"
    return {"chat": " (chat, rendered)", "token_ids": " (token ids, decoded)"}.get(old, "")


def first_difference(old: Sequence[object], new: Sequence[object]) -> int:
    first = first_token_divergence(old, new)
    return min(len(old), len(new)) if first is None else first


def differing_window(old: str, new: str, before: int = 30, after: int = 50) -> tuple[str, str]:
    """Both texts around their first differing character (a rendered chat prompt is long; the
    change may sit anywhere in it)."""
    first = first_difference(old, new)
    start = max(0, first - before)

    def window(text: str) -> str:
        end = first + after
        return ("…" if start else "") + repr(text[start:end]) + ("…" if len(text) > end else "")

    return window(old), window(new)


def number(value: float | None) -> str:
    """A float as a report shows it, 3 significant digits; any float (``1e308``, ``inf``, ``nan``)
    renders, and None (a JSON report's null: a number that was not finite) is ``n/a``."""
    return "n/a" if value is None else f"{value:.3g}"


def delta(value: float | None) -> str:
    # Logprobs are stored to 6 decimals: a smaller change shows only in the hash.
    return "< 1e-6" if value is not None and value < 1e-6 else number(value)


def tie_text(margin: float, tie_margin: float, drift: float, *, name: str = "golden margin") -> str:
    """A changed decision's golden margin against the near-tie bound: below the tie margin, within the
    drift this run measured around it (a near tie too, DESIGN §14), or neither: ``golden margin 0.176
    >= tie margin 0.05, within this run's drift (0.61): near tie``."""
    head = f"{name} {margin:.3g}"
    if within_drift(margin, tie_margin, drift):
        return f"{head} >= tie margin {tie_margin:g}, within this run's drift ({drift:.3g}): near tie"
    if margin < tie_margin:
        return f"{head} < tie margin {tie_margin:g}: near tie"
    drift_note = f", outside this run's drift ({drift:.3g})" if drift > 0 else ""
    return f"{head} >= tie margin {tie_margin:g}{drift_note}: not a near tie"


def short(value: Any, limit: int = 100) -> str:
    if isinstance(value, (list, tuple)) and len(value) > _MAX_IDS_SHOWN:
        text = f"[{', '.join(map(str, value[:_MAX_IDS_SHOWN]))}, … ({len(value)} ids)]"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def score_lines(check: dict[str, Any]) -> list[str]:
    """A score check's evidence as report lines: the log-likelihood before and after, the positions
    that moved most (token, old and new logprob), the rank changes."""
    old, new = check["log_likelihood"]
    lines = [f"log-likelihood {old:.6f} → {new:.6f} (Δ {new - old:+.3g})"]
    for p in check.get("moved_positions") or []:
        rank = (f", rank {p['expected_rank']} → {p['actual_rank']}"
                if p["expected_rank"] != p["actual_rank"] else "")
        lines.append(f"position {p['position']} {p['piece']!r} (id {p['token']}): "
                     f"{p['expected_logprob']:.6f} → {p['actual_logprob']:.6f}{rank}")
    ranks = check.get("rank_changes") or []
    if ranks:
        lines.append(f"rank changed at {len(ranks)} position(s): " + ", ".join(
            f"{p['position']} ({p['expected_rank']} → {p['actual_rank']})" for p in ranks[:8]))
    return lines


def _draw(check: dict[str, Any]) -> tuple[float, float] | None:
    """A sampled check's draw margin where the tokens parted, and its temperature; None otherwise."""
    temperature = (check.get("sampling") or {}).get("temperature")
    margin = check.get("draw_margin")
    if margin is None or not isinstance(temperature, (int, float)) or temperature <= 0:
        return None
    return margin, float(temperature)


def confidence(check: dict[str, Any]) -> float:
    """How far from a near tie the golden was where the tokens parted, as a multiple of the bound
    that decided the verdict: the tie margin (or the drift before it, where larger) for a greedy
    check, that over T for the draw margin of a sampled one, so both kinds rank on one scale (the
    raw margin where the report has no tie margin; 0 without a divergence, or where the golden had
    stopped: JSON null)."""
    tie = max(check.get("tie_margin") or 0.0, check.get("max_logprob_delta") or 0.0)
    draw = _draw(check)
    if draw is not None:
        margin, temperature = draw
        return margin / (tie / temperature) if tie else margin
    golden = check.get("golden_margin")
    if golden is None:
        return 0.0
    return float(golden) / tie if tie else float(golden)


def margin_text(check: dict[str, Any]) -> str:
    """The margin that decided a divergence: a sampled check's draw margin (and T), else the golden's;
    a near tie only by the drift before it says so."""
    draw = _draw(check)
    if draw is not None:
        return f"draw {number(draw[0])} (T {draw[1]:g})"
    golden, drift = check["golden_margin"], check.get("max_logprob_delta") or 0.0
    if golden is None:
        return ""
    within = Verdict.is_flip(check["verdict"]) and within_drift(golden, check.get("tie_margin") or 0.0, drift)
    return f"{number(golden)} (within this run's drift {number(drift)})" if within else number(golden)


def drift_text(check: dict[str, Any]) -> str:
    """max |Δlogprob| in top-k before any divergence, where the logits moved; "" where they did not."""
    drift = check["max_logprob_delta"]
    if check["verdict"] != "LOGIT_DRIFT" and not drift:
        return ""
    return delta(drift)


def sampling_lines(check: dict[str, Any]) -> list[str]:
    """A sampled check's settings and, where the tokens parted, the golden's draw margin there."""
    if not check.get("sampling"):
        return []
    margin = check.get("draw_margin")
    return [settings_text(check["sampling"])
            + (f"; the golden's draw margin there {number(margin)}" if margin is not None else "")]


def budget_text(check: dict[str, Any]) -> str:
    old, new = check["max_new_tokens"]
    return (f"max_new_tokens {old} → {new}: judged on the golden's {check['judged_steps']} step(s); "
            f"{check['new_steps']} new step(s) from step {check['judged_steps']} not judged")


def token_text(token: int, decode: Decode) -> str:
    """A token as a failure names it: its text and id, or ``end of output`` (a negative id)."""
    return "end of output" if token < 0 else f"{decode(token)!r} (id {token})"


def hashes_text(comparison: Comparison, side: int) -> str:
    """What one side's step hashes hash (0: the golden's, 1: this run's), where the two differ."""
    assert comparison.hash_definitions is not None
    name = comparison.hash_definitions[side]
    return {"logits": "hashes raw logits", "served-topk": "hashes what a server returned",
            "vllm-topk": "hashes what vLLM returned"}.get(name, f"hash {name!r}")
