"""``llm-golden eval-diff A B``: two runs of one eval, item by item, with the paired gate
(:mod:`pytest_llmdeterminism.judge.eval_gate`). A run is an eval golden file (or a candidate) or an
lm-evaluation-harness samples file."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pytest_llmdeterminism.errors import LLMDeterminismError
from pytest_llmdeterminism.generation import Evaluation, best_two
from pytest_llmdeterminism.judge import eval_gate
from pytest_llmdeterminism.judge.eval_gate import EvalComparison, EvalMismatch, Gate, Outcome

SUMMARY = "two runs of an eval, item by item: flips, near ties, exact McNemar test, ALLOW/REJECT/INCONCLUSIVE"
HELP = """\
Compare two runs of the same eval item by item: A the earlier (the reference), B the later. Each is
a golden file holding an eval golden (`golden_tokens.check(llm_model.evaluate(items))`; a candidate
written by --llm-golden-artifacts too; --key names the golden where a file holds several), or an
lm-evaluation-harness samples file (`lm_eval ... --log_samples` writes samples_<task>_<date>.jsonl,
one line per document). Items are matched by id (lm-eval's doc_id; their prompt's hash, or
lm-eval's doc_hash, must agree where both have one).

Prints the accuracy before and after, the items that flipped (right to wrong first, the surest
first) with the margin of the decision in each run, the exact McNemar p-value, the churn and the
minimum detectable effect at this eval's size, then the gate:

  ALLOW         no item flipped, every flip sat at a near tie (margin below --tie-margin in A), or
                the accuracy rose significantly
  REJECT        the accuracy fell significantly (p < --alpha)
  INCONCLUSIVE  confident flips whose net change this eval cannot resolve; says how many items would

A multiple-choice item's margin is its best choice's log-likelihood minus the runner-up's (lm-eval's
filtered_resps: one [loglikelihood, is_greedy] pair per choice, numbers written as strings
accepted); with --metric acc_norm, each divided by its continuation's length in characters, as
lm-eval does. A generative item records no margin: its flips are "unclassified" and never a near tie.

--json prints one object: gate, reason, p_value, mde, churn, items, items_needed, alpha, tie_margin,
accuracy {before, after}, flips [{id, direction, margin_before, margin_after, near_tie}].

exit status: 0 ALLOW; 1 REJECT or INCONCLUSIVE; 2 a usage error, an unreadable file, a file that is
not a samples file, or two runs that do not hold the same items (named)."""

_MAX_BYTES = 1 << 30
_SHOWN_FLIPS = 40
_METRICS = ("acc", "exact_match")  # the default metric: the first a samples line holds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("before", type=Path, metavar="A", help="the earlier run (the reference)")
    parser.add_argument("after", type=Path, metavar="B", help="the later run, of the same items")
    parser.add_argument("--json", action="store_true", help="print the analysis as one JSON object")
    parser.add_argument("--alpha", type=_probability, default=eval_gate.DEFAULT_ALPHA,
                        help="the test's level (default 0.05)")
    parser.add_argument("--tie-margin", type=_margin, default=eval_gate.DEFAULT_EVAL_TIE_MARGIN,
                        help="a flip whose margin in A is below this sat at a near tie (default 0.1)")
    parser.add_argument("--metric", help="the per-item 0/1 metric of the samples (default: acc, else "
                                         "exact_match)")
    parser.add_argument("--filter", dest="filter_name", metavar="NAME",
                        help="the lm-eval filter whose lines to read, where a file holds several")
    parser.add_argument("--key", metavar="KEY", help="the eval golden to read, where a golden file holds "
                                                     "several (its test key, as `llm-golden show` prints it)")


def _probability(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a probability strictly between 0 and 1")
    return value


def _margin(text: str) -> float:
    value = float(text)
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite margin of 0 or more")
    return value


def run(args: argparse.Namespace) -> int:
    try:
        runs = [read_run(path, metric=args.metric, filter_name=args.filter_name, key=args.key)
                for path in (args.before, args.after)]
        result = eval_gate.compare_evals(*runs, alpha=args.alpha, tie_margin=args.tie_margin)
    except (SamplesError, EvalMismatch) as error:
        print(f"llm-golden eval-diff: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(as_json(result), indent=2))
    else:
        for line in report_lines(result, str(args.before), str(args.after)):
            print(line)
    return 0 if result.gate is Gate.ALLOW else 1


# ---- reading a run: an eval golden file, or an lm-evaluation-harness samples file -----------------------


class SamplesError(LLMDeterminismError, ValueError):
    """A file that cannot be read as a run of an eval: the message names the file, the line and the fix."""


def read_run(path: Path, *, metric: str | None = None, filter_name: str | None = None,
             key: str | None = None) -> list[Outcome]:
    """The items of ``path``: the eval golden of a golden file (a JSON object with ``goldens``), else
    the lines of an lm-eval samples file. Read as untrusted input: a regular file of at most 1 GiB."""
    from pytest_llmdeterminism.goldens.store import UnreadableFileError, read_regular_file

    try:
        data = read_regular_file(path, max_bytes=_MAX_BYTES)
    except FileNotFoundError:
        raise SamplesError(f"{path}: no such file. Give the path of an eval golden file or an lm-eval "
                           f"samples file (samples_<task>_<date>.jsonl: lm_eval --log_samples).") from None
    except UnreadableFileError as error:
        raise SamplesError(f"{path} {error.reason}. Give the path of an eval golden file or an lm-eval "
                           f"samples file.") from None
    head = data[:4096].lstrip()
    if head.startswith(b"{") and b'"goldens"' in head and b'"doc_id"' not in head:
        return read_eval_golden(path, data, key=key)
    return read_samples(path, data, metric=metric, filter_name=filter_name)


def read_eval_golden(path: Path, data: bytes, *, key: str | None = None) -> list[Outcome]:
    """The items of the eval golden in the golden file ``path`` of bytes ``data`` (the one there, or
    ``key``'s)."""
    from pytest_llmdeterminism.errors import GoldenFileError
    from pytest_llmdeterminism.goldens import codec, schema

    try:
        goldens = codec.parse(path, data)
    except GoldenFileError as error:
        raise SamplesError(str(error)) from None
    found = {(name, variant): entry for name, variants in goldens.items()
             for variant, entry in variants.items()
             if getattr(entry, "kind", None) == "eval" and (key is None or name == key)}
    if len(found) != 1:
        held = sorted({name for name, variants in goldens.items()
                       for entry in variants.values() if getattr(entry, "kind", None) == "eval"})
        what = (f"holds no eval golden{f' under the key {key!r}' if key is not None else ''}" if not found
                else f"holds {len(found)} eval goldens")
        choose = (f"Name one with --key ({', '.join(held)})" if held else
                  "Give a golden file that `golden_tokens.check(llm_model.evaluate(items))` wrote")
        raise SamplesError(f"{path} {what}. {choose}.")
    evaluation = schema.from_entry(next(iter(found.values())))
    if not isinstance(evaluation, Evaluation):
        raise SamplesError(f"{path}: its eval golden did not read as an evaluation")
    return eval_gate.outcomes(evaluation)


def read_samples(path: Path, data: bytes, *, metric: str | None = None,
                 filter_name: str | None = None) -> list[Outcome]:
    """The items of the lm-eval samples file ``path`` of bytes ``data`` (one JSON object per line)."""
    lines = []
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            sample = json.loads(line)
        except ValueError:
            sample = None
        if not isinstance(sample, dict) or "doc_id" not in sample or "filtered_resps" not in sample:
            raise SamplesError(
                f"{path}:{number} is not a line of an lm-evaluation-harness samples file (a JSON object with "
                f"doc_id and filtered_resps), nor a golden file. Give the samples_<task>_<date>.jsonl that "
                f"lm_eval --log_samples writes, not its results_*.json, or an eval golden file.")
        lines.append((number, sample))
    if not lines:
        raise SamplesError(f"{path} holds no sample. Give an lm-eval samples file of the run.")
    return outcomes_of_samples(lines, source=str(path), metric=metric, filter_name=filter_name)


def outcomes_of_samples(lines: list[tuple[int, dict[str, Any]]], *, source: str, metric: str | None,
                        filter_name: str | None) -> list[Outcome]:
    """The items of parsed samples lines ``(line number, object)``: the lines of one lm-eval filter,
    each item's correctness by ``metric`` and its decision's margin where the responses carry one."""
    filters = sorted({str(sample.get("filter", "none")) for _, sample in lines})
    if filter_name is None and len(filters) > 1:
        raise SamplesError(f"{source} holds the lines of several lm-eval filters ({', '.join(filters)}). "
                           f"Choose one with --filter NAME.")
    chosen = filter_name if filter_name is not None else filters[0]
    picked = [(number, sample) for number, sample in lines if str(sample.get("filter", "none")) == chosen]
    if not picked:
        raise SamplesError(f"{source} holds no line of the filter {chosen!r} (it has {', '.join(filters)}). "
                           f"Give one of those to --filter.")
    name = metric or next((key for key in _METRICS if key in picked[0][1]), None)
    if name is None:
        raise SamplesError(f"{source}:{picked[0][0]} holds neither of the metrics {', '.join(_METRICS)}. "
                           f"Name the per-item metric to read with --metric.")
    return [_outcome(number, sample, name, source) for number, sample in picked]


def _outcome(number: int, sample: dict[str, Any], metric: str, source: str) -> Outcome:
    where = f"{source}:{number}"
    if metric not in sample:
        raise SamplesError(f"{where} has no metric {metric!r}. Name the per-item metric with --metric.")
    value = _number(sample[metric])
    if value not in (0.0, 1.0):
        raise SamplesError(f"{where}: the metric {metric!r} is {sample[metric]!r}, not a per-item 0 or 1. "
                           f"Choose a correctness metric (acc, acc_norm, exact_match) with --metric.")
    choice, margin = _decision(sample, normalized=metric == "acc_norm")
    document = sample.get("doc_hash")
    return Outcome(id=str(sample["doc_id"]), correct=value == 1.0, margin=margin, choice=choice,
                   input=document if isinstance(document, str) else None)


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _decision(sample: dict[str, Any], *, normalized: bool) -> tuple[int | str | None, float | None]:
    """The decision and its margin: for one [loglikelihood, is_greedy] pair per choice, the best
    choice's index and best minus runner-up (per character of the continuation under acc_norm, None
    without the continuations); a generated answer's text and no margin."""
    responses = sample["filtered_resps"]
    while isinstance(responses, list) and len(responses) == 1 and isinstance(responses[0], list):
        responses = responses[0]  # lm-eval's nesting of a single response
    pairs = [_number(pair[0]) if isinstance(pair, list) and len(pair) == 2 else None for pair in responses] \
        if isinstance(responses, list) else [None]
    if len(pairs) < 2 or any(ll is None for ll in pairs):
        text = responses[0] if isinstance(responses, list) and responses else responses
        return (text if isinstance(text, str) else json.dumps(text)), None
    scores = [float(ll) for ll in pairs if ll is not None]
    if normalized:
        lengths = _continuation_lengths(sample.get("arguments"), len(scores))
        if lengths is None:
            return max(range(len(scores)), key=scores.__getitem__), None
        scores = [score / length for score, length in zip(scores, lengths, strict=True)]
    return best_two(tuple(scores))


def _continuation_lengths(arguments: Any, choices: int) -> list[int] | None:
    """Each choice's continuation length in characters (lm-eval's acc_norm), from ``arguments`` as
    lm-eval writes them: ``[[context, continuation], ...]`` or ``{"gen_args_0": {"arg_0": context,
    "arg_1": continuation}, ...}``; None if they are not there."""
    if isinstance(arguments, dict):
        arguments = [list(value.values()) if isinstance(value, dict) else value
                     for value in arguments.values()]
    if not isinstance(arguments, list) or len(arguments) != choices:
        return None
    lengths = [len(pair[1]) if isinstance(pair, list) and len(pair) >= 2 and isinstance(pair[1], str) else 0
               for pair in arguments]
    return lengths if all(lengths) else None


# ---- what it prints ------------------------------------------------------------------------------------


def as_json(result: EvalComparison) -> dict[str, Any]:
    return {"gate": result.gate.value, "reason": result.reason, "p_value": result.p_value, "mde": result.mde,
            "churn": result.churn, "items": result.items, "items_needed": result.items_needed,
            "alpha": result.alpha, "tie_margin": result.tie_margin,
            "accuracy": {"before": result.accuracy[0], "after": result.accuracy[1]},
            "flips": [{"id": flip.id, "direction": flip.direction, "margin_before": flip.margin_before,
                       "margin_after": flip.margin_after, "near_tie": flip.near_tie}
                      for flip in result.flips]}


def report_lines(result: EvalComparison, before: str, after: str) -> Iterable[str]:
    before_pct, after_pct = (100 * value for value in result.accuracy)
    yield f"eval-diff: {result.items} items, {before} -> {after}"
    yield f"accuracy {before_pct:.2f} % -> {after_pct:.2f} % ({after_pct - before_pct:+.2f} points)"
    yield (f"flips: {result.right_to_wrong} right->wrong, {result.wrong_to_right} wrong->right "
           f"(churn {100 * result.churn:.1f} %); {result.near_ties} at a near tie "
           f"(margin in A below {result.tie_margin:g})")
    yield (f"exact McNemar p = {result.p_value:.3g}; minimum detectable effect {100 * result.mde:.2f} points "
           f"(alpha {result.alpha:g}, power {eval_gate.DEFAULT_POWER:g})")
    needed = (f"; resolving a change of this size takes about {result.items_needed:,} items"
              if result.items_needed is not None else "")
    yield f"gate: {result.gate.value} - {result.reason}{needed}"
    if result.flips:
        yield "flipped items (right->wrong first, the surest first):"
    for flip in result.flips[:_SHOWN_FLIPS]:
        direction = "right->wrong" if flip.direction == eval_gate.RIGHT_TO_WRONG else "wrong->right"
        kind = ("near tie" if flip.near_tie else "confident" if flip.margin_before is not None
                else "unclassified: no margin recorded")
        yield (f"  {direction}  {flip.id}  margin {_shown(flip.margin_before)} -> {_shown(flip.margin_after)}"
               f"  choice {_shown(flip.choice_before)} -> {_shown(flip.choice_after)}  ({kind})")
    if len(result.flips) > _SHOWN_FLIPS:
        yield f"  ... and {len(result.flips) - _SHOWN_FLIPS} more (--json lists every flip)"


def _shown(value: float | int | str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return repr(value[:40]) if isinstance(value, str) else str(value)
