"""The ``llm_model`` fixture object: greedy generation in one fixed batch shape.

Every call runs at exactly ``B x L``: prompts left-padded to ``L`` with an explicit attention
mask, filler rows up to ``B``, longer lists in chunks of ``B``. On one machine the same prompt
in the same shape gives bitwise identical logits whatever the other rows hold, so batching never
changes a result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

from pytest_llmdeterminism.compare import Verdict, compare
from pytest_llmdeterminism.engines.capture import Chunk
from pytest_llmdeterminism.engines.fingerprint import fingerprint
from pytest_llmdeterminism.errors import (
    BatchInvarianceProbeError,
    ConfigurationError,
    PromptTooLongError,
    pasteable,
)
from pytest_llmdeterminism.generation import Generation, resolve_generation_config
from pytest_llmdeterminism.shape import GenerationSettings

if TYPE_CHECKING:
    from pytest_llmdeterminism.engines import LoadedModel

PROBE_STEPS = 3  # tokens the batch-invariance probe generates per row


class LLMModel:
    """Greedy, fixed-shape generation with per-step capture. ``.model`` and ``.tokenizer`` are the
    underlying transformers objects."""

    def __init__(self, loaded: LoadedModel, settings: GenerationSettings, *,
                 after_generate: Callable[[LLMModel, list[Generation], dict[str, Any]], None] | None = None,
                 note: Callable[[str], None] | None = None, verify_batch_invariance: bool = True) -> None:
        self._loaded = loaded
        self.settings = settings
        self._after_generate = after_generate  # the --llm-audit hook
        self._note = note  # tells the run's summary what the batch-invariance probe found
        self._noted = False
        # The audit measures rows, shapes and repeats itself (its views run other shapes on purpose).
        self._verify = verify_batch_invariance and after_generate is None
        self._keep_logits = False
        self.last_logits: list[Any] = []  # per prompt of the last call: steps x vocab, audit views only

    @property
    def audited(self) -> bool:
        """Under ``--llm-audit``: every generation is audited after it runs."""
        return self._after_generate is not None

    def with_settings(self, *, keep_logits: bool = False, **changes: Any) -> LLMModel:
        """The same loaded model under other settings (shape, seed, ...), for audits and probes.
        With ``keep_logits`` each call keeps every step's raw logits in ``last_logits``."""
        return self._view(self._loaded, dataclasses.replace(self.settings, **changes), keep_logits)

    def in_dtype(self, dtype: str, *, keep_logits: bool = False) -> LLMModel:
        """The same weights cast to ``dtype`` (a copy, made once per loaded model), as a view."""
        import copy

        import torch

        from pytest_llmdeterminism.engines.hf import HFEngine

        key = f"dtype-copy:{dtype}"
        if key not in self._loaded.cache:
            engine = self._loaded.engine
            assert isinstance(engine, HFEngine)  # the audit runs on transformers only: generate() refuses others
            model = copy.deepcopy(engine.model).to(getattr(torch, dtype))
            self._loaded.cache[key] = dataclasses.replace(
                self._loaded, model=model, dtype=dtype, cache={}, engine=HFEngine(model, engine.tokenizer, engine.device))
        return self._view(self._loaded.cache[key], self.settings, keep_logits)

    @staticmethod
    def _view(loaded: LoadedModel, settings: GenerationSettings, keep_logits: bool) -> LLMModel:
        view = LLMModel(loaded, settings, verify_batch_invariance=False)
        view._keep_logits = keep_logits
        return view

    @property
    def model(self) -> Any:
        return self._loaded.model

    @property
    def tokenizer(self) -> Any:
        return self._loaded.tokenizer

    @property
    def fingerprint(self) -> dict[str, Any]:
        return fingerprint(self._loaded)

    @overload
    def generate(self, prompt: str | Conversation, **overrides: Any) -> Generation: ...

    @overload
    def generate(self, prompt: Sequence[str | Conversation], **overrides: Any) -> list[Generation]: ...

    @overload
    def generate(self, *, token_ids: Sequence[int], **overrides: Any) -> Generation: ...

    @overload
    def generate(self, *, token_ids: Sequence[Sequence[int]], **overrides: Any) -> list[Generation]: ...

    def generate(self, prompt: Any = None, *, token_ids: Any = None, **overrides: Any) -> Generation | list[Generation]:
        """Greedy continuation of one input, or of each input in a list.

        An input is a prompt string (tokenised with the tokenizer's special tokens), a chat
        conversation (a list of ``{"role": ..., "content": ...}`` dicts, rendered with the
        tokenizer's chat template and ``add_generation_prompt=True``, tokenised once without adding
        special tokens again), or, with ``token_ids=``, the token ids themselves.
        ``overrides`` may set ``max_new_tokens``, ``min_new_tokens``, ``repetition_penalty``,
        ``no_repeat_ngram_size``, ``eos_token_id`` or ``use_cache``; sampling arguments are refused.
        """
        __tracebackhide__ = True
        inputs, single = self._inputs(prompt, token_ids)
        config = resolve_generation_config(
            overrides,
            max_new_tokens=self.settings.max_new_tokens,
            eos_token_ids=self._loaded.engine.eos_token_ids(),
            pad_token_id=self.tokenizer.pad_token_id,
        )
        if self._after_generate is not None and self._loaded.engine.name != "transformers":
            raise ConfigurationError("--llm-audit", True, f"the audit varies batch shape, padding, threads and dtype "
                                     f"of the transformers backend; {self._loaded.spec} runs on "
                                     f"{self._loaded.engine.name}. Audit the same model without the engine prefix")
        if self._verify and not self._loaded.engine.runs_rows_alone:
            self._verify_batch_invariance(inputs[0][0], inputs[0][1])
        rows = self.settings.batch_shape.rows
        results: list[Generation] = []
        self.last_logits = []
        for start in range(0, len(inputs), rows):
            chunk = [(text, ids) for text, ids, _ in inputs[start:start + rows]]
            results += self._generate_chunk(chunk, config)
        results = [result if form == "text" else dataclasses.replace(result, prompt_form=form)
                   for result, (_, _, form) in zip(results, inputs)]
        if self._after_generate is not None:
            self._after_generate(self, results, overrides)
        return results[0] if single else results

    def encode(self, prompt: str | Conversation) -> list[int]:
        """The token ids ``generate`` runs for a prompt string or a chat conversation."""
        __tracebackhide__ = True
        return self._input(prompt)[1]

    def _inputs(self, prompt: Any, token_ids: Any) -> tuple[list[tuple[str, list[int], str]], bool]:
        """``(text, ids, form)`` per input, and whether one input (not a list) was given."""
        __tracebackhide__ = True
        if (prompt is None) == (token_ids is None):
            raise TypeError("llm_model.generate() takes a prompt (a string, a chat conversation, or a list of "
                            "them) or token_ids=[...], exactly one of the two")
        if token_ids is not None:
            single = isinstance(token_ids, (list, tuple)) and bool(token_ids) and \
                all(isinstance(t, int) for t in token_ids)
            rows = [token_ids] if single else token_ids
            if not isinstance(rows, (list, tuple)) or not rows:
                raise TypeError(f"llm_model.generate(token_ids=...) takes a list of token ids or a list of such "
                                f"lists, got {token_ids!r}")
            return [self._from_ids(row) for row in rows], single
        if isinstance(prompt, str) or _is_conversation(prompt):
            return [self._input(prompt)], True
        if isinstance(prompt, (list, tuple)) and prompt:
            return [self._input(item) for item in prompt], False
        raise TypeError(f"llm_model.generate() takes a prompt string, a chat conversation (a list of "
                        f"{{'role': ..., 'content': ...}} dicts) or a list of them, got {prompt!r}")

    def _input(self, prompt: Any) -> tuple[str, list[int], str]:
        __tracebackhide__ = True
        if isinstance(prompt, str):
            return prompt, self._checked(prompt, list(self.tokenizer(prompt)["input_ids"])), "text"
        if not _is_conversation(prompt):
            raise TypeError(f"llm_model.generate() takes prompt strings or chat conversations (lists of "
                            f"{{'role': ..., 'content': ...}} dicts), got {prompt!r}")
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigurationError("llm_model.generate(conversation)", prompt[0],
                                     f"the tokenizer of {self._loaded.spec} has no chat template; pass the "
                                     "prompt as a string, or its token ids with token_ids=[...]")
        text = str(self.tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True))
        # The template already wrote the special tokens it wants (a BOS, say): add none a second time.
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        # An error shows the end of the rendered chat, where the user's own words are.
        self._checked(text if len(text) <= 60 else f"(chat, rendered) …{text[-44:]}", ids)
        return text, ids, "chat"

    def _from_ids(self, row: Any) -> tuple[str, list[int], str]:
        __tracebackhide__ = True
        vocab = len(self.tokenizer)
        if not isinstance(row, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                         and 0 <= t < vocab for t in row):
            raise ConfigurationError("llm_model.generate(token_ids=...)", row,
                                     f"expected a list of token ids between 0 and {vocab - 1}")
        text = str(self.tokenizer.decode(list(row)))
        return text, self._checked(text, list(row)), "token_ids"

    def _verify_batch_invariance(self, prompt: str, ids: list[int]) -> None:
        """Once per loaded model and shape: does a prompt give the same bits at the first and the last
        row among other companions? Everything the fixed shape promises rests on it."""
        __tracebackhide__ = True
        import torch

        key = f"{self.settings.batch_shape}@{torch.get_num_threads()}"  # natively, threads decide it too
        probed = self._loaded.cache.setdefault("batch_invariance", {})
        outcome = probed.get(key) or self._probe_batch_invariance(prompt, ids)
        if not (isinstance(outcome, BatchInvarianceProbeError) and outcome.nondeterministic):
            probed[key] = outcome  # randomness may come from this test alone (a hook): probe again next time
        if isinstance(outcome, BatchInvarianceProbeError):
            raise outcome.with_traceback(None)  # one error object for many tests: no earlier test's frames
        if self._note is not None and not self._noted:
            self._noted = True
            self._note(outcome)

    def _probe_batch_invariance(self, prompt: str, ids: list[int]) -> str | BatchInvarianceProbeError:
        shape = self.settings.batch_shape
        if shape.rows == 1:
            return f"batch invariance: nothing to verify at {shape} (one row per batch)"
        config = resolve_generation_config({}, max_new_tokens=PROBE_STEPS, eos_token_ids=[],
                                           pad_token_id=self.tokenizer.pad_token_id)
        others = _companions(ids, shape.length, 2 * (shape.rows - 1), self._loaded.engine.vocab_size())
        first_batch = [(prompt, ids)] + [("", c) for c in others[: shape.rows - 1]]
        first = self._generate_chunk(first_batch, config)[0]
        last = self._generate_chunk([("", c) for c in others[shape.rows - 1:]] + [(prompt, ids)], config)[-1]
        rows = compare(first, last)
        if rows.verdict is Verdict.IDENTICAL:
            return f"batch invariance: verified at {shape} (row 0 vs row {shape.rows - 1}, {PROBE_STEPS} steps)"
        repeat = compare(first, self._generate_chunk(first_batch, config)[0])
        differing = rows if repeat.verdict is Verdict.IDENTICAL else repeat
        step = differing.first_hash_step if differing.first_hash_step is not None else differing.steps_compared
        return BatchInvarianceProbeError(prompt, str(shape), step, *self._invariance_advice(),
                                         nondeterministic=differing is repeat)

    def _invariance_advice(self) -> tuple[str, str]:
        """What was in force, and what restores invariance there."""
        import torch

        fingerprint_now = fingerprint(self._loaded)
        device = str(fingerprint_now["device_class"])
        in_force = (f"device {self._loaded.device}, {self._loaded.dtype}, attention "
                    f"{fingerprint_now['attention_implementation']!r}")
        if device != "cpu":
            return in_force, (f"run one prompt per batch: "
                              f"{pasteable('llm_batch_shape', f'1x{self.settings.batch_shape.length}')} (or give the model eager attention, attn_implementation=\"eager\" in its config)")
        in_force += f", cpu numerics {self._loaded.cpu_numerics!r}, {torch.get_num_threads()} threads"
        if self._loaded.cpu_numerics != "portable":
            return in_force, (f"{pasteable('llm_cpu_numerics', 'portable')}, the default: rows stay invariant at "
                              "any thread count; or one thread (OMP_NUM_THREADS=1)")
        return in_force, ("one thread (OMP_NUM_THREADS=1), or one prompt per batch: "
                          f"{pasteable('llm_batch_shape', f'1x{self.settings.batch_shape.length}')}; please report this machine (lscpu) as a bug")

    def _checked(self, prompt: str, ids: list[int]) -> list[int]:
        __tracebackhide__ = True
        if not ids:
            raise ConfigurationError("llm_model.generate(prompt)", prompt,
                                     "encodes to no tokens; give the model something to continue")
        # One position always stays padding: a batch without any padding drops the attention mask
        # and takes another kernel path, so a prompt of exactly L tokens would change with its
        # companions (measured: logit hashes differ alone vs batched at 4x32). At one row a prompt
        # has no companions and runs at its own length: only the model's context bounds it (the
        # engine checks prompt plus max_new_tokens against it), as in a plain generate().
        shape = self.settings.batch_shape
        if shape.rows > 1 and len(ids) >= shape.length:
            fitting = shape.holding(len(ids))
            raise PromptTooLongError(prompt, len(ids), str(shape), setting=self.settings.batch_shape_setting,
                                     fitting=None if fitting is None else str(fitting))
        return ids

    def _generate_chunk(self, chunk: list[tuple[str, list[int]]], config: dict[str, Any]) -> list[Generation]:
        engine = self._loaded.engine
        out = engine.run([ids for _, ids in chunk], config, self.settings, self._keep_logits)
        fingerprint_now = fingerprint(self._loaded, out.flags)
        eos = set(config["eos_token_id"])
        records = [
            self._record(prompt, ids, out, row, config, eos, fingerprint_now)
            for row, (prompt, ids) in enumerate(chunk)
        ]
        if self._keep_logits:
            self.last_logits += [out.logits[row][: len(record.token_ids)] for row, record in enumerate(records)]
        return records

    def _record(self, prompt: str, prompt_ids: list[int], out: Chunk, row: int,
                config: dict[str, Any], eos: set[int], fingerprint_now: dict[str, Any]) -> Generation:
        tokens, steps = out.tokens[row], out.steps[row]
        finish_reason = "length"
        for index, token in enumerate(tokens):
            if token in eos:
                tokens, finish_reason = tokens[: index + 1], "eos"
                break
        n = len(tokens)
        if out.texts is not None and out.pieces is not None and out.finish_reasons is not None:
            text, pieces, finish_reason = out.texts[row], out.pieces[row], out.finish_reasons[row]
        else:
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            pieces = self.tokenizer.batch_decode([[t] for t in tokens]) if tokens else []
        return Generation(
            prompt=prompt,
            prompt_token_ids=tuple(prompt_ids),
            token_ids=tuple(tokens),
            text=text,
            logit_hashes=tuple(steps.hashes[:n]),
            top_logprobs=tuple(steps.top[:n]),
            margins=tuple(steps.margins[:n]),
            finish_reason=finish_reason,
            generation_config=dict(config),
            batch_shape=str(self.settings.batch_shape.running(len(prompt_ids))),
            pieces=tuple(pieces),
            fingerprint=fingerprint_now,
            hash_definition=self._loaded.engine.hash_definition,
        )


def _companions(ids: list[int], length: int, count: int, vocab_size: int) -> list[list[int]]:
    """``count`` token sequences unlike ``ids`` (other tokens, and lengths spread evenly over
    ``1 .. length - 1``), so the rows beside the probed prompt carry other inputs and other padding."""
    sequences = []
    for index in range(count):
        size = 1 + (index + 1) * max(length - 2, 0) // (count + 1)
        sequences.append([(ids[j % len(ids)] + 7 * (index + 1) + j) % vocab_size for j in range(size)])
    return sequences


Conversation = Sequence[Mapping[str, Any]]  # chat messages: {"role": ..., "content": ...}


def _is_conversation(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(m, Mapping) and isinstance(m.get("role"), str) and "content" in m for m in value)
