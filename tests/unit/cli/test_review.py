"""`llm-golden accept` and `review` (cli/accept.py, cli/review.py) without a pytest run: which folder
mirrors the root when two fit, an unknown verdict listed, review without a terminal, and ids decoded
with the project's tokenizer only where the goldens recorded it."""

import subprocess
import sys

from tests.helpers import DATA
from tests.helpers.projects import llm_golden


def test_which_folder_mirrors_the_root_is_asked_for_when_two_fit(tmp_path, monkeypatch, capsys):
    from pytest_llmdeterminism import cli

    recorded = (DATA / "test_tiny_model.intel-avx512-native-0.1.0.json").read_bytes()
    root = tmp_path / "root"
    (root / "tests").mkdir(parents=True)
    (root / "tox.ini").write_text("[pytest]\n")
    for module in ("test_x.py", "tests/test_x.py"):  # a test_x module at the top and one in tests/
        (root / module).write_text("")
    golden = root / "cands" / "tests" / "__golden__" / "test_x.json"
    golden.parent.mkdir(parents=True)
    golden.write_bytes(recorded)
    monkeypatch.chdir(root)
    assert cli.main(["accept", "cands/tests/__golden__/test_x.json"]) == 2
    err = capsys.readouterr().err
    assert "'cands/tests', 'cands' fit equally well). Give it: --candidates-root DIR." in err
    assert not (root / "__golden__").exists() and not (root / "tests" / "__golden__").exists()
    assert cli.main(["accept", "cands/tests/__golden__/test_x.json", "--candidates-root", "cands"]) == 0
    assert (root / "tests" / "__golden__" / "test_x.json").read_bytes() != b""
    assert not (root / "__golden__").exists()


def test_an_unknown_verdict_is_a_usage_error_that_lists_the_verdicts(tmp_path):
    wrong = llm_golden("accept", tmp_path, "--only", "REGRESSON", cwd=tmp_path)
    assert wrong.returncode == 2
    assert ("'REGRESSON' is not a verdict: give one or more of REGRESSION,INPUT_CHANGED,FIELDS_CHANGED,NEW,"
            "SAMPLE_FLIP,TIE_FLIP,RANK_FLIP,LOGIT_DRIFT,IDENTICAL, separated by commas") in wrong.stderr


def test_review_without_a_terminal_names_accept_only_and_k(tmp_path):
    command = [sys.executable, "-m", "pytest_llmdeterminism.cli", "review", "llm-candidates"]
    result = subprocess.run(command, cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "llm-golden review: needs a terminal to ask case by case, and its input is not one. Choose the cases "
        "to accept instead with: llm-golden accept llm-candidates --only VERDICT[,...] (or --except, or -k "
        "SUBSTRING of the test key); `llm-golden diff` lists the verdicts.\n")


def test_review_decodes_ids_with_the_projects_tokenizer_only_where_the_goldens_recorded_it(tmp_path):
    import json

    from pytest_llmdeterminism.cli import tokenizer

    recorded = json.loads((DATA / "test_tiny_model.intel-avx512-native-0.1.0.json").read_text())
    tiny_hash = recorded["goldens"]["test_capital"]["cpu/float32"]["fingerprint"]["tokenizer_hash"]
    (tmp_path / "tox.ini").write_text("[pytest]\nllm_model = builtin:tiny\n")
    found = tokenizer.load(tmp_path / "tox.ini", {tiny_hash})
    assert found.tokenizer is not None and found.hash == tiny_hash
    assert found.line == ("token ids are decoded with the tokenizer of llm_model 'builtin:tiny', as the "
                          "failing check decoded them")
    other = tokenizer.load(tmp_path / "tox.ini", {"0123456789abcdef"})
    assert other.tokenizer is None and other.line.endswith(
        "is not the one these goldens were recorded with")
    (tmp_path / "tox.ini").write_text("[pytest]\n")
    assert tokenizer.load(tmp_path / "tox.ini", {tiny_hash}).line == (
        "token ids the goldens hold no piece for are shown as <id N>: the project's configuration names no "
        "llm_model whose tokenizer would decode them")
