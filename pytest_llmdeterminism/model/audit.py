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
- ``decode-vs-prefill`` (:func:`decode_vs_prefill`), where the engine can score: the generation's steps
  against the teacher-forced score of its own tokens, the largest logprob difference reported;
  :func:`assert_decode_matches_prefill` is its opt-in check in a test.

A sampled generation is audited under its own sampling settings and seed: its noise is keyed by
its own prompt, so companions, shape and threads move it only through the logits. Where a row's
tokens changed, the row keeps the draw margin the first changed step had (how near a tie the draw
was); the seed row shows the seed is part of the sample's identity.

A server engine (``openai:``) cannot vary any of these: :func:`serving_audit` runs its request as it
is served instead (``concurrent``, ``repeat`` under load, ``prefix-cache``; docs/serving.md), comparing
the top-k logprobs the server returns, and :func:`verify_serving` records what it verified in the
fingerprint (``llm_server_checks``).

Only the audit needs each step's raw logits (a view's ``on_chunk`` keeps them) and a copy of the
weights in another dtype; both live here, not in the model everyone else uses.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.engines.loaded import AuditedEngine, ScoringEngine, ServedEngine
from pytest_llmdeterminism.errors import ConfigurationError, LLMDeterminismError
from pytest_llmdeterminism.generation import Generation, resolve_generation_config
from pytest_llmdeterminism.judge.compare import first_token_divergence
from pytest_llmdeterminism.model.inputs import fits, is_token_ids
from pytest_llmdeterminism.reporting.audit import (
    AuditReport,
    AuditRow,
    DecodeVsPrefill,
    ServingAudit,
    ServingRow,
)
from pytest_llmdeterminism.sampling import MAX_SEED
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_llmdeterminism.engines.capture import Chunk, Logits
    from pytest_llmdeterminism.engines.loaded import LoadedModel
    from pytest_llmdeterminism.generation import DecodingConfig
    from pytest_llmdeterminism.model.llm_model import LLMModel

DEFAULT_REPEATS = 5
COMPANIONS = ("Hello there, how are you today?", "def add(a, b):", "1 2 3", "The weather today is",
              "Once upon a time, in a land far away,", "Q:")


class NondeterminismError(LLMDeterminismError, AssertionError):
    """Repeated identical calls gave different results. ``audit`` holds the full report."""

    def __init__(self, audit: AuditReport) -> None:
        self.audit = audit
        super().__init__("NONDETERMINISTIC: " + "\n".join(audit.lines()))


class DecodePrefillMismatchError(LLMDeterminismError, AssertionError):
    """A generation's steps and the score of its own tokens differ beyond the tolerance
    (:func:`assert_decode_matches_prefill`). ``found`` holds the comparison."""

    def __init__(self, found: DecodeVsPrefill) -> None:
        self.found = found
        super().__init__("\n".join(found.lines()))


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
    return AuditReport(text, str(shape), tuple(rows), unique, len(runs), sampling)


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


# --- the serving audit: a server engine's request as it is served (engines/companions.py) ---

SERVING_ROUNDS = 3
DEFAULT_SLOTS = 4  # the most companions where the spec does not say the server's slots (#slots=N)


def serving_audit(loaded: LoadedModel, ids: Sequence[int], config: DecodingConfig, *,
                  rounds: int = SERVING_ROUNDS, seed: int = 0, text: str | None = None) -> ServingAudit:
    """The request ``ids`` on a server engine, alone and as it is served: ``concurrent`` among 2 up to
    the server's slots of concurrent requests (each compared with it alone), ``repeat`` (the answers
    under the most load compared with each other) and ``prefix-cache`` (after a request that shares a
    long prefix, the server's prefix cache on, compared with it cold). Companions come from ``seed``."""
    __tracebackhide__ = True
    from pytest_llmdeterminism.engines import companions as needle

    engine, needle_ids = loaded.engine, [int(t) for t in ids]
    if not isinstance(engine, ServedEngine):
        raise ConfigurationError("llm_server_checks", True, f"the serving audit sends requests to a server; "
                                 f"{loaded.spec} runs on {engine.name} in this process")
    slots = engine.slots or DEFAULT_SLOTS
    reference = needle.alone(engine, needle_ids, config, seed)
    rows: list[ServingRow] = []
    loaded_answers: list[Chunk] = []
    for count in sorted({2, max(slots, 2)}):
        done = needle.run_among(engine, needle_ids, config, companions=count, rounds=rounds,
                                seed=seed + count)
        worst = max((answer_difference(reference, r.output) for r in done), key=_severity)
        positions = ", ".join(str(r.position) for r in done)
        rows.append(_serving_row("concurrent", f"among {count}, at {positions}", worst, runs=len(done),
                                 companions=count))
        loaded_answers = [r.output for r in done]
    unique = len({_answer_key(a) for a in loaded_answers})
    worst = max((answer_difference(loaded_answers[0], a) for a in loaded_answers[1:]), key=_severity,
                default=(False, None, 0.0, None))
    rows.append(_serving_row("repeat", f"{unique} unique of {len(loaded_answers)} under load", worst,
                             runs=len(loaded_answers), companions=max(slots, 2)))
    on = engine.with_prefix_cache()
    tail = needle.companion_prompts(random.Random(seed), 1, vocab_size=engine.vocab_size(),
                                    excluded=set(engine.eos_token_ids()), max_new_tokens=1)[0].ids[:8]
    # the whole prompt as the prefix of another: the longest a cache can reuse
    on.run([engine.as_served(needle_ids + tail)], config, _one_row(config, seed), False)  # fills the cache
    after = on.run([needle_ids], config, _one_row(config, seed), False)
    rows.append(_serving_row("prefix-cache", f"after its prompt+{len(tail)}, cache on",
                             answer_difference(reference, after), runs=1))
    server = str((loaded.describe or {}).get("server", loaded.spec))
    return ServingAudit(text if text is not None else str(loaded.tokenizer.decode(needle_ids)), server,
                        tuple(rows), seed, prefix_cache_pinned=engine.resets_prefix)


CHECKED_PROMPT = "Q: What is the capital of Japan? A:"  # the request llm_server_checks audits
CHECKED_TOKENS = 4


def verify_serving(loaded: LoadedModel, *, seed: int, rounds: int = SERVING_ROUNDS) -> ServingAudit:
    """``llm_server_checks``: the serving audit of :data:`CHECKED_PROMPT` on ``loaded``'s server, and
    what it verified recorded in the fingerprint of every golden recorded with it
    (``serving_verified``)."""
    __tracebackhide__ = True
    engine = loaded.engine
    ids = [int(t) for t in loaded.tokenizer(CHECKED_PROMPT)["input_ids"]]
    config = resolve_generation_config({}, max_new_tokens=CHECKED_TOKENS,
                                       eos_token_ids=engine.eos_token_ids(),
                                       pad_token_id=loaded.tokenizer.pad_token_id or 0, seed=seed)
    found = serving_audit(loaded, ids, config, rounds=rounds, seed=seed, text=CHECKED_PROMPT)
    loaded.describe = {**(loaded.describe or {}), "serving_verified": found.capability()}
    loaded.static_fingerprint = None  # computed again, with the field
    return found


Difference = tuple[bool, int | None, float, float | None]  # changed, first step, max |Δlogprob|, margin


def answer_difference(reference: Chunk, other: Chunk) -> Difference:
    """Two one-row answers: tokens changed (from which step), the largest logprob difference of the
    top-k tokens both list over the steps before they part, and the reference's margin there."""
    a, b = reference.tokens[0], other.tokens[0]
    first = first_token_divergence(a, b)
    steps_a, steps_b = reference.steps[0], other.steps[0]
    upto = min(len(steps_a.top), len(steps_b.top))
    upto = upto if first is None else min(first + 1, upto)
    delta = 0.0
    for step in range(upto):
        theirs = dict(steps_b.top[step])
        delta = max([delta, *(abs(value - theirs[token]) for token, value in steps_a.top[step]
                              if token in theirs)])
    margin = steps_a.margins[first] if first is not None and first < len(steps_a.margins) else None
    return first is not None, first, delta, margin


def _severity(found: Difference) -> tuple[bool, float]:
    return found[0], found[2]


def _answer_key(chunk: Chunk) -> tuple[tuple[int, ...], tuple[tuple[tuple[int, float], ...], ...]]:
    return tuple(chunk.tokens[0]), tuple(chunk.steps[0].top)


def _serving_row(source: str, change: str, found: Difference, *, runs: int,
                 companions: int = 0) -> ServingRow:
    changed, first, delta, margin = found
    return ServingRow(source, change, changed, first, delta, margin=margin if changed else None, runs=runs,
                      companions=companions)


def _one_row(config: DecodingConfig, seed: int) -> GenerationSettings:
    return GenerationSettings(batch_shape=BatchShape(1, 1), max_new_tokens=config.max_new_tokens, seed=seed)


def decode_vs_prefill(llm_model: LLMModel, generation: Generation, *,
                      tolerance: float | None = None) -> DecodeVsPrefill:
    """Score ``generation``'s prompt and generated tokens (teacher-forced, one forward) and compare each
    generated step with the score's position: the logit hashes (bitwise is asked under batch-invariant
    kernels) and the generated token's logprob and the top-k logprobs both name (within ``tolerance``
    otherwise: the dtype's default ``atol``). A sampled generation's token may be outside its step's
    top-k: there only the shared top-k are compared."""
    from pytest_llmdeterminism.judge.tolerance import DEFAULT_ATOL

    if not generation.token_ids:
        raise ConfigurationError("decode_vs_prefill(generation)", generation.text,
                                 "the generation has no tokens to score; generate at least one")
    score = llm_model.score(list(generation.prompt_token_ids), list(generation.token_ids))
    identical = sum(a == b for a, b in zip(generation.step_hashes, score.step_hashes, strict=True))
    first = next((t for t, (a, b) in enumerate(zip(generation.step_hashes, score.step_hashes, strict=True))
                  if a != b), None)
    delta = 0.0
    for step, token in enumerate(generation.token_ids):
        decoded, prefilled = dict(generation.top_logprobs[step]), dict(score.top_logprobs[step])
        if token in decoded:
            delta = max(delta, abs(decoded[token] - score.logprobs[step]))
        delta = max([delta, *(abs(decoded[i] - prefilled[i]) for i in decoded.keys() & prefilled.keys())])
    fingerprint = llm_model.fingerprint
    atol = tolerance if tolerance is not None else DEFAULT_ATOL.get(fingerprint.get("dtype", "float32"),
                                                                    DEFAULT_ATOL["float32"])
    return DecodeVsPrefill(generation.prompt, len(generation.token_ids), identical, first, delta,
                           bitwise=bool(fingerprint.get("batch_invariant")), tolerance=atol)


def assert_decode_matches_prefill(llm_model: LLMModel, generation: Generation, *,
                                  tolerance: float | None = None) -> DecodeVsPrefill:
    """The opt-in decode-equals-prefill check: score ``generation``'s own tokens (teacher-forced, one
    forward) and raise :class:`DecodePrefillMismatchError` where a step's generated-token logprob or a
    shared top-k logprob differs by more than ``tolerance`` (the dtype's default ``atol``). Bitwise
    equality is reported, not asked: on CPU decode runs other linear kernels than prefill and its
    attention reduces over another length, even under batch-invariant kernels (measured: 4e-6 on the
    tiny model, 2e-5 on SmolLM2). Returns the comparison (``lines()`` says how many steps were
    bitwise identical)."""
    __tracebackhide__ = True
    found = decode_vs_prefill(llm_model, generation, tolerance=tolerance)
    if not found.within_tolerance:
        raise DecodePrefillMismatchError(found)
    return found
