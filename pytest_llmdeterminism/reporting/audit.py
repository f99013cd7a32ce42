"""The audit's report (``model/audit.py`` measures it): a row per source of change, as data (JSON for
the run's records) and as the table a failure and the run's summary show."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pytest_llmdeterminism.sampling import settings_text

__all__ = ["CHUNKED_PREFILL", "DECODE_VS_PREFILL", "EXPLANATIONS", "PREFIX_REUSE", "SERVING_EXPLANATIONS",
           "SPECULATIVE", "AuditReport", "AuditRow", "DecodeVsPrefill", "ServingAudit", "ServingRow"]

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
    "chunked-prefill": "a prefill in chunks (a serving engine's chunked prefill, or one position at a time) "
                       "computes a position otherwise than one forward: its attention or linears depend on "
                       "the phase (the phase-invariant kernels' do not: portable numerics' batch-invariant "
                       "ones on x86-64, for models they run)",
    "prefix-reuse": "a continuation on a prefix's KV cache computed inside another request computes "
                    "otherwise than one fresh forward: a prefix cache changes results (the phase-invariant "
                    "kernels' do not: portable numerics' batch-invariant ones on x86-64, for models they "
                    "run)",
    "speculative": "speculative decoding (drafts verified by one forward of k + 1 positions) computed a "
                   "step otherwise than decoding it alone: the verify pass's attention or linears depend "
                   "on the phase, so speculation changes results here (on the phase-invariant kernels it "
                   "cannot: portable numerics' batch-invariant ones on x86-64, for models they run)",
}
CHUNKED_PREFILL, PREFIX_REUSE, SPECULATIVE = "chunked-prefill", "prefix-reuse", "speculative"


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
        # columns as wide as their longest entry (decode-vs-prefill, chunked-prefill and their changes)
        source = max([12, *(len(row.source) + 2 for row in self.rows)])
        width = max([26, *(len(row.change) + 2 for row in self.rows if row.ran)])
        table = [f"  {'source':<{source}}{'change':<{width}}{'tokens':<16}{'max |Δlogit|':<14}what it means"]
        for row in self.rows:
            if not row.ran:
                tokens, delta, meaning = "-", "-", "not run: " + row.change
                change = ""
            else:
                tokens = f"changed at {row.first_step}" if row.tokens_changed else "same"
                delta = f"{row.max_logit_delta:.2g}" if row.max_logit_delta else "0"
                meaning = EXPLANATIONS[row.source] if row.moved else "no effect"
                if row.source in (CHUNKED_PREFILL, PREFIX_REUSE) and row.first_step is not None:
                    meaning += (f" (at position {row.first_step}, where the top two logprobs were "
                                f"{row.draw_margin:.2g} apart)")
                elif row.source == SPECULATIVE and row.draw_margin is not None:
                    meaning += (f" (at step {row.first_step}, where the top two logprobs were "
                                f"{row.draw_margin:.2g} apart)")
                elif row.draw_margin is not None and row.source != "seed":
                    meaning += (f" (the draw at step {row.first_step} was {row.draw_margin:.2g} "
                                "from its runner-up)")
                change = row.change
            table.append(f"  {row.source:<{source}}{change:<{width}}{tokens:<16}{delta:<14}{meaning}")
        return [head, *table]

    def to_json(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "batch_shape": self.batch_shape, "unique": self.unique,
                "repeats": self.repeats, "rows": [row.to_json() for row in self.rows],
                "sampling": self.sampling}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AuditReport:
        return cls(data["prompt"], data["batch_shape"], tuple(AuditRow(**r) for r in data["rows"]),
                   data["unique"], data["repeats"], data.get("sampling", {}))


# --- the serving audit (model/serving_audit.py): a server engine's request as it is served ---

SERVING_EXPLANATIONS = {
    "concurrent": "other requests in flight changed the answer: the server batches requests together "
                  "and its kernels are not batch-invariant; run it with one slot (llama.cpp: --parallel 1) "
                  "or in a batch-invariant mode (vLLM: VLLM_BATCH_INVARIANT=1), or test at concurrency 1",
    "repeat": "the same request under the same load gave different answers: the answer depends on how "
              "the server happened to schedule it; see the concurrent row",
    "prefix-cache": "a cached prefix changed the answer: keep the server's prefix cache out of tested "
                    "requests (llama.cpp: cache_prompt=false or --no-cache-prompt; vLLM: "
                    "--no-enable-prefix-caching), as the plugin's requests do",
}


@dataclass(frozen=True)
class ServingRow:
    """One serving condition against the request alone: the answer identical, drifted (the tokens
    the same, logprobs moved by ``max_logprob_delta``) or changed from ``first_step``, where the
    reference's margin between its top two tokens was ``margin``."""

    source: str  # "concurrent", "repeat", "prefix-cache"
    change: str  # what was varied, e.g. "among 4 companions, 3 rounds"
    tokens_changed: bool
    first_step: int | None
    max_logprob_delta: float  # over the steps before the tokens part ways, of the top-k both share
    margin: float | None = None  # the reference's top-2 margin at first_step
    ran: bool = True
    runs: int = 1  # answers compared (rounds)
    companions: int = 0  # concurrent requests beside it

    @property
    def verdict(self) -> str:
        if not self.ran:
            return "not run"
        if self.tokens_changed:
            return "changed"
        return "drift" if self.max_logprob_delta > 0 else "identical"

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ServingAudit:
    """What the serving audit found for one request on a server: a row per condition, and the seed
    that drew its companions (the same seed sends the same ones again)."""

    prompt: str
    server: str
    rows: tuple[ServingRow, ...]
    seed: int
    prefix_cache_pinned: bool = True  # the plugin's requests keep the prefix cache out
    # a sampled request: the rows that verified the server's seeded sampling (model/served_sampling.py)
    sampling: tuple[str, ...] = ()

    def invariant(self, source: str) -> bool | None:
        """Every row of ``source`` identical (None where none ran)."""
        ran = [row for row in self.rows if row.source == source and row.ran]
        return all(row.verdict == "identical" for row in ran) if ran else None

    def capability(self) -> dict[str, str]:
        """What was verified, as a golden's fingerprint records it (``serving_verified``)."""
        concurrent = [row for row in self.rows if row.source == "concurrent" and row.ran]
        verified: dict[str, str] = {}
        if concurrent:
            moved = [row for row in concurrent if row.verdict != "identical"]
            most = max(concurrent, key=lambda row: row.companions)
            verified["concurrency"] = (
                f"invariant at {most.companions} ({most.runs} rounds)" if not moved else
                f"{moved[0].verdict} at {moved[0].companions} ({moved[0].runs} rounds)")
        prefix = [row for row in self.rows if row.source == "prefix-cache" and row.ran]
        pinned = "off" if self.prefix_cache_pinned else "cache_prompt=false only (reset_prefix=0)"
        if prefix:
            verified["prefix_cache"] = f"{pinned}; with it on: " + (
                "invariant" if prefix[0].verdict == "identical" else prefix[0].verdict)
        else:
            verified["prefix_cache"] = pinned
        return verified

    def lines(self) -> list[str]:
        head = f"serving audit of {self.prompt!r} on {self.server} (companions drawn from seed {self.seed}):"
        table = [f"  {'source':<14}{'change':<34}{'answer':<20}{'max |Δlogprob|':<16}what it means"]
        for row in self.rows:
            if not row.ran:
                table.append(f"  {row.source:<14}{'':<34}{'-':<20}{'-':<16}not run: {row.change}")
                continue
            answer = (f"changed at {row.first_step}" if row.tokens_changed else row.verdict)
            delta = f"{row.max_logprob_delta:.2g}" if row.max_logprob_delta else "0"
            meaning = SERVING_EXPLANATIONS[row.source] if row.verdict != "identical" else "no effect"
            if row.tokens_changed and row.margin is not None:
                meaning = (f"the tokens parted at step {row.first_step}, where the request alone had a "
                           f"margin of {row.margin:.2g} between its top two: {meaning}")
            table.append(f"  {row.source:<14}{row.change:<34}{answer:<20}{delta:<16}{meaning}")
        sampled = [f"  seeded sampling, verified once for the session: {row}" for row in self.sampling]
        return [head, *table, *sampled]

    def to_json(self) -> dict[str, Any]:
        return {"kind": "serving", "prompt": self.prompt, "server": self.server, "seed": self.seed,
                "prefix_cache_pinned": self.prefix_cache_pinned,
                "rows": [row.to_json() for row in self.rows], "sampling": list(self.sampling)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServingAudit:
        return cls(data["prompt"], data["server"], tuple(ServingRow(**r) for r in data["rows"]), data["seed"],
                   data.get("prefix_cache_pinned", True), tuple(data.get("sampling", ())))


# -- decode vs prefill (issue 42): a generation's steps against the score of its own tokens ------------

DECODE_VS_PREFILL = "decode-vs-prefill"
DECODE_VS_PREFILL_MEANS = (
    "a generation's steps (prefill, then one token at a time over the KV cache) and the score of the "
    "same tokens (one forward over the whole sequence) took other kernels or reduction lengths: a "
    "score golden and a generation golden of the same tokens differ in these bits (portable numerics' "
    "batch-invariant kernels on x86-64 compute a position the same way in both)")


@dataclass(frozen=True)
class DecodeVsPrefill:
    """A generation's steps compared with the teacher-forced score of its own tokens: how many steps'
    logit hashes are identical, the first that is not, and the largest difference of the generated
    token's logprob (and of the top-k logprobs both name). ``bitwise`` is asked under phase-invariant
    kernels (``kernels.PHASE_INVARIANT``); otherwise the steps must agree within ``tolerance``."""

    prompt: str
    steps: int
    identical: int  # steps whose logit hash the score's position shares
    first_different: int | None
    max_logprob_delta: float
    bitwise: bool  # what is asked: phase-invariant kernels
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.identical == self.steps if self.bitwise else self.within_tolerance

    @property
    def within_tolerance(self) -> bool:
        """The generated token's logprob and the shared top-k within ``tolerance`` at every step: what
        :func:`~pytest_llmdeterminism.assert_decode_matches_prefill` asks where the kernels are not
        phase-invariant (decode and prefill there take other linear kernels, or attention reduced
        over another length)."""
        return self.max_logprob_delta <= self.tolerance

    def row(self) -> AuditRow:
        """As a row of the audit's table (``max_logit_delta`` holds the logprob difference)."""
        change = f"{self.steps} steps, {self.identical} bitwise"
        return AuditRow(DECODE_VS_PREFILL, change, False, self.first_different, self.max_logprob_delta)

    def lines(self) -> list[str]:
        asked = "bitwise (phase-invariant kernels)" if self.bitwise else f"within {self.tolerance:g}"
        verdict = "holds" if self.ok else "does NOT hold"
        if self.bitwise and not self.ok:
            verdict += f", within {self.tolerance:g} {'holds' if self.within_tolerance else 'does NOT hold'}"
        first = "" if self.first_different is None else f", first different at step {self.first_different}"
        return [f"{DECODE_VS_PREFILL} of {self.prompt!r}: {asked} {verdict}: {self.identical} of "
                f"{self.steps} steps bitwise identical{first}; largest |Δlogprob| "
                f"{self.max_logprob_delta:.3g}",
                *([] if self.ok else [f"  {DECODE_VS_PREFILL_MEANS}"])]

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "ok": self.ok, "within_tolerance": self.within_tolerance}


EXPLANATIONS[DECODE_VS_PREFILL] = DECODE_VS_PREFILL_MEANS
