"""The generation kind: a :class:`~pytest_llmdeterminism.generation.Generation` from
``llm_model.generate()``, stored one ``steps`` line per generated token (every golden of format 1
and 2, and a format-3 entry without ``kind``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pytest_llmdeterminism.errors import printable
from pytest_llmdeterminism.generation import TEXT_ONLY_IDS, Generation, HashDefinition, PromptForm, TopK
from pytest_llmdeterminism.goldens.fields import (
    GENERATION_FORMAT,
    MAX_TEXT_CHARS,
    TOKEN_ID_RANGE,
    VOCABULARY_IDS,
    Entry,
    Step,
    named_texts,
)
from pytest_llmdeterminism.judge.compare import (
    Comparison,
    Divergence,
    Verdict,
    batch_shape_matters,
    default_tie_margin,
    first_token_divergence,
    max_logprob_delta,
    near_tie,
)

_BAR = 20  # the widest margin bar in ``llm-golden show``, in characters
# An entry's keys the fast duplicate-key proof counts for every entry: batch_shape, finish_reason,
# fingerprint, generation_config, prompt, prompt_token_ids, steps, text.
_REQUIRED_KEYS = 8
_STEP_KEYS = 5  # hash, margin, piece, token, top


class GenerationKind:
    name = "generation"
    entry_type: type = Entry
    record_type: type = Generation
    format = GENERATION_FORMAT
    step_noun = "step"
    shorten = "Generate fewer tokens (llm_model.generate(..., max_new_tokens=...))"

    def to_entry(self, record: Generation) -> dict[str, Any]:
        steps = [
            {"hash": h, "margin": m, "piece": p, "token": t, "top": [list(pair) for pair in top]}
            for t, p, h, m, top in zip(
                record.token_ids, record.pieces or [""] * len(record.token_ids),
                record.step_hashes, record.margins, record.top_logprobs, strict=True,
            )
        ]
        return {
            "batch_shape": record.batch_shape,
            "finish_reason": record.finish_reason,
            "fingerprint": dict(record.fingerprint),
            "generation_config": dict(record.generation_config),
            "prompt": record.prompt,
            "prompt_token_ids": list(record.prompt_token_ids),
            "steps": steps,
            "text": record.text,
            **({"prompt_form": record.prompt_form} if record.prompt_form != "text" else {}),
            **({"step_hash": record.hash_definition} if record.hash_definition != "logits" else {}),
            **({"draw_margins": list(record.draw_margins)} if record.draw_margins else {}),
        }

    def from_entry(self, entry: Entry) -> Generation:
        steps = entry.steps
        return Generation(
            prompt=entry.prompt,
            prompt_token_ids=entry.prompt_token_ids,
            token_ids=tuple(s.token for s in steps),
            text=entry.text,
            step_hashes=tuple(s.hash for s in steps),
            top_logprobs=tuple(s.top for s in steps),
            margins=tuple(s.margin for s in steps),
            finish_reason=entry.finish_reason,
            generation_config=entry.generation_config,
            batch_shape=entry.batch_shape,
            pieces=tuple(s.piece for s in steps),
            fingerprint=entry.fingerprint,
            prompt_form=PromptForm(entry.prompt_form),
            hash_definition=HashDefinition(entry.step_hash),
            draw_margins=entry.draw_margins or (),
        )

    def entry_problem(self, entry: Entry) -> str | None:
        """No score fields; the pieces within the limit; one top-k per step; ids an engine produces;
        one draw margin per step where there are any."""
        for name in ("positions", "prompt_logprobs"):
            if getattr(entry, name) is not None:
                return (f"has {name!r}, which only a score entry has: add \"kind\": \"score\" if it is one, "
                        f"else remove {name!r}")
        pieces = sum(len(step.piece) for step in entry.steps)
        if pieces > MAX_TEXT_CHARS:
            return (f"the steps' pieces together have {pieces:,} characters, more than the "
                    f"{MAX_TEXT_CHARS:,} a golden holds")
        for index, step in enumerate(entry.steps):
            if not step.top:
                return f"step {index} has an empty 'top'"
            # max() of the (id, logprob) pairs is the largest id, in C: the exact scan only past a vocabulary.
            if step.token >= VOCABULARY_IDS or max(step.top)[0] >= VOCABULARY_IDS:
                problem = _token_id_problem(index, step)
                if problem:
                    return problem
        if entry.draw_margins is not None and len(entry.draw_margins) != len(entry.steps):
            return f"'draw_margins' has {len(entry.draw_margins)} values for {len(entry.steps)} steps"
        return None

    def entry_texts(self, entry: Entry) -> Iterable[tuple[str, str]]:
        pieces = [step.piece for step in entry.steps]
        return named_texts(entry.prompt, entry.text, pieces, entry.finish_reason)

    def entry_keys(self, entry: Entry) -> int:
        return (_REQUIRED_KEYS + _STEP_KEYS * len(entry.steps) + (entry.prompt_form != "text")
                + (entry.step_hash != "logits") + (entry.draw_margins is not None))

    def stored_texts(self, record: Generation) -> Iterable[tuple[str, str]]:
        return named_texts(record.prompt, record.text, record.pieces, record.finish_reason)

    def compare(self, expected: Generation, actual: Generation, *, tie_margin: float | None) -> Comparison:
        return compare_generations(expected, actual, tie_margin=tie_margin)

    def sampling(self, record: Generation) -> dict[str, Any]:
        return record.sampling

    def decoded_text(self, record: Generation) -> str | None:
        return record.text

    def text(self, record: Generation) -> str:
        return record.text

    def report_steps(self, record: Generation) -> list[tuple[str, int, float, float | None]]:
        """``(piece, token id, margin, top-1 logprob)`` per step."""
        return [(piece, token, margin, top[0][1] if top else None)
                for piece, token, margin, top in zip(record.pieces, record.token_ids, record.margins,
                                                     record.top_logprobs, strict=False)]

    def show_lines(self, key: str, variant: str, record: Generation) -> list[str]:
        """The prompt, how a sampled golden was drawn, the output, then one line per step with its
        margin (a near tie marked)."""
        gen = record
        lines = [f"{printable(key)} [{printable(variant)}]  shape {gen.batch_shape}, finish: "
                 f"{printable(gen.finish_reason)}", f"  prompt: {gen.prompt!r}"]
        config = gen.generation_config
        if config.get("do_sample") is True:  # a sampled golden: how it was drawn
            lines.append(f"  sampled: {printable(config.get('sampler'))}, temperature "
                         f"{config.get('temperature')}, top_k {config.get('top_k')}, "
                         f"top_p {config.get('top_p')}, min_p {config.get('min_p')}, "
                         f"seed {config.get('seed')}; draw margins {list(gen.draw_margins)}")
        lines.append(f"  output: {gen.text!r}")
        tie_margin = default_tie_margin(str(gen.fingerprint.get("dtype", "float32")))
        # A sampled golden's step is a near tie where its draw was (the comparator's rule for it):
        # draw margin < tie margin / T; its greedy margin decides nothing there.
        temperature = config.get("temperature")
        sampled = (config.get("do_sample") is True and isinstance(temperature, (int, float))
                   and temperature > 0)
        drawn = gen.draw_margins if sampled else ()
        bound = tie_margin / temperature if drawn and isinstance(temperature, (int, float)) else 0.0
        for step, (piece, token, margin) in enumerate(
                zip(gen.pieces, gen.token_ids, gen.margins, strict=False)):
            bar = "#" * min(_BAR, int(margin * 2))
            if drawn:
                draw = drawn[step] if step < len(drawn) else None
                bar = f"draw {draw:8.3f}" if draw is not None else ""
                tie = (f"  <- near tie of the draw (< {bound:.3g} = tie margin {tie_margin:g} / T "
                       f"{temperature:g})" if draw is not None and draw < bound else "")
            else:
                tie = f"  <- near tie (< {tie_margin:g})" if margin < tie_margin else ""
            lines.append(f"  {step:>4}  {piece!r:<16} id {token:<7} margin {margin:8.3f} {bar}{tie}")
        return [*lines, ""]


def _token_id_problem(index: int, step: Step) -> str | None:
    """An id of ``step`` between the vocabulary and the text-only ids: no engine produces one."""
    fields = [(f"steps[{index}].token", step.token)]
    fields += [(f"steps[{index}].top[{rank}][0]", token) for rank, (token, _) in enumerate(step.top)]
    for field, token in fields:
        if VOCABULARY_IDS <= token < TEXT_ONLY_IDS:
            return f"{field}: Expected {TOKEN_ID_RANGE}, got {token}"
    return None


# -- comparing two generations ------------------------------------------------------------------

def compare_generations(expected: Generation, actual: Generation, *,
                        tie_margin: float | None = None) -> Comparison:
    """Two generations, step by step (the generation kind's compare)."""
    changes = input_changes(expected, actual)
    if changes:
        return Comparison(Verdict.INPUT_CHANGED, input_changes=changes)
    budgets, limit = _common_budget(expected, actual)
    streams = _streams(expected, actual)
    steps = min(len(expected.token_ids), len(actual.token_ids))
    if limit is not None:
        streams, steps = (streams[0][:limit], streams[1][:limit]), min(steps, limit)
    token_step = first_token_divergence(*streams)
    compared = steps if token_step is None else token_step
    # Steps after a token divergence see different inputs: nothing there is evidence.
    hashed = min(steps, compared + 1)
    definitions: tuple[str, str] | None = (expected.hash_definition, actual.hash_definition)
    if expected.hash_definition != actual.hash_definition:
        first_hash: int | None = 0
    else:
        definitions, first_hash = None, next(
            (t for t in range(hashed) if expected.step_hashes[t] != actual.step_hashes[t]), None)
    delta = max_logprob_delta(expected.top_logprobs[:compared], actual.top_logprobs[:compared])
    dtype = expected.fingerprint.get("dtype", "")
    margin = tie_margin if tie_margin is not None else default_tie_margin(dtype)
    if token_step is None:
        verdict, divergence = (Verdict.IDENTICAL if first_hash is None else Verdict.LOGIT_DRIFT), None
    else:
        divergence = _divergence(expected, actual, token_step)
        verdict = _classify(divergence, margin, delta)
    beyond = [0 if limit is None else max(0, len(gen.token_ids) - limit) for gen in (actual, expected)]
    return Comparison(verdict, divergence=divergence, first_hash_step=first_hash, steps_compared=compared,
                      total_steps=len(expected.token_ids), max_logprob_delta=delta, tie_margin=margin,
                      hash_definitions=definitions, budgets=budgets, new_steps=beyond[0],
                      unchecked_steps=beyond[1])


def input_changes(expected: Generation, actual: Generation) -> tuple[tuple[str, Any, Any], ...]:
    """What went *into* the generation and differs: shown before, and instead of, an output diff."""
    changes: list[tuple[str, Any, Any]] = []
    if expected.prompt_token_ids != actual.prompt_token_ids:
        changes.append(("prompt_token_ids", expected.prompt_token_ids, actual.prompt_token_ids))
    if batch_shape_matters(expected, actual):
        changes.append(("batch_shape", expected.batch_shape, actual.batch_shape))
    old, new = expected.generation_config, actual.generation_config
    for key in sorted(set(old) | set(new)):
        if key == BUDGET and isinstance(old.get(key), int) and isinstance(new.get(key), int):
            continue  # another budget changes how far the outputs go, not what they are: see _common_budget
        if _normalise(old.get(key)) != _normalise(new.get(key)):
            changes.append((f"generation_config.{key}", old.get(key), new.get(key)))
    return tuple(changes)


STOPPED = "<stopped at EOS>"


BUDGET = "max_new_tokens"


def _common_budget(expected: Generation, actual: Generation) -> tuple[tuple[int, int] | None, int | None]:
    """Two budgets (max_new_tokens) and the number of steps both sides can be judged on, or
    ``(None, None)`` when the budgets are equal. A side that ran out of budget (finish "length") says
    nothing about the steps after it; a side that stopped at EOS is complete, whatever the budget,
    so the other side must stop there too."""
    old, new = expected.generation_config.get(BUDGET), actual.generation_config.get(BUDGET)
    if old == new or not isinstance(old, int) or not isinstance(new, int):
        return None, None
    cut = [len(gen.token_ids) for gen in (expected, actual) if gen.finish_reason == "length"]
    return (old, new), (min(cut) if cut else None)


def _streams(expected: Generation, actual: Generation) -> tuple[list[object], list[object]]:
    """The tokens as compared. An engine that stops at EOS without returning the token (a server)
    and one that returns it stopped at the same step: against such a side, the other's final EOS
    token reads as the same stop. Two sides that both returned their EOS compare the ids as they are."""
    streams: tuple[list[object], list[object]] = (list(expected.token_ids), list(actual.token_ids))
    bare = [_stopped_without_token(gen) for gen in (expected, actual)]
    if bare[0] != bare[1]:
        for tokens, gen, without in zip(streams, (expected, actual), bare, strict=True):
            if without:
                tokens.append(STOPPED)
            elif gen.finish_reason == "eos" and tokens:
                tokens[-1] = STOPPED
    return streams


def _stopped_without_token(gen: Generation) -> bool:
    eos = gen.generation_config.get("eos_token_id") or ()
    ids = eos if isinstance(eos, (list, tuple)) else (eos,)
    return gen.finish_reason == "eos" and not (gen.token_ids and gen.token_ids[-1] in ids)


def _normalise(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value


def _divergence(expected: Generation, actual: Generation, step: int) -> Divergence:
    def at(gen: Generation) -> tuple[int, TopK]:
        if step < len(gen.token_ids):
            return gen.token_ids[step], gen.top_logprobs[step]
        return -1, ()  # this side had already stopped

    (expected_token, expected_top), (actual_token, actual_top) = at(expected), at(actual)
    margin = expected.margins[step] if step < len(expected.margins) else float("inf")
    temperature = expected.generation_config.get("temperature") if expected.draw_margins else None
    if isinstance(temperature, (int, float)) and temperature > 0 and step < len(expected.draw_margins):
        return Divergence(step, expected_token, actual_token, expected_top, actual_top, margin,
                          draw_margin=expected.draw_margins[step], temperature=float(temperature))
    return Divergence(step, expected_token, actual_token, expected_top, actual_top, margin)


def _classify(divergence: Divergence, tie_margin: float, drift: float) -> Verdict:
    """TIE_FLIP (SAMPLE_FLIP for a draw) where the golden's margin at the divergence was a near tie
    (:func:`near_tie`: ``drift`` is what this run measured before it), else REGRESSION."""
    if divergence.draw_margin is not None and divergence.temperature is not None:
        # A draw: both tokens' perturbed scores move by the logit drift over T. Neither side stopped.
        drawn = divergence.expected_token >= 0 and divergence.actual_token >= 0
        t = divergence.temperature
        near = near_tie(divergence.draw_margin, tie_margin / t, drift / t)
        return Verdict.SAMPLE_FLIP if drawn and near else Verdict.REGRESSION
    in_top = any(token == divergence.actual_token for token, _ in divergence.expected_top)
    near = near_tie(divergence.golden_margin, tie_margin, drift)
    return Verdict.TIE_FLIP if near and in_top else Verdict.REGRESSION


GENERATION = GenerationKind()
