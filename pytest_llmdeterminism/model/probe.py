"""The batch-invariance probe: does a prompt give the same bits at the first and the last row of a
batch, among other companions? Everything the fixed shape promises rests on it, so it runs once per
loaded model, shape and thread count, before the first generation that shares a batch. Under
batch-invariant kernels (the default wherever they run; ``llm_batch_invariant``) goldens do not carry
the shape, so the probe also runs the prompt in another shape: alone when the batch has several rows,
else in a batch of two."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.compute import experts
from pytest_llmdeterminism.decoding import DecodingConfig, resolve_generation_config
from pytest_llmdeterminism.errors import BatchInvarianceProbeError, pasteable
from pytest_llmdeterminism.generation import Generation
from pytest_llmdeterminism.judge.compare import Comparison, Verdict, compare
from pytest_llmdeterminism.model.fingerprint import fingerprint
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

if TYPE_CHECKING:
    from pytest_llmdeterminism.engines.loaded import LoadedModel

PROBE_STEPS = 3  # tokens the batch-invariance probe generates per row
# Runs one chunk of ``(prompt, ids)`` rows at the model's shape: a Generation per row.
RunChunk = Callable[[list[tuple[str, list[int]]], DecodingConfig], list[Generation]]
# Another shape and what runs a chunk there: the cross-shape half of the probe.
OtherShape = tuple[BatchShape, RunChunk]


def verify_batch_invariance(loaded: LoadedModel, settings: GenerationSettings, prompt: str, ids: list[int],
                            run_chunk: RunChunk, other: OtherShape | None = None) -> str:
    """What the probe found for ``prompt`` at ``settings``' shape (a line for the run's summary),
    probed once per loaded model, shape and thread count; a variant raises
    :class:`BatchInvarianceProbeError` naming what restores invariance."""
    __tracebackhide__ = True
    import torch

    key = f"{settings.batch_shape}@{torch.get_num_threads()}"  # natively, threads decide it too
    probed = loaded.probed
    outcome = probed.get(key) or _probe(loaded, settings, prompt, ids, run_chunk, other)
    if not (isinstance(outcome, BatchInvarianceProbeError) and outcome.nondeterministic):
        probed[key] = outcome  # randomness may come from this test alone (a hook): probe again next time
    if isinstance(outcome, BatchInvarianceProbeError):
        raise outcome.with_traceback(None)  # one error object for many tests: no earlier test's frames
    return str(outcome)


def _probe(loaded: LoadedModel, settings: GenerationSettings, prompt: str, ids: list[int],
           run_chunk: RunChunk, other: OtherShape | None) -> str | BatchInvarianceProbeError:
    shape = settings.batch_shape
    if shape.rows == 1 and other is None:
        return f"batch invariance: nothing to verify at {shape} (one row per batch)"
    config = resolve_generation_config({}, max_new_tokens=PROBE_STEPS, eos_token_ids=[],
                                       pad_token_id=loaded.tokenizer.pad_token_id)
    rows_needed = max(shape.rows, 2 if other is None else other[0].rows)
    others = companions(ids, shape.length, 2 * (rows_needed - 1), loaded.engine.vocab_size())
    first_batch = [(prompt, ids)] + [("", c) for c in others[: shape.rows - 1]]
    first = run_chunk(first_batch, config)[0]
    # (what was compared, its comparison, the other shape where it is a shape, not a row, that differed)
    checks: list[tuple[str, Comparison, str | None]] = []
    if shape.rows > 1:
        last = run_chunk([("", c) for c in others[shape.rows - 1:]] + [(prompt, ids)], config)[-1]
        checks.append((f"row 0 vs row {shape.rows - 1}", compare(first, last), None))
    if other is not None:
        other_shape, run_other = other
        there = run_other([("", c) for c in others[: other_shape.rows - 1]] + [(prompt, ids)], config)[-1]
        shown = other_shape.running(len(ids))
        checks.append((f"and against {shown}", compare(first, there), str(shown)))
    failed = next((check for check in checks if check[1].verdict is not Verdict.IDENTICAL), None)
    if failed is None:
        return (f"batch invariance: verified at {shape} ({', '.join(what for what, _, _ in checks)}, "
                f"{PROBE_STEPS} steps)")
    repeat = compare(first, run_chunk(first_batch, config)[0])
    differing = failed[1] if repeat.verdict is Verdict.IDENTICAL else repeat
    step = differing.first_hash_step if differing.first_hash_step is not None else differing.steps_compared
    return BatchInvarianceProbeError(prompt, str(shape), step,
                                     *_advice(loaded, settings, nondeterministic=differing is repeat),
                                     nondeterministic=differing is repeat,
                                     other_shape=failed[2] if differing is not repeat else None)


_EXPERTS_CAUSE = ("a mixture of experts runs each expert on the tokens routed to it, so the size of its "
                  "products, and their bits, depend on the other rows")


def _advice(loaded: LoadedModel, settings: GenerationSettings, *,
            nondeterministic: bool = False) -> tuple[str, str]:
    """What was in force, and what restores invariance there (a row that moved beside other rows, on a
    model with layers the kernels do not route: those layers)."""
    import torch

    fingerprint_now = fingerprint(loaded)
    device = str(fingerprint_now["device_class"])
    in_force = (f"device {loaded.device}, {loaded.dtype}, attention "
                f"{fingerprint_now['attention_implementation']!r}")
    one_row = pasteable("llm_batch_shape", f"1x{settings.batch_shape.length}")
    if device != "cpu":
        return in_force, (f"run one prompt per batch: {one_row} (or give the model eager attention, "
                          "attn_implementation=\"eager\" in its config)")
    in_force += f", cpu numerics {loaded.cpu_numerics!r}, {torch.get_num_threads()} threads"
    kernels: Any = getattr(loaded.engine, "kernels", None)
    unrouted: tuple[str, ...] = getattr(kernels, "unrouted", ())
    if unrouted and not nondeterministic and loaded.cpu_numerics in ("portable", "compatible"):
        how = (_EXPERTS_CAUSE if any(name.endswith("Experts") for name in unrouted) else
               "their products may compute a row otherwise beside other rows")
        return in_force, (f"one prompt per batch: {one_row}. The cause is the model, not this machine: "
                          f"{kernels.not_invariant.removeprefix('its ')}, and {how}")
    # a mixture of experts the batch-invariant kernels would route (float32 here), on other kernels
    experts_routed = loaded.cpu_numerics in ("portable", "compatible") and loaded.dtype == "float32" \
        and kernels is not None and not kernels.batch_invariant \
        and any("Expert" in type(layer).__name__ for layer in experts.linear_modules(loaded.model.modules()))
    if experts_routed and not nondeterministic:
        kernels_that_route = pasteable("llm_batch_invariant", "true")
        return in_force, (f"the batch-invariant kernels ({kernels_that_route}), which route a mixture "
                          f"of experts' products, or one prompt per batch: {one_row}. The cause is the "
                          f"model, not this machine: {_EXPERTS_CAUSE} on these kernels")
    if loaded.cpu_numerics not in ("portable", "compatible"):
        return in_force, (f"{pasteable('llm_cpu_numerics', 'portable')}, the default: rows stay invariant at "
                          "any thread count; or one thread (OMP_NUM_THREADS=1)")
    return in_force, (f"one thread (OMP_NUM_THREADS=1), or one prompt per batch: {one_row}; please report "
                      "this machine (lscpu) as a bug")


def companions(ids: list[int], length: int, count: int, vocab_size: int) -> list[list[int]]:
    """``count`` token sequences unlike ``ids`` (other tokens, and lengths spread evenly over
    ``1 .. length - 1``), so the rows beside the probed prompt carry other inputs and other padding."""
    sequences = []
    for index in range(count):
        size = 1 + (index + 1) * max(length - 2, 0) // (count + 1)
        sequences.append([(ids[j % len(ids)] + 7 * (index + 1) + j) % vocab_size for j in range(size)])
    return sequences
