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
- ``seed``: for a sampled generation (``do_sample=True``), another seed.

A sampled generation is audited under its own sampling settings and seed: its noise is keyed by
its own prompt, so companions, shape and threads move it only through the logits. Where a row's
tokens changed, the row keeps the draw margin the first changed step had (how near a tie the draw
was); the seed row shows the seed is part of the sample's identity.

Only the audit needs each step's raw logits (a view's ``on_chunk`` keeps them) and a copy of the
weights in another dtype; both live here, not in the model everyone else uses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.compare import first_token_divergence
from pytest_llmdeterminism.engines.inputs import fits, is_token_ids
from pytest_llmdeterminism.errors import ConfigurationError, LLMDeterminismError
from pytest_llmdeterminism.generation import Generation
from pytest_llmdeterminism.sampling import MAX_SEED, settings_text
from pytest_llmdeterminism.shape import BatchShape

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_llmdeterminism.engines.capture import Chunk
    from pytest_llmdeterminism.engines.loaded import LoadedModel
    from pytest_llmdeterminism.engines.model import LLMModel

DEFAULT_REPEATS = 5
COMPANIONS = ("Hello there, how are you today?", "def add(a, b):", "1 2 3", "The weather today is",
              "Once upon a time, in a land far away,", "Q:")
EXPLANATIONS = {
    "repeat": "same input, same process, different result: a nondeterministic kernel or unseeded "
              "randomness (dropout, sampling); keep torch.use_deterministic_algorithms on and the model in "
              "eval()",
    "batch": "other prompts in the batch changed the numerics: run every generation at one fixed shape",
    "batch_size": "batch size changes numerics: keep llm_batch_shape fixed (B is part of a golden's "
                  "identity)",
    "padding": "padded length changes numerics: keep L in llm_batch_shape fixed",
    "cache": "KV cache on/off takes another numeric path: keep use_cache pinned",
    "threads": "thread count changes CPU reduction order: pin torch.set_num_threads / OMP_NUM_THREADS",
    "dtype": "dtype changes rounding: keep llm_dtype fixed and record one golden variant per dtype",
    "seed": "another seed draws another sample: keep seed= (or @deterministic(seed=...)) fixed; it is "
            "part of a sampled golden's identity",
}


class NondeterminismError(LLMDeterminismError, AssertionError):
    """Repeated identical calls gave different results. ``audit`` holds the full report."""

    def __init__(self, audit: AuditReport) -> None:
        self.audit = audit
        super().__init__("NONDETERMINISTIC: " + "\n".join(audit.lines()))


@dataclass(frozen=True)
class AuditRow:
    source: str
    change: str  # what was varied, e.g. "4 -> 1"
    tokens_changed: bool
    first_step: int | None  # first step whose token differs
    max_logit_delta: float  # max |Δlogit| over the steps before the tokens part ways
    ran: bool = True  # False when the change does not apply (e.g. no companions at B=1)
    # sampled generations: the draw margin of this audit's own result at ``first_step`` (how near a
    # tie the draw was where the tokens parted); None for greedy ones or unchanged tokens
    draw_margin: float | None = None

    @property
    def moved(self) -> bool:
        return self.ran and (self.tokens_changed or self.max_logit_delta > 0)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class AuditReport:
    """What :func:`audit` found for one prompt: a row per source of change, and how many distinct
    results ``repeats`` identical calls gave (more than one is nondeterministic)."""

    prompt: str
    batch_shape: str
    rows: tuple[AuditRow, ...]
    unique: int
    repeats: int
    sampling: dict[str, Any] = dataclasses.field(default_factory=dict)  # a sampled one's settings

    @property
    def nondeterministic(self) -> bool:
        return self.unique > 1

    def lines(self) -> list[str]:
        drawn = f", {settings_text(self.sampling)}" if self.sampling else ""
        head = f"audit of {self.prompt!r} at {self.batch_shape}{drawn}:"
        table = [f"  {'source':<12}{'change':<26}{'tokens':<16}{'max |Δlogit|':<14}what it means"]
        for row in self.rows:
            if not row.ran:
                tokens, delta, meaning = "-", "-", "not run: " + row.change
                change = ""
            else:
                tokens = f"changed at {row.first_step}" if row.tokens_changed else "same"
                delta = f"{row.max_logit_delta:.2g}" if row.max_logit_delta else "0"
                meaning = EXPLANATIONS[row.source] if row.moved else "no effect"
                if row.draw_margin is not None and row.source != "seed":
                    meaning += (f" (the draw at step {row.first_step} was {row.draw_margin:.2g} "
                                "from its runner-up)")
                change = row.change
            table.append(f"  {row.source:<12}{change:<26}{tokens:<16}{delta:<14}{meaning}")
        return [head, *table]

    def to_json(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "batch_shape": self.batch_shape, "unique": self.unique,
                "repeats": self.repeats, "rows": [row.to_json() for row in self.rows],
                "sampling": self.sampling}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AuditReport:
        return cls(data["prompt"], data["batch_shape"], tuple(AuditRow(**r) for r in data["rows"]),
                   data["unique"], data["repeats"], data.get("sampling", {}))


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
            **extra: Any) -> tuple[Generation, list[Any]]:
        return view.run(batch, row, **{**overrides, **extra})

    prompt = ids  # every run below feeds exactly these ids

    runs = [run(probe, [prompt], 0) for _ in range(max(repeats, 1))]
    base = runs[0]
    unique = len({(g.token_ids, g.logit_hashes) for g, _ in runs})
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
    return AuditReport(text, str(shape), tuple(rows), unique, len(runs), sampling)


def _row(source: str, change: str, base: tuple[Generation, list[Any]],
         other: tuple[Generation, list[Any]]) -> AuditRow:
    changed, first, delta = _difference(base, other)
    margins = base[0].draw_margins
    margin = margins[first] if first is not None and first < len(margins) else None
    return AuditRow(source, change, changed, first, delta, draw_margin=margin)


def _difference(a: tuple[Generation, list[Any]],
                b: tuple[Generation, list[Any]]) -> tuple[bool, int | None, float]:
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
        self._logits: list[Any] = []
        settings = dataclasses.replace(llm_model.settings, **changes)
        self._view = llm_model.view(loaded=loaded, settings=settings, on_chunk=self._keep)

    def _keep(self, out: Chunk, records: list[Generation]) -> None:
        self._logits += [out.logits[row][: len(record.token_ids)] for row, record in enumerate(records)]

    def run(self, batch: Sequence[list[int]], row: int, **overrides: Any) -> tuple[Generation, list[Any]]:
        """Row ``row`` of a call on ``batch`` (token ids), and its steps' raw logits."""
        self._logits = []
        results = self._view.generate(token_ids=list(batch), **overrides)
        return results[row], self._logits[row]


def _in_dtype(loaded: LoadedModel, dtype: str) -> LoadedModel:
    """The same weights cast to ``dtype``: a copy, made once per loaded model."""
    import copy

    import torch

    from pytest_llmdeterminism.engines.hf import HFEngine

    key = f"dtype-copy:{dtype}"
    if key not in loaded.cache:
        engine = loaded.engine
        assert isinstance(engine, HFEngine)  # the audit runs on transformers only: generate() refuses others
        model = copy.deepcopy(engine.model).to(getattr(torch, dtype))
        copied_engine = HFEngine(model, engine.tokenizer, engine.device,
                                 linears=engine.linears, chain=engine.chain)
        loaded.cache[key] = dataclasses.replace(loaded, model=model, dtype=dtype, cache={},
                                                engine=copied_engine)
    copied: LoadedModel = loaded.cache[key]
    return copied


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
        for result in results:
            own = {**overrides, "seed": result.sampling["seed"]} if result.sampling else overrides
            found = audit(llm, list(result.prompt_token_ids), repeats=repeats, dtype=dtype, **own)
            found = dataclasses.replace(found, prompt=result.prompt)  # as the test wrote it
            record(found.to_json())
            if found.nondeterministic:
                raise NondeterminismError(found)

    return after_generate
