"""``llm-golden show FILE``: a golden file in human form, one line per generated token."""

from __future__ import annotations

import argparse
from pathlib import Path

from pytest_llmdeterminism.compare import default_tie_margin
from pytest_llmdeterminism.errors import GoldenFileError
from pytest_llmdeterminism.goldens import schema, store

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
            print(f"{key} [{variant}]  shape {gen.batch_shape}, finish: {gen.finish_reason}")
            print(f"  prompt: {gen.prompt!r}")
            config = gen.generation_config
            if config.get("do_sample") is True:  # a sampled golden: how it was drawn
                print(f"  sampled: {config.get('sampler')}, temperature {config.get('temperature')}, top_k "
                      f"{config.get('top_k')}, top_p {config.get('top_p')}, min_p {config.get('min_p')}, "
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
