"""``llm-golden show FILE``: a golden file in human form, one line per generated token (a score
golden: one line per continuation token, with its logprob and rank)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pytest_llmdeterminism.errors import GoldenFileError, printable
from pytest_llmdeterminism.generation import Score
from pytest_llmdeterminism.goldens import schema, store
from pytest_llmdeterminism.judge.compare import default_tie_margin

SUMMARY = "print a golden file in human form"
_BAR = 20  # the widest margin bar, in characters


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, metavar="FILE", help="a golden file (*.json)")


def run(args: argparse.Namespace) -> int:
    return show(args.file)


def show(path: Path) -> int:
    if not path.exists():
        raise GoldenFileError(path, "does not exist", "Check the path.")
    goldens = store.read(path)
    for key, variants in sorted(goldens.items()):
        for variant, entry in sorted(variants.items()):
            gen = schema.from_entry(entry)
            if isinstance(gen, Score):
                _show_score(key, variant, gen)
                continue
            print(f"{printable(key)} [{printable(variant)}]  shape {gen.batch_shape}, finish: "
                  f"{printable(gen.finish_reason)}")
            print(f"  prompt: {gen.prompt!r}")
            config = gen.generation_config
            if config.get("do_sample") is True:  # a sampled golden: how it was drawn
                print(f"  sampled: {printable(config.get('sampler'))}, temperature "
                      f"{config.get('temperature')}, top_k {config.get('top_k')}, "
                      f"top_p {config.get('top_p')}, min_p {config.get('min_p')}, "
                      f"seed {config.get('seed')}; draw margins {list(gen.draw_margins)}")
            print(f"  output: {gen.text!r}")
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
                print(f"  {step:>4}  {piece!r:<16} id {token:<7} margin {margin:8.3f} {bar}{tie}")
            print()
    return 0


def _show_score(key: str, variant: str, score: Score) -> None:
    """A score golden: the continuation's log-likelihood, then each position's given token, its
    logprob, its rank, and how far it was from changing rank (a near tie marked)."""
    print(f"{printable(key)} [{printable(variant)}]  score, shape {score.batch_shape}, log-likelihood "
          f"{score.total:.6f} over {len(score.token_ids)} tokens")
    print(f"  prompt: {score.prompt!r}")
    print(f"  continuation: {score.continuation!r}")
    tie_margin = default_tie_margin(str(score.fingerprint.get("dtype", "float32")))
    pieces = score.pieces or ("",) * len(score.token_ids)
    for position, (piece, token, logprob, rank, margin) in enumerate(
            zip(pieces, score.token_ids, score.logprobs, score.ranks, score.rank_margins, strict=True)):
        shown_rank = "rank    ?" if rank is None else f"rank {rank:>4}"
        shown_margin = "" if margin is None else f" rank margin {margin:8.3f}"
        tie = f"  <- near tie (< {tie_margin:g})" if margin is not None and margin < tie_margin else ""
        print(f"  {position:>4}  {piece!r:<16} id {token:<7} logprob {logprob:10.6f} {shown_rank}"
              f"{shown_margin}{tie}")
    print()
