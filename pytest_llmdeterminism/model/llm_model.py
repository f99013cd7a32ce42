"""The ``llm_model`` fixture object: greedy generation in one fixed batch shape.

Every call runs at exactly ``B x L``: prompts left-padded to ``L`` with an explicit attention
mask, filler rows up to ``B``, longer lists in chunks of ``B``. On one machine the same prompt
in the same shape gives bitwise identical logits whatever the other rows hold, so batching never
changes a result. What counts as an input is ``inputs.py``'s; the probe that verifies the
invariance is ``probe.py``'s.

Long: the object a test holds has one method per question it can ask of the model (generate,
score, evaluate, encode), each a short front over the modules that do the work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

from pytest_llmdeterminism.decoding import DecodingConfig, resolve_generation_config
from pytest_llmdeterminism.engines.capture import Chunk
from pytest_llmdeterminism.engines.loaded import ScoringEngine, ServedEngine, SpeculatingEngine
from pytest_llmdeterminism.errors import ConfigurationError
from pytest_llmdeterminism.generation import TOP_K, Generation, PromptForm, Score
from pytest_llmdeterminism.model import concurrency, inputs
from pytest_llmdeterminism.model.fingerprint import fingerprint
from pytest_llmdeterminism.model.inputs import Conversation, ModelInput, ScoreInput
from pytest_llmdeterminism.model.probe import verify_batch_invariance
from pytest_llmdeterminism.model.served_sampling import verified_sampler
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

if TYPE_CHECKING:
    from pytest_llmdeterminism.engines.capture import ScoreChunk
    from pytest_llmdeterminism.engines.loaded import LoadedModel
    from pytest_llmdeterminism.generation import Evaluation

# A prompt as ``score`` takes it: a string, a chat conversation or token ids; a continuation: a
# string or token ids.
Prompt = str | Conversation | Sequence[int]
Continuation = str | Sequence[int]

# What sees each chunk an engine ran, with its records: the audit keeps the raw logits with it.
ChunkHook = Callable[[Chunk, list[Generation]], None]


class LLMModel:
    """Greedy, fixed-shape generation with per-step capture. ``.model`` and ``.tokenizer`` are the
    underlying transformers objects."""

    def __init__(self, loaded: LoadedModel, settings: GenerationSettings, *,
                 after_generate: Callable[[LLMModel, list[Generation], dict[str, Any]], None] | None = None,
                 note: Callable[[str], None] | None = None, verify_batch_invariance: bool = True,
                 on_chunk: ChunkHook | None = None,
                 progress: Callable[[str], Callable[[], None]] | None = None) -> None:
        self._loaded = loaded
        settings = dataclasses.replace(settings, shape_in_goldens=_shape_in_goldens(loaded))
        self._progress = progress  # called before a generation (what it runs); what it returns, after
        self.settings = settings
        self._after_generate = after_generate  # the --llm-audit hook
        self._note = note  # tells the run's summary what the batch-invariance probe found
        self._noted = False
        # The audit measures rows, shapes and repeats itself (its views run other shapes on purpose).
        self._verify = verify_batch_invariance and after_generate is None
        self._on_chunk = on_chunk  # with one, engines return each step's raw logits too

    @property
    def audited(self) -> bool:
        """Under ``--llm-audit``: every generation is audited after it runs."""
        return self._after_generate is not None

    @property
    def loaded(self) -> LoadedModel:
        """The loaded model this object generates with."""
        return self._loaded

    def with_settings(self, **changes: Any) -> LLMModel:
        """The same loaded model under other settings (shape, seed, ...), for audits and probes."""
        return self.view(settings=dataclasses.replace(self.settings, **changes))

    def view(self, *, loaded: LoadedModel | None = None, settings: GenerationSettings | None = None,
             on_chunk: ChunkHook | None = None) -> LLMModel:
        """This model (or ``loaded``, a copy of it) under ``settings``, neither probed nor audited;
        ``on_chunk`` sees each chunk an engine ran (the audit's side channel for raw logits)."""
        return LLMModel(loaded or self._loaded, settings or self.settings, verify_batch_invariance=False,
                        on_chunk=on_chunk)

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

    def generate(self, prompt: Any = None, *, token_ids: Any = None,
                 **overrides: Any) -> Generation | list[Generation]:
        """Greedy (or, with ``do_sample=True``, seeded sampled) continuation of one input, or of each
        input in a list.

        An input is a prompt string (tokenised with the tokenizer's special tokens), a chat
        conversation (a list of ``{"role": ..., "content": ...}`` dicts, rendered with the
        tokenizer's chat template and ``add_generation_prompt=True``, tokenised once without adding
        special tokens again), or, with ``token_ids=``, the token ids themselves.
        ``overrides`` may set ``max_new_tokens``, ``min_new_tokens``, ``repetition_penalty``,
        ``no_repeat_ngram_size``, ``eos_token_id`` or ``use_cache``. Sampling arguments
        (``temperature``, ``top_k``, ``top_p``, ``min_p``, ``seed``) are refused unless
        ``do_sample=True`` asks for the plugin's own seeded sampler (transformers and llama.cpp
        engines), or on a server engine for the server's, sent the request's seed once the server is
        verified to draw from it alone (``served_sampling.py``; ``"sampler": "engine:..."``):

        - defaults are transformers' library defaults: ``temperature=1.0``, ``top_k=50``,
          ``top_p=1.0`` (pass ``top_k=0`` for no top-k cut); a checkpoint's
          ``generation_config.json`` is not applied;
        - ``seed`` is one integer for every prompt (the test's seed by default) or a list with one
          per prompt. A sample depends on the seed and the prompt's own token ids only, so two
          identical prompts with one seed give one sample; N samples of one prompt need N seeds:
          ``generate([prompt] * n, do_sample=True, seed=list(range(n)))``;
        - the draw is the plugin's (Gumbel-max with hashed noise, ``sampling.py``): the sample for
          seed ``s`` is not transformers' sample after ``torch.manual_seed(s)``;
        - at the top-p boundary, tokens of equal score are ranked by lower token id (transformers
          keeps its sort's order).

        Greedy calls may speculate with transformers' own arguments: ``prompt_lookup_num_tokens=N``
        or ``assistant_model=llm_model`` (the model as its own draft). They run transformers'
        assisted generation one prompt at a time, on kernels whose verify pass computes what decode
        does (else refused), so the tokens and every step's hash are the plain call's and its golden
        applies; ``Generation.speculation`` says how many drafts the verify passes accepted.
        """
        __tracebackhide__ = True
        given, single = inputs.model_inputs(prompt, token_ids, tokenizer=self.tokenizer,
                                            settings=self.settings, spec=self._loaded.spec)
        config = self._decoding(overrides)
        self._refuse_what_the_engine_cannot_do(config, len(given))
        self._verify_once(given[0])
        results = self._in_the_shape(given, config)
        if self.settings.concurrency:
            for index, (result, item) in enumerate(zip(results, given, strict=True)):
                self._check_among_companions(item.text, item.ids, result, config, index)
        if self._after_generate is not None:
            self._after_generate(self, results, overrides)
        return results[0] if single else results

    def _decoding(self, overrides: Mapping[str, Any]) -> DecodingConfig:
        """A call's decoding settings: its overrides over the test's; a speculation as the engine
        runs it (its draft model resolved), refused where the engine cannot speculate losslessly."""
        __tracebackhide__ = True
        config = self._decoding_settings(overrides)
        if config.speculation is None:
            return config
        engine = self._loaded.engine
        if not isinstance(engine, SpeculatingEngine):
            raise ConfigurationError(
                "llm_model.generate", config.speculation.describe(),
                f"speculative decoding is checked on the transformers backend, where the plugin runs "
                f"transformers' assisted generation on phase-invariant kernels; {self._loaded.spec} runs "
                f"on {engine.name}. Speculate on the same model without the engine prefix")
        return dataclasses.replace(config, speculation=engine.speculation(config.speculation))

    def _decoding_settings(self, overrides: Mapping[str, Any]) -> DecodingConfig:
        return resolve_generation_config(
            dict(overrides),
            max_new_tokens=self.settings.max_new_tokens,
            eos_token_ids=self._loaded.engine.eos_token_ids(),
            pad_token_id=self.tokenizer.pad_token_id,
            seed=self.settings.seed,
            # what an eos_token_id override must be below (asked only then: engines answer it lazily)
            vocab_size=self._loaded.engine.vocab_size() if "eos_token_id" in overrides else None,
        )

    def _refuse_what_the_engine_cannot_do(self, config: DecodingConfig, prompts: int) -> None:
        """Sampling, concurrency and the audit, refused before anything runs where the engine cannot."""
        __tracebackhide__ = True
        engine = self._loaded.engine
        if config.sampling is not None:
            self._refuse_sampling_where_not_owned(config, prompts)

        if self.settings.concurrency:
            concurrency.refuse_where_not_served(engine, self._loaded.spec, self.settings.concurrency)
        served = isinstance(engine, ServedEngine)  # audited as it is served (model/serving_audit.py)
        if self._after_generate is not None and not (engine.supports_audit or served):
            raise ConfigurationError("--llm-audit", True, "the audit varies batch shape, padding, threads "
                                     f"and dtype of the transformers backend; {self._loaded.spec} runs on "
                                     f"{engine.name}. Audit the same model without the engine prefix")

    def _verify_once(self, first: ModelInput) -> None:
        """The batch-invariance probe on the call's first input, where the engine batches rows (the
        probe itself runs once per model, shape and thread count: ``probe.py``)."""
        if self._verify and not self._loaded.engine.runs_rows_alone:
            found = verify_batch_invariance(self._loaded, self.settings, first.text, first.ids,
                                            self._generate_chunk, self._other_shape(len(first.ids)))
            if self._note is not None and not self._noted:
                self._noted = True
                self._note(found)

    def _in_the_shape(self, given: Sequence[ModelInput], config: DecodingConfig) -> list[Generation]:
        """Every input generated in the fixed shape's batches of rows, each with its own seed."""
        rows = self.settings.batch_shape.rows
        results: list[Generation] = []
        done = self._started(len(given), f"{len(given)} prompt(s), max_new_tokens {config.max_new_tokens}")
        for start in range(0, len(given), rows):
            chunk = [(item.text, item.ids) for item in given[start:start + rows]]
            seeds = config.seeds[start:start + rows]
            chunk_config = dataclasses.replace(config, seeds=seeds) if seeds else config
            results += self._generate_chunk(chunk, chunk_config)
        done()
        return [result if item.form is PromptForm.TEXT else dataclasses.replace(result, prompt_form=item.form)
                for result, item in zip(results, given, strict=True)]

    def _started(self, inputs: int, what: str) -> Callable[[], None]:
        """The progress line's start for a call of ``inputs`` (``what``) in this shape; returns its end."""
        if self._progress is None:
            return lambda: None
        rows = self.settings.batch_shape.rows
        padded = f", padded to {rows} rows" if inputs % rows else ""  # filler rows cost as much as real ones
        return self._progress(f"{what} at {self.settings.batch_shape}{padded}")

    def _check_among_companions(self, prompt: str, ids: list[int], alone: Generation, config: DecodingConfig,
                                index: int) -> None:
        """``@deterministic(concurrency=N)``: ``ids`` again among N concurrent requests, which must not
        change its answer (``model/concurrency.py``)."""
        __tracebackhide__ = True
        one = config
        if config.sampling is not None:
            one = dataclasses.replace(config, seeds=(config.seed_of(index),) if config.seeds else ())
        fingerprint_now = fingerprint(self._loaded)
        eos = set(config.eos_token_id)
        concurrency.check_among(
            self._loaded.engine, self._loaded.spec, prompt=prompt, ids=ids, config=one,
            alone=alone,
            companions=self.settings.concurrency, seed=concurrency.companion_seed(self.settings.seed, ids),
            record=lambda chunk: self._record(prompt, ids, chunk, 0, one, eos, fingerprint_now),
            piece=lambda token: str(self.tokenizer.decode([token])))

    def _refuse_sampling_where_not_owned(self, config: DecodingConfig, prompts: int) -> None:
        """``do_sample=True`` runs the plugin's own sampler over the full logits (the transformers and
        llama.cpp engines in process), or a server's, once it is verified to draw each request from its
        own seed (``served_sampling.py``); one seed or one per prompt."""
        __tracebackhide__ = True
        if not self._loaded.engine.owns_sampling:
            verified_sampler(self._loaded)
        if config.seeds and len(config.seeds) != prompts:
            raise ConfigurationError("llm_model.generate(seed=...)", list(config.seeds),
                                     f"expected one seed per prompt ({prompts}), or one integer for all")

    def _other_shape(self, prompt_tokens: int) -> tuple[BatchShape, Callable[..., list[Generation]]] | None:
        """Under batch-invariant kernels, another shape for the probe (the prompt alone, or two rows: as
        long as the prompt of ``prompt_tokens``, which at one row runs at its own length past L)."""
        if not fingerprint(self._loaded).get("batch_invariant"):
            return None
        shape = self.settings.batch_shape
        other = BatchShape(1, shape.length) if shape.rows > 1 else \
            BatchShape(2, max(shape.length, prompt_tokens))
        return other, self.with_settings(batch_shape=other)._generate_chunk

    def _sampler(self) -> dict[str, str]:
        """Where a server drew the sample: its sampler's name in place of the plugin's."""
        engine = self._loaded.engine
        return {} if engine.owns_sampling else {"sampler": getattr(engine, "sampler", "engine")}

    @overload
    def score(self, prompt: Prompt, continuation: Continuation, *, prompt_logprobs: bool = False,
              top_k: int = TOP_K) -> Score: ...

    @overload
    def score(self, prompt: Sequence[tuple[Prompt, Continuation]], continuation: None = None, *,
              prompt_logprobs: bool = False, top_k: int = TOP_K) -> list[Score]: ...

    def score(self, prompt: Any, continuation: Any = None, *, prompt_logprobs: bool = False,
              top_k: int = TOP_K) -> Score | list[Score]:
        """The logprobs the model gives a fixed ``continuation`` after ``prompt``, teacher-forced (one
        forward over prompt + continuation in the fixed shape, on the kernels generation runs on), or
        those of each ``(prompt, continuation)`` pair of a list, in chunks of the shape's rows.

        The prompt is taken as ``generate`` takes it: a string (with the tokenizer's special tokens), a
        chat conversation (rendered with ``add_generation_prompt=True``) or token ids. The
        continuation is a string, tokenised on its own without special tokens (the :class:`Score`
        keeps its ids), or token ids. ``top_k``: how many best tokens each position records;
        ``prompt_logprobs=True``: the prompt's own tokens' logprobs too.
        """
        __tracebackhide__ = True
        engine = self._loaded.engine
        if not isinstance(engine, ScoringEngine):
            raise ConfigurationError("llm_model.score", self._loaded.spec,
                                     f"the {engine.name} engine cannot score a continuation; score on the "
                                     "transformers backend (llm_model = the model's folder or .gguf file, "
                                     "without an engine prefix), llamacpp:PATH.gguf, a server "
                                     "(openai:...) or vllm:...")
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise ConfigurationError("llm_model.score(top_k=...)", top_k,
                                     "expected an integer >= 1: how many best tokens each position records")
        if not isinstance(prompt_logprobs, bool):
            raise ConfigurationError("llm_model.score(prompt_logprobs=...)", prompt_logprobs,
                                     "expected True or False")
        given, single = inputs.score_inputs(prompt, continuation, tokenizer=self.tokenizer,
                                            settings=self.settings, spec=self._loaded.spec)
        rows = self.settings.batch_shape.rows
        results: list[Score] = []
        done = self._started(len(given), f"the scores of {len(given)} pair(s)")
        for start in range(0, len(given), rows):
            chunk = given[start:start + rows]
            out = engine.score([(item.prompt.ids, item.continuation_ids) for item in chunk], self.settings,
                               top_k=top_k, prompt_logprobs=prompt_logprobs)
            fingerprint_now = fingerprint(self._loaded, out.flags)
            results += [self._scored(item, out, row, fingerprint_now) for row, item in enumerate(chunk)]
        done()
        return results[0] if single else results

    def _scored(self, item: ScoreInput, out: ScoreChunk, row: int, fingerprint_now: dict[str, Any]) -> Score:
        found, ids = out.rows[row], item.continuation_ids
        pieces = out.pieces[row] if out.pieces is not None else \
            self.tokenizer.batch_decode([[t] for t in ids])
        return Score(
            prompt=item.prompt.text,
            prompt_token_ids=tuple(item.prompt.ids),
            continuation=item.continuation,
            token_ids=tuple(ids),
            logprobs=tuple(found.logprobs),
            ranks=tuple(found.ranks),
            step_hashes=tuple(found.hashes),
            top_logprobs=tuple(found.top),
            rank_margins=tuple(found.rank_margins),
            batch_shape=str(self.settings.batch_shape.running(len(item.prompt.ids) + len(ids))),
            pieces=tuple(pieces),
            fingerprint=fingerprint_now,
            prompt_form=item.prompt.form,
            hash_definition=self._loaded.engine.hash_definition,
            prompt_logprobs=tuple(found.prompt_logprobs),
        )

    def evaluate(self, items: Sequence[Mapping[str, Any]], *, acc_norm: bool = False,
                 match: Callable[[str, str], bool] | None = None, **overrides: Any) -> Evaluation:
        """Run an eval item by item: an :class:`~pytest_llmdeterminism.generation.Evaluation` with
        ``.accuracy`` and ``.items`` (each ``.id``, ``.choice``, ``.correct``, ``.margin``), which
        ``golden_tokens.check`` records and judges as an eval golden.

        Multiple choice ``{"id", "prompt", "choices", "label"}``: each choice scored after the prompt
        (the sum of its logprobs, as lm-eval's ``acc``; per character with ``acc_norm=True``), the best
        decides, its margin over the runner-up. Generative ``{"id", "prompt", "answer"}``: a greedy
        generation (``overrides`` as ``generate`` takes them), correct when ``match(text, answer)``
        (default: equal after stripping), its margin the smallest top-1/top-2 margin on the steps
        that spelt the answer. Prompts as ``generate`` takes them; batched in the fixed shape.
        """
        __tracebackhide__ = True
        from pytest_llmdeterminism.model.evaluate import evaluate

        return evaluate(self, items, acc_norm=acc_norm, match=match, **overrides)

    def encode(self, prompt: str | Conversation) -> list[int]:
        """The token ids ``generate`` runs for a prompt string or a chat conversation."""
        __tracebackhide__ = True
        return inputs.encoded(prompt, tokenizer=self.tokenizer, settings=self.settings,
                              spec=self._loaded.spec).ids

    def _generate_chunk(self, chunk: list[tuple[str, list[int]]], config: DecodingConfig) -> list[Generation]:
        engine = self._loaded.engine
        out = engine.run([ids for _, ids in chunk], config, self.settings, self._on_chunk is not None)
        fingerprint_now = fingerprint(self._loaded, out.flags)
        eos = set(config.eos_token_id)
        records = [
            self._record(prompt, ids, out, row, config, eos, fingerprint_now)
            for row, (prompt, ids) in enumerate(chunk)
        ]
        if self._on_chunk is not None:
            self._on_chunk(out, records)
        return records

    def _record(self, prompt: str, prompt_ids: list[int], out: Chunk, row: int,
                config: DecodingConfig, eos: set[int], fingerprint_now: dict[str, Any]) -> Generation:
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
            step_hashes=tuple(steps.hashes[:n]),
            top_logprobs=tuple(steps.top[:n]),
            margins=tuple(steps.margins[:n]),
            finish_reason=finish_reason,
            generation_config=(config.as_dict() if config.sampling is None
                               else {**config.as_dict(), "seed": config.seed_of(row), **self._sampler()}),
            batch_shape=str(self.settings.batch_shape.running(len(prompt_ids))),
            pieces=tuple(pieces),
            fingerprint=fingerprint_now,
            hash_definition=self._loaded.engine.hash_definition,
            draw_margins=tuple(out.draw_margins[row][:n]) if out.draw_margins else (),
            speculation=out.speculated[row] if out.speculated else None,
        )


def _shape_in_goldens(loaded: LoadedModel) -> bool:
    """Whether the batch shape changes a prompt's numbers, so is part of every golden: not where each
    prompt runs alone (llama.cpp, a server) nor on batch-invariant kernels."""
    kernels = getattr(loaded.engine, "kernels", None)
    return not (loaded.engine.runs_rows_alone or bool(getattr(kernels, "batch_invariant", False)))
