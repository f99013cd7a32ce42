"""The vLLM and transformers engines on one NVIDIA GPU, through the plugin itself (about 3-5 minutes).

    pip install vllm          # on the GPU machine (vLLM pins its own torch)
    python scripts/gpu_engines.py [MODEL_FOLDER] [--knobs max_model_len=512]

In a temporary project with a few greedy golden tests it runs pytest six times, each in its own
process (so each engine gets the whole GPU): vLLM records goldens, vLLM again (expected: every
check IDENTICAL), transformers on CUDA against the vLLM goldens (``--llm-golden-fallback``: the
cross-engine verdict per prompt), then transformers alone: it records, repeats (bitwise
repeatability: IDENTICAL means equal logit hashes) and runs in bfloat16 against the float32 goldens.
The default model is the plugin's built-in tiny Llama (its context is 512 tokens, hence the knob).
Exit status 0 when both engines repeat themselves exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from pytest_llmdeterminism.cli import main as llm_golden

TINY = Path(__file__).resolve().parent.parent / "pytest_llmdeterminism" / "engines" / "tiny"
SUITE = '''
import pytest
from pytest_llmdeterminism import deterministic

PROMPTS = {"capital": "The capital of France is", "sky": "The colour of the sky is",
           "cat": "The cat sat on the", "story": "Once upon a time", "count": "1 2 3 4 5"}

@deterministic(max_new_tokens=16)
@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_prompt(llm_model, golden_tokens, name):
    golden_tokens.check(llm_model.generate(PROMPTS[name]))
'''


def pytest_run(project: Path, label: str, *args: str) -> dict[str, Any] | None:
    """One pytest run in its own process; its --llm-report, or None (the output's tail is printed)."""
    report = project / f"{label}.json"
    env = {key: value for key, value in os.environ.items() if key != "CI"}  # CI refuses golden updates
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--llm-report={report}",
               *args]
    try:
        done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=300,
                              check=False)
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired:
        output, code = "TIMED OUT after 300 s", -1
    data = json.loads(report.read_text()) if report.exists() else None
    counts = data["summary"]["by_verdict"] if data else {}
    print(f"\n== {label}: pytest exit {code}; verdicts {counts or 'none'}")
    if code != 0 or not counts:  # a failure, or a recording run: what pytest said
        print("\n".join(output.splitlines()[-15:]))
    return data


def all_identical(data: dict[str, Any] | None) -> bool:
    checks = data["checks"] if data else []
    return bool(checks) and all(check["verdict"] == "IDENTICAL" for check in checks)


def verdict_table(data: dict[str, Any] | None) -> None:
    checks = data["checks"] if data else []
    print(f"\n{'golden':<28} {'compared with':<20} {'verdict':<13} {'first diff':>10} {'max |dlogprob|':>15}")
    for check in sorted(checks, key=lambda c: c["name"]):
        first, delta = check["first_divergence"], check["max_logprob_delta"]
        print(f"{check['name']:<28} {check['variant']:<20} {check['verdict']:<13} "
              f"{'-' if first is None else first:>10} "
              f"{'-' if delta is None else format(delta, '.3g'):>15}")
    print("verdicts:", dict(Counter(check["verdict"] for check in checks)) or "none")


def cuda_facts() -> None:
    import importlib.metadata

    import torch

    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
    if torch.cuda.is_available():
        print(f"device 0: {torch.cuda.get_device_name(0)}, compute capability "
              f"{'.'.join(map(str, torch.cuda.get_device_capability(0)))}, "
              f"{torch.cuda.device_count()} visible")
    else:
        print("CUDA is not available: the vLLM and CUDA runs below will fail")
    try:
        print(f"vllm {importlib.metadata.version('vllm')}")
    except importlib.metadata.PackageNotFoundError:
        print("vllm is not installed: pip install vllm")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", type=Path, default=TINY,
                        help="a local model folder (safetensors)")
    parser.add_argument("--knobs", default=None, help="vllm: knobs, e.g. max_model_len=4096 (default: "
                        "max_model_len=512 for the tiny model, none otherwise)")
    args = parser.parse_args()
    folder = args.model.resolve()
    tiny_knobs = "max_model_len=512" if folder == TINY.resolve() else ""
    knobs = args.knobs if args.knobs is not None else tiny_knobs
    vllm_spec = f"--llm-model=vllm:{folder}" + (f"#{knobs}" if knobs else "")
    hf_spec, cuda = f"--llm-model={folder}", "--llm-device=cuda"
    cuda_facts()
    with tempfile.TemporaryDirectory(prefix="llm-gpu-engines-") as tmp:
        project = Path(tmp)
        (project / "pytest.ini").write_text("[pytest]\n")  # the project root: no outer ini or conftest
        (project / "test_engines.py").write_text(SUITE)
        vllm_dir, hf_dir = f"--llm-golden-dir={project / 'vllm'}", f"--llm-golden-dir={project / 'hf'}"

        pytest_run(project, "vllm-record", vllm_spec, vllm_dir, "--llm-golden-update")
        vllm_repeat = pytest_run(project, "vllm-repeat", vllm_spec, vllm_dir)
        cross = pytest_run(project, "transformers-vs-vllm", hf_spec, cuda, vllm_dir, "--llm-golden-fallback")
        verdict_table(cross)

        pytest_run(project, "transformers-record", hf_spec, cuda, hf_dir, "--llm-golden-update")
        hf_repeat = pytest_run(project, "transformers-repeat", hf_spec, cuda, hf_dir)
        bf16 = pytest_run(project, "transformers-bf16-vs-fp32", hf_spec, cuda, "--llm-dtype=bfloat16", hf_dir,
                          "--llm-golden-fallback")
        verdict_table(bf16)

        print("\n== llm-golden diff BASE=vllm CAND=transformers (float32 goldens of both engines)")
        if (project / "vllm").is_dir() and (project / "hf").is_dir():
            llm_golden(["diff", str(project / "vllm"), str(project / "hf"), "--fail-on=drift"])
        else:
            print("skipped: one engine recorded no goldens (see its run above)")
    results = {"vLLM repeats bit-identically": all_identical(vllm_repeat),
               "transformers (CUDA) repeats bit-identically": all_identical(hf_repeat)}
    print()
    for claim, holds in results.items():
        print(f"{'yes' if holds else 'NO '}  {claim}")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
