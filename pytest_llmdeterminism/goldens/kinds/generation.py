"""The generation kind: a :class:`~pytest_llmdeterminism.generation.Generation` from
``llm_model.generate()``, stored one ``steps`` line per generated token (every golden of format 1
and 2, and a format-3 entry without ``kind``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pytest_llmdeterminism.errors import printable
from pytest_llmdeterminism.generation import TEXT_ONLY_IDS, Generation, HashDefinition, PromptForm
from pytest_llmdeterminism.goldens.fields import (
    GENERATION_FORMAT,
    MAX_TEXT_CHARS,
    TOKEN_ID_RANGE,
    VOCABULARY_IDS,
    Entry,
    Step,
    named_texts,
)
from pytest_llmdeterminism.judge.compare import Comparison, compare_generations, default_tie_margin

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


GENERATION = GenerationKind()
