"""Golden files at scale: write, then read + validate + compare, 10k goldens.

    python benchmarks/golden_scale.py                   # 100 files x 100 entries x 32 steps
    python benchmarks/golden_scale.py --files 10 --entries 1000
    python benchmarks/golden_scale.py --smoke           # 2 files x 5 entries x 4 steps, one round

Entries are real: the example suite's recorded goldens of the tiny model (token ids, pieces,
hashes, top-5, fingerprint), repeated with their tokens, hashes and logprobs varied by a seeded
RNG so that no two entries are alike. Write = ``store.merge`` per file (lock, read, validate,
format, atomic replace), as the end of a recording run does. Read + check = ``store.read`` per
file, then every entry compared with an actual generation through the one check engine
(``golden.judge``), as a checking run does. Times are medians of ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_llmdeterminism.goldens import schema, store
from pytest_llmdeterminism.judge.judgement import judge_with as judge
from pytest_llmdeterminism.judge.tolerance import Profile

SMOKE = "2 files of 5 goldens of 4 steps, one round, so the script cannot rot (its figures mean nothing)"
TEMPLATE = ROOT / "examples" / "__golden__" / "test_tiny_model.json"


def entries(count: int, steps: int, seed: int) -> list[dict]:
    """``count`` distinct entries of ``steps`` steps, made from the example suite's real goldens."""
    templates = [schema.to_entry(schema.from_entry(entry))
                 for variants in store.read(TEMPLATE).values() for entry in variants.values()]
    rng = random.Random(seed)
    made = []
    for index in range(count):
        entry = dict(templates[index % len(templates)])
        base = entry["steps"]
        entry["steps"] = []
        for step in range(steps):
            source = base[step % len(base)]
            top = [[(token + rng.randrange(7)) % 512, round(logprob - rng.random() * 1e-3, 6)]
                   for token, logprob in source["top"]]
            entry["steps"].append({**source, "hash": f"{rng.getrandbits(64):016x}", "top": top,
                                   "token": top[0][0], "margin": round(abs(top[0][1] - top[1][1]), 6)})
        entry["prompt"] = f"{entry['prompt']} #{index}"
        made.append(entry)
    return made


def run(files: int, per_file: int, steps: int, rounds: int) -> dict[str, float]:
    data = entries(files * per_file, steps, seed=0)
    per_file_updates = [
        {f"test_case_{i}": {"cpu/float32": data[f * per_file + i]} for i in range(per_file)}
        for f in range(files)
    ]
    profile = Profile("exact")
    # What the model would have generated: built before the clock starts, as generation is not timed.
    actual = [{key: schema.from_entry(variants["cpu/float32"]) for key, variants in updates.items()}
              for updates in per_file_updates]
    write_times, read_times, sizes = [], [], 0
    for _ in range(rounds):
        folder = Path(tempfile.mkdtemp(prefix="golden-scale-"))
        try:
            start = time.perf_counter()
            for f, updates in enumerate(per_file_updates):
                store.merge(folder / f"test_module_{f}.json", updates)
            write_times.append(time.perf_counter() - start)
            sizes = sum(p.stat().st_size for p in folder.iterdir())
            start = time.perf_counter()
            verdicts = []
            for f in range(files):
                goldens = store.read(folder / f"test_module_{f}.json")
                for key, variants in goldens.items():
                    expected = schema.from_entry(variants["cpu/float32"])
                    verdicts.append(judge(expected, actual[f][key], profile)[0].verdict.value)
            read_times.append(time.perf_counter() - start)
            assert verdicts == ["IDENTICAL"] * (files * per_file), set(verdicts)
        finally:
            shutil.rmtree(folder)
    return {"write_s": statistics.median(write_times), "read_check_s": statistics.median(read_times),
            "megabytes": sizes / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--entries", type=int, default=100, help="goldens per file")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.files, args.entries, args.steps, args.rounds = 2, 5, 4, 1
    result = run(args.files, args.entries, args.steps, args.rounds)
    total = args.files * args.entries
    print(f"{total} goldens ({args.files} files x {args.entries} entries x {args.steps} steps, "
          f"{result['megabytes']:.1f} MB), median of {args.rounds} rounds:")
    print(f"  {'write (merge per file: lock, read, validate, format, atomic replace)':70}"
          f"{result['write_s']:6.2f} s")
    print(f"  {'read + validate + compare every golden':70}{result['read_check_s']:6.2f} s")


if __name__ == "__main__":
    main()
