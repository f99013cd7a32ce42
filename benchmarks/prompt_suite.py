"""A 64-prompt JSONL suite (generated B at a time) vs 64 one-prompt tests, side by side.

    python benchmarks/prompt_suite.py [--model builtin:tiny] [--shape 8x32]
    python benchmarks/prompt_suite.py --smoke          # 8 prompts, 2 new tokens, one run each, no fixed cost

Both run in fresh pytest processes against goldens recorded first. pytest's own "in N s" includes
the model load, so a run of one item measures that fixed cost and it is subtracted from both.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight"]
PROMPTS = [f"Count: {a}, {b}," for a in WORDS for b in WORDS]  # 64 prompts
SMOKE = "one short round of every step on builtin:tiny, so the script cannot rot (its figures mean nothing)"


def run(folder: Path, *args: str) -> float:
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                         cwd=folder, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(out.stdout[-3000:] + out.stderr[-2000:])
    return float(re.findall(r"in ([0-9.]+)s", out.stdout)[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--shape", default="8x32")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.model, args.max_new_tokens = "builtin:tiny", 2
        del PROMPTS[8:]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "pytest.ini").write_text(f"[pytest]\nllm_model = {args.model}\n"
                                           f"llm_batch_shape = {args.shape}\n"
                                           f"llm_max_new_tokens = {args.max_new_tokens}\n")
        (folder / "test_suite.llm.jsonl").write_text(
            "".join(json.dumps({"id": f"p{i:02d}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
        (folder / "test_single.py").write_text(
            "import pytest\n\n"
            f"PROMPTS = {PROMPTS!r}\n\n"
            "@pytest.mark.parametrize('prompt', PROMPTS)\n"
            "def test_one(llm_model, golden_tokens, prompt):\n"
            "    golden_tokens.check(llm_model.generate(prompt))\n")
        run(folder, "--llm-golden-update")
        first = f"test_single.py::test_one[{PROMPTS[0]}]"
        # --smoke: nothing subtracted (a run's "in N s" has two decimals: the difference could be 0)
        fixed = 0.0 if args.smoke else min(run(folder, first) for _ in range(2))
        suite = run(folder, "test_suite.llm.jsonl") - fixed
        single = run(folder, "test_single.py") - fixed
    print(f"{args.model} at {args.shape}, {len(PROMPTS)} prompts, {args.max_new_tokens} new tokens:")
    print(f"  fixed cost of a session (load, one test): {fixed:6.2f} s, subtracted below")
    print(f"  {len(PROMPTS)} one-prompt tests:   {single:6.2f} s")
    print(f"  JSONL suite (batched): {suite:6.2f} s   speed-up {single / suite:.1f}x")


if __name__ == "__main__":
    main()
