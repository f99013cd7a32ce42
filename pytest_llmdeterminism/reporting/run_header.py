"""What a report leads with: the run (the model and its commit, the code's commit, the library
versions, the batch shape), taken from what the checks ran (their fingerprints), and the time each
test took. Pure data in, lines out; the reports render them."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_llmdeterminism.judge.compare import Recorded

# (fingerprint field, label) in the order the header names them; only the fields a run has appear.
HEADER_FIELDS = (("model", "model"), ("model_commit", "model commit"), ("weights_hash", "weights"),
                 ("engine", "engine"), ("engine_version", "engine version"), ("server_version", "server"),
                 ("torch", "torch"), ("transformers", "transformers"), ("dtype", "dtype"),
                 ("device_name", "device"), ("cpu_numerics", "CPU numerics"), ("batch_invariant", "kernels"),
                 ("batch_shape", "shape"))
_SHORT = {"model_commit": 12, "weights_hash": 12}  # hashes shown by their first characters


def header_of(recorded: Recorded) -> dict[str, str]:
    """The header's fields of one check's output: its fingerprint's and its batch shape."""
    values = {**recorded.fingerprint, "batch_shape": recorded.batch_shape}
    return {field: str(values[field])[:_SHORT.get(field)] for field, _ in HEADER_FIELDS
            if values.get(field) not in (None, "")}


def source_commit(root: Path) -> str:
    """The commit of the code under test: CI's variable, else the git checkout's HEAD (read from its
    files, no git process); "" where neither tells."""
    for variable in ("GITHUB_SHA", "CI_COMMIT_SHA", "BUILD_VCS_NUMBER"):
        if os.environ.get(variable):
            return os.environ[variable][:12]
    git = root / ".git"
    try:
        head = (git / "HEAD").read_text("utf-8").strip()
        if head.startswith("ref: "):
            ref = head[5:]
            path = git / ref
            if path.is_file():
                return path.read_text("utf-8").strip()[:12]
            packed = (git / "packed-refs").read_text("utf-8").splitlines()
            return next((line.split()[0][:12] for line in packed if line.endswith(f" {ref}")), "")
        return head[:12]
    except (OSError, UnicodeDecodeError):
        return ""


def header_lines(header: Mapping[str, Sequence[str]]) -> list[str]:
    """``label: value`` per field of the run's header (several values where the checks ran several)."""
    labels = dict(HEADER_FIELDS) | {"commit": "code commit"}
    order = ["model", "model_commit", "commit", *(field for field, _ in HEADER_FIELDS[2:])]
    return [f"{labels[field]}: {', '.join(header[field])}" for field in order if header.get(field)]


def times_per_test(checks: Sequence[Mapping[str, Any]]) -> list[tuple[str, int, int, float]]:
    """Per test with golden checks: its node id, its checks, how many failed, and its call's seconds;
    slowest first."""
    tests: dict[str, list[Any]] = {}
    for check in checks:
        row = tests.setdefault(check["test"], [0, 0, float(check.get("test_duration_s") or 0.0)])
        row[0] += 1
        row[1] += not check["passed"]
    return sorted(((test, n, failed, seconds) for test, (n, failed, seconds) in tests.items()),
                  key=lambda row: (-row[3], row[0]))
