"""``--llm-repro=DIR``: a repro pack per failing golden check, whose command reruns that check alone."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_llmdeterminism.goldens import store
from pytest_llmdeterminism.run.repro import safe_name
from tests.helpers.models import perturbed_tiny_copy
from tests.helpers.projects import llm_golden

SUITE = """
import pytest
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=6)
def test_capital(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Q: What is the capital of Japan? A:"))

@deterministic
@pytest.mark.parametrize("prompt", ["Count: one,", "The cat sat on the"])
def test_param(llm_model, golden_tokens, prompt):
    golden_tokens.check(llm_model.generate(prompt))

@deterministic
def test_two_checks(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The colour of the sky is"))
    golden_tokens.check(llm_model.generate("def add(a, b):"), name="code")
"""
NEW_TEST = """

@deterministic
def test_new(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Hello, world!"))
"""
PARAM = "test_suite.py::test_param[Count: one,]"


@pytest.fixture
def recorded(suite, tmp_path):
    suite.makepyfile(test_suite=SUITE)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=4)
    return suite, perturbed_tiny_copy(tmp_path / "changed", scale=0.5, seed=0)


def pack_of(root: Path, nodeid: str, key: str | None = None) -> Path:
    folder = root / safe_name(nodeid)
    return folder / safe_name(key) if key else folder


def rerun(pack: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The pack's rerun.sh, as a user runs it from the project: ``pytest`` is this interpreter's."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(["sh", str(pack / "rerun.sh")], cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "PATH": path})


@pytest.mark.subprocess  # runs the pack's rerun.sh
def test_a_failing_check_writes_a_pack_whose_command_reruns_that_check_alone(recorded):
    project, changed = recorded
    (project.path / "test_suite.py").write_text(SUITE + NEW_TEST)
    result = project.runpytest(f"--llm-model={changed}", "--llm-repro=repro")
    result.assert_outcomes(failed=5)
    result.stdout.fnmatch_lines(["wrote repro (6 repro pack(s); rerun one check alone from here with: "
                                 "sh repro/*/rerun.sh)"])
    repro = project.path / "repro"
    # One folder per failing test; a test with several failing checks gets one per key below it.
    assert sorted(p.name for p in repro.iterdir() if p.is_dir()) == sorted(
        safe_name(f"test_suite.py::{name}") for name in (
            "test_capital", "test_param[Count: one,]", "test_param[The cat sat on the]", "test_two_checks",
            "test_new"))
    # Marked as the plugin's output: no walk for goldens enters it (before, `llm-golden diff .` read
    # the packs' golden.json and new.json as goldens of the project, and listed their other JSON).
    assert (repro / "LLM-OUTPUT.txt").is_file()
    for args in (["."], [".", "."]):
        walked = llm_golden("diff", *args, cwd=project.path)
        assert walked.returncode == 0, walked.stdout + walked.stderr
        assert "repro" not in walked.stdout + walked.stderr
    two = pack_of(repro, "test_suite.py::test_two_checks")
    assert sorted(p.name for p in two.iterdir()) == sorted(map(safe_name, ["test_two_checks",
                                                                           "test_two_checks::code"]))

    pack = pack_of(repro, PARAM)
    key = "test_param[Count: one,]"
    golden = store.read(project.path / "__golden__" / "test_suite.json")[key]["cpu/float32"]
    # The golden and the new entry, each a golden file of one entry (the store reads them back).
    assert store.read(pack / "golden.json") == {key: {"cpu/float32": golden}}
    new = store.read(pack / "new.json")[key]["cpu/float32"]
    assert new.fingerprint["model"] == "changed" and new.steps != golden.steps
    fingerprints = json.loads((pack / "fingerprint.json").read_text())
    assert fingerprints["golden"]["weights_hash"] == golden.fingerprint["weights_hash"]
    assert fingerprints["run"]["weights_hash"] == new.fingerprint["weights_hash"]
    assert fingerprints["changed"]["model"] == ["builtin:tiny", "changed"]
    prompt = json.loads((pack / "prompt.json").read_text())
    assert prompt["run"] == {"prompt": "Count: one,", "prompt_form": "text",
                             "prompt_token_ids": list(new.prompt_token_ids)}
    settings = json.loads((pack / "settings.json").read_text())
    assert settings["verdict"] == "REGRESSION" and settings["test"] == PARAM
    assert settings["batch_shape"] == "4x32" and settings["generation_config"]["max_new_tokens"] == 8
    command = settings["command"]
    threads = new.fingerprint["torch_threads"]
    assert shlex.split(command) == ["pytest", PARAM, f"--llm-model={changed}", "--llm-batch-shape=4x32",
                                    "--llm-max-new-tokens=8", f"--llm-threads={threads}"]
    readme = (pack / "README.txt").read_text()
    assert f"Golden check {key!r} of {PARAM} failed: REGRESSION under 'exact'." in readme
    assert f"\n    {command}\n" in readme
    assert command in (pack / "rerun.sh").read_text()
    assert os.access(pack / "rerun.sh", os.X_OK)
    # A check with no golden: its pack says so, and holds this run's entry.
    missing = pack_of(repro, "test_suite.py::test_new")
    assert not (missing / "golden.json").exists() and (missing / "new.json").exists()
    assert "golden.json: none (the check had no golden)" in (missing / "README.txt").read_text()

    again = rerun(pack, cwd=project.path)
    assert again.returncode == 1, again.stdout[-3000:] + again.stderr[-2000:]
    assert "collected 1 item" in again.stdout
    assert f"FAILED {PARAM} - " in again.stdout and "1 failed" in again.stdout
    assert "golden checks: 1 REGRESSION (failed)" in again.stdout


def test_a_passing_run_and_a_planted_defect_write_no_pack(recorded):
    project, _ = recorded
    project.runpytest("--llm-repro=repro").assert_outcomes(passed=4)
    assert not (project.path / "repro").exists()
    planted = project.runpytest("--llm-plant-defect", "--llm-repro=repro")
    planted.assert_outcomes(failed=4)
    assert not (project.path / "repro").exists()
    planted.stdout.fnmatch_lines(["--llm-repro ignored: nothing is written under a planted defect"])


@pytest.mark.subprocess
def test_under_xdist_the_controller_writes_the_packs_and_the_command_pins_the_workers_threads(recorded):
    project, changed = recorded
    result = project.runpytest_subprocess("-n", "2", f"--llm-model={changed}", "--llm-repro=repro")
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines(["wrote repro (5 repro pack(s); *"])
    pack = pack_of(project.path / "repro", PARAM)
    new = store.read(pack / "new.json")["test_param[Count: one,]"]["cpu/float32"]
    command = shlex.split(json.loads((pack / "settings.json").read_text())["command"])
    # The worker's share of the cores, pinned: a serial rerun would otherwise take every core.
    assert command[-3:] == [f"--llm-threads={new.fingerprint['torch_threads']}", "-n", "0"]
    again = rerun(pack, cwd=project.path)
    assert again.returncode == 1, again.stdout[-3000:] + again.stderr[-2000:]
    assert "collected 1 item" in again.stdout
    verdict = json.loads((pack / "settings.json").read_text())["verdict"]
    assert f"golden checks: 1 {verdict} (failed)" in again.stdout
