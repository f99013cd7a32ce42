"""Determinism audit: re-run one generation under each known source of change and say which moved it.

Each row answers "does this change the result?" with: tokens changed (and the first step), and the
largest absolute difference of the raw logits before the tokens part ways. Rows:

- ``repeat``: the same call N times in this process; more than one distinct result is
  ``NONDETERMINISTIC`` and fails the test;
- ``batch``: among other prompts at the same shape (the plugin's promise: nothing changes);
- ``batch_size``, ``padding``: another B, another L;
- ``cache``: the KV cache off;
- ``threads``: another torch thread count;
- ``dtype``: another dtype, when asked for;
- ``seed``: for a sampled generation (``do_sample=True``), another seed;
- ``decode-vs-prefill`` (``decode_prefill.py``), where the engine can score: the generation's steps
  against the teacher-forced score of its own tokens, the largest logprob difference reported;
- ``chunked-prefill`` and ``prefix-reuse`` (``decode_prefill.py``), where the engine can forward in
  pieces: the generation's prompt and tokens in chunks of 1, 2, 7 and 64, and continuing the
  prompt's cache cut from another request's prefill, each against one forward (the first position
  that differs and its margin);
- ``speculative``, where the engine speculates in process (transformers): the generation again by
  transformers' assisted generation (the call's own speculation, else the model as its own draft:
  verify passes of up to 20 positions), its verify passes and acceptance rate in the row, against
  plain greedy decoding (the first step that differs and its margin); greedy calls on phase-invariant
  kernels only.

A sampled generation is audited under its own sampling settings and seed: its noise is keyed by
its own prompt, so companions, shape and threads move it only through the logits. Where a row's
tokens changed, the row keeps the draw margin the first changed step had (how near a tie the draw
was); the seed row shows the seed is part of the sample's identity.

A server engine (``openai:``) cannot vary any of these: under ``--llm-audit``
(:func:`after_generate_hook`) its request is audited as it is served instead
(``model/serving_audit.py``). The ``decode-vs-prefill`` row and its check: ``model/decode_prefill.py``.

Only the audit needs each step's raw logits (a view's ``on_chunk`` keeps them) and a copy of the
weights in another dtype; both live here, not in the model everyone else uses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.decoding import SPECULATION_ARGUMENTS, resolve_generation_config, speculation_of
from pytest_llmdeterminism.engines.loaded import AuditedEngine, ScoringEngine, ServedEngine, SpeculatingEngine
from pytest_llmdeterminism.errors import ConfigurationError, LLMDeterminismError
from pytest_llmdeterminism.generation import Generation
from pytest_llmdeterminism.judge.compare import first_token_divergence
from pytest_llmdeterminism.model.decode_prefill import decode_vs_prefill, phase_rows
from pytest_llmdeterminism.model.inputs import fits, is_token_ids
from pytest_llmdeterminism.model.serving_audit import serving_audit
from pytest_llmdeterminism.reporting.audit import SPECULATIVE, AuditReport, AuditRow
from pytest_llmdeterminism.sampling import MAX_SEED
from pytest_llmdeterminism.shape import BatchShape

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_llmdeterminism.engines.capture import Chunk, Logits
    from pytest_llmdeterminism.engines.loaded import LoadedModel
    from pytest_llmdeterminism.model.llm_model import LLMModel

DEFAULT_REPEATS = 5
COMPANIONS = ("Hello there, how are you today?", "def add(a, b):", "1 2 3", "The weather today is",
              "Once upon a time, in a land far away,", "Q:")


class NondeterminismError(LLMDeterminismError, AssertionError):
    """Repeated identical calls gave different results. ``audit`` holds the full report."""

    def __init__(self, audit: AuditReport) -> None:
        self.audit = audit
        super().__init__("NONDETERMINISTIC: " + "\n".join(audit.lines()))


def audit(llm_model: LLMModel, prompt: str | Sequence[int] | Sequence[Mapping[str, Any]], *,
          repeats: int = DEFAULT_REPEATS, dtype: str | None = None, **overrides: Any) -> AuditReport:
    """Re-run ``prompt`` (a string, a chat conversation or token ids) under each source of change;
    see the module docstring for the rows."""
    import torch

    shape = llm_model.settings.batch_shape
    seed = overrides.get("seed")
    if isinstance(seed, (list, tuple)):  # one seed per prompt: the audit runs one prompt
        if len(seed) != 1:
            raise ConfigurationError("audit(seed=...)", seed, "the audit runs one prompt: give one seed")
        overrides = {**overrides, "seed": seed[0]}
    # Every row varies plain greedy decoding; the speculative row adds the call's speculation (or the
    # model as its own draft) back.
    speculation = {} if speculation_of(overrides) is None else \
        {name: overrides[name] for name in SPECULATION_ARGUMENTS if overrides.get(name) is not None}
    overrides = {name: value for name, value in overrides.items() if name not in SPECULATION_ARGUMENTS}
    probe = _KeptLogits(llm_model)
    ids = [int(t) for t in prompt] if is_token_ids(prompt) else llm_model.encode(prompt)  # type: ignore[arg-type]
    text = prompt if isinstance(prompt, str) else str(llm_model.tokenizer.decode(ids))

    def run(view: _KeptLogits, batch: Sequence[list[int]], row: int,
            **extra: Any) -> tuple[Generation, list[Logits]]:
        return view.run(batch, row, **{**overrides, **extra})

    prompt = ids  # every run below feeds exactly these ids

    runs = [run(probe, [prompt], 0) for _ in range(max(repeats, 1))]
    base = runs[0]
    unique = len({(g.token_ids, g.step_hashes) for g, _ in runs})
    rows = [_row("repeat", f"{unique} unique of {len(runs)}", base,
                 max(runs[1:], key=lambda r: _difference(base, r)[2], default=base))]

    companions = _fitting(llm_model, COMPANIONS, shape)[: shape.rows - 1]
    if companions:
        rows.append(_row("batch", f"{len(companions)} companion(s), row {len(companions)}", base,
                         run(probe, [*companions, prompt], len(companions))))
    else:
        rows.append(AuditRow("batch", f"B={shape.rows} leaves no room for companions", False, None, 0.0,
                             ran=False))
    other_rows = 1 if shape.rows > 1 else 4
    rows.append(_row("batch_size", f"B {shape.rows} -> {other_rows}", base,
                     run(_KeptLogits(llm_model, batch_shape=BatchShape(other_rows, shape.length)),
                         [prompt], 0)))
    longer = shape.length + 8  # not a multiple of 16: some kernels block by 16 and would hide the change
    if shape.rows == 1:
        rows.append(AuditRow("padding", "B=1 runs each prompt at its own length, unpadded", False, None, 0.0,
                             ran=False))
    else:
        rows.append(_row("padding", f"L {shape.length} -> {longer}", base,
                         run(_KeptLogits(llm_model, batch_shape=BatchShape(shape.rows, longer)),
                             [prompt], 0)))
    cache = overrides.get("use_cache", True)
    rows.append(_row("cache", f"use_cache {cache} -> {not cache}", base,
                     run(probe, [prompt], 0, use_cache=not cache)))
    threads = torch.get_num_threads()
    other_threads = 1 if threads > 1 else 2
    torch.set_num_threads(other_threads)
    try:
        rows.append(_row("threads", f"{threads} -> {other_threads}", base, run(probe, [prompt], 0)))
    finally:
        torch.set_num_threads(threads)
    sampling = base[0].sampling
    if sampling:
        other_seed = sampling["seed"] + 1 if sampling["seed"] < MAX_SEED else sampling["seed"] - 1
        rows.append(_row("seed", f"{sampling['seed']} -> {other_seed}", base,
                         run(probe, [prompt], 0, seed=other_seed)))
    if dtype is not None:
        rows.append(_row("dtype", f"{llm_model.fingerprint['dtype']} -> {dtype}", base,
                         run(_KeptLogits(llm_model, loaded=_in_dtype(llm_model.loaded, dtype)), [prompt], 0)))
    if isinstance(llm_model.loaded.engine, ScoringEngine) and base[0].token_ids:
        rows.append(decode_vs_prefill(llm_model, base[0]).row())
    rows.extend(phase_rows(llm_model, base[0]))
    rows.append(_speculative_row(llm_model, lambda **extra: run(probe, [prompt], 0, **extra), base,
                                 speculation or {"assistant_model": llm_model}))
    return AuditReport(text, str(shape), tuple(rows), unique, len(runs), sampling)


def _speculative_row(llm_model: LLMModel, run: Callable[..., tuple[Generation, list[Logits]]],
                     base: tuple[Generation, list[Logits]], speculation: dict[str, Any]) -> AuditRow:
    """The ``speculative`` row: the generation again with ``speculation`` (transformers' assisted
    generation, verify passes of up to k + 1 positions) against plain greedy decoding; identical, or
    the first step whose token differs and the plain step's top-2 margin there. Not run where the
    engine does not speculate in process, for sampled generations (speculation is greedy only here)
    or on kernels whose verify pass is not decode's (``generate`` refuses speculation there)."""
    engine = llm_model.loaded.engine
    if not isinstance(engine, SpeculatingEngine):
        return AuditRow(SPECULATIVE, f"{engine.name} does not speculate in process", False, None, 0.0,
                        ran=False)
    if base[0].sampling:
        return AuditRow(SPECULATIVE, "speculation is greedy only", False, None, 0.0, ran=False)
    try:
        other = run(**speculation)  # generate's own check refuses kernels whose verify pass is not decode's
    except ConfigurationError:
        return AuditRow(SPECULATIVE, "these kernels' verify pass is not a decode step's: speculation is "
                        "refused on them (the chunked-prefill row measures the phase's effect)", False,
                        None, 0.0, ran=False)
    done = other[0].speculation
    rate = done.acceptance_rate if done is not None else None
    how = "the model as its own draft" if "assistant_model" in speculation else \
        f"prompt lookup of {speculation['prompt_lookup_num_tokens']}"
    accepted = f"{rate:.0%} of drafts accepted" if rate is not None else "nothing drafted"
    passes = done.passes if done is not None else 0
    found = _row(SPECULATIVE, f"{how}: {passes} verify passes, {accepted}", base, other)
    if found.first_step is None or found.first_step >= len(base[0].margins):
        return found
    return dataclasses.replace(found, draw_margin=base[0].margins[found.first_step])


def _row(source: str, change: str, base: tuple[Generation, list[Logits]],
         other: tuple[Generation, list[Logits]]) -> AuditRow:
    changed, first, delta = _difference(base, other)
    margins = base[0].draw_margins
    margin = margins[first] if first is not None and first < len(margins) else None
    return AuditRow(source, change, changed, first, delta, draw_margin=margin)


def _difference(a: tuple[Generation, list[Logits]],
                b: tuple[Generation, list[Logits]]) -> tuple[bool, int | None, float]:
    import numpy as np

    (gen_a, logits_a), (gen_b, logits_b) = a, b
    steps = min(len(gen_a.token_ids), len(gen_b.token_ids))
    first = first_token_divergence(gen_a.token_ids, gen_b.token_ids)
    upto = steps if first is None else min(first + 1, steps)
    delta = max((float(np.max(np.abs(logits_a[t].astype(np.float64) - logits_b[t]))) for t in range(upto)),
                default=0.0)
    return first is not None, first, delta


class _KeptLogits:
    """A view of the model (under other settings, or on ``loaded``, a copy of it) whose calls keep
    each step's raw logits, per prompt of the last call."""

    def __init__(self, llm_model: LLMModel, *, loaded: LoadedModel | None = None, **changes: Any) -> None:
        self._logits: list[list[Logits]] = []
        settings = dataclasses.replace(llm_model.settings, **changes)
        self._view = llm_model.view(loaded=loaded, settings=settings, on_chunk=self._keep)

    def _keep(self, out: Chunk, records: list[Generation]) -> None:
        self._logits += [out.logits[row][: len(record.token_ids)] for row, record in enumerate(records)]

    def run(self, batch: Sequence[list[int]], row: int, **overrides: Any) -> tuple[Generation, list[Logits]]:
        """Row ``row`` of a call on ``batch`` (token ids), and its steps' raw logits."""
        self._logits = []
        results = self._view.generate(token_ids=list(batch), **overrides)
        return results[row], self._logits[row]


def _in_dtype(loaded: LoadedModel, dtype: str) -> LoadedModel:
    """The same weights cast to ``dtype``: a copy the engine makes, once per loaded model."""
    if dtype not in loaded.in_dtypes:
        engine = loaded.engine
        # the audit runs only where the engine supports it: generate() refuses the others
        assert isinstance(engine, AuditedEngine) and engine.supports_audit
        copied = engine.in_dtype(dtype)
        loaded.in_dtypes[dtype] = loaded.fresh(model=copied.model, dtype=dtype, engine=copied)
    return loaded.in_dtypes[dtype]


def _fitting(llm_model: LLMModel, prompts: Sequence[str], shape: BatchShape) -> list[list[int]]:
    """The token ids of the prompts that fit ``shape`` beside another prompt (see ``inputs.fits``)."""
    encoded = (list(llm_model.tokenizer(p)["input_ids"]) for p in prompts)
    return [ids for ids in encoded if ids and fits(len(ids), shape)]


def after_generate_hook(repeats: int, dtype: str | None,
                        record: Callable[[dict[str, Any]], None]) -> Callable[[LLMModel, list[Generation],
                                                                               dict[str, Any]], None]:
    """What ``llm_model.generate`` calls after each call under ``--llm-audit``: audit every result,
    ``record`` each report, fail on nondeterminism."""

    def after_generate(llm: LLMModel, results: list[Generation], overrides: dict[str, Any]) -> None:
        __tracebackhide__ = True
        if isinstance(llm.loaded.engine, ServedEngine):  # a server: audited as it is served
            settings = llm.settings
            config = resolve_generation_config(overrides, max_new_tokens=settings.max_new_tokens,
                                               eos_token_ids=llm.loaded.engine.eos_token_ids(),
                                               pad_token_id=llm.tokenizer.pad_token_id, seed=settings.seed)
            verified = llm.loaded.served_sampling  # a sampled call verified the server's sampling first
            for result in results:
                served = serving_audit(llm.loaded, result.prompt_token_ids, config, seed=llm.settings.seed,
                                       text=str(result.prompt))
                if result.sampling and verified is not None:
                    served = dataclasses.replace(served, sampling=verified.rows)
                record(served.to_json())
            return
        for result in results:
            own = {**overrides, "seed": result.sampling["seed"]} if result.sampling else overrides
            found = audit(llm, list(result.prompt_token_ids), repeats=repeats, dtype=dtype, **own)
            found = dataclasses.replace(found, prompt=result.prompt)  # as the test wrote it
            record(found.to_json())
            if found.nondeterministic:
                raise NondeterminismError(found)

    return after_generate
