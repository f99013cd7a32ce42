"""The weekly review loop: accept some candidates (by verdict, test key, folder or file), review
them case by case on a terminal, and `diff` that reads goldens only."""

import json
import os
import re
import select
import sys
import time

import pytest

from tests.helpers.models import perturbed_tiny_copy
from tests.helpers.projects import SUITE, llm_golden, read_goldens

GOLDEN = "tests/__golden__/test_suite.json"
CANDIDATE = "llm-candidates/" + GOLDEN


@pytest.fixture
def mixed(suite, tmp_path):
    """A project whose tests live in tests/, with goldens recorded by the tiny model; then a CI run
    with test_capital's prompt changed (INPUT_CHANGED) and a perturbed model (REGRESSION elsewhere)
    wrote its candidates to llm-candidates/. The project also holds JSON that is no golden."""
    (suite.path / "tests").mkdir()
    (suite.path / "tests" / "test_suite.py").write_text(SUITE)
    suite.runpytest("tests", "--llm-golden-update").assert_outcomes(passed=4)
    changed_prompt = SUITE.replace("capital of Japan", "capital of France")
    (suite.path / "tests" / "test_suite.py").write_text(changed_prompt)
    changed = perturbed_tiny_copy(tmp_path / "changed", scale=0.5, seed=0)
    suite.runpytest("tests", f"--llm-model={changed}", "--llm-golden-artifacts=llm-candidates")
    (suite.path / "data").mkdir()
    (suite.path / "data" / "cities.json").write_text('{"Paris": "France"}')
    (suite.path / "models" / "tiny").mkdir(parents=True)
    (suite.path / "models" / "tiny" / "config.json").write_text('{"model_type": "llama"}')
    return suite


def verdicts(project):
    """{test key: verdict} of every candidate, as `llm-golden diff llm-candidates` lists them."""
    shown = llm_golden("diff", "llm-candidates", cwd=project.path)
    assert shown.returncode in (0, 1), shown.stderr
    cases = (re.match(r"(\w+) +\S+ \['(.*)'\]\['cpu/float32'\]", line) for line in shown.stdout.splitlines())
    return {case[2]: case[1] for case in cases if case}


def test_the_mixed_project_has_both_verdicts(mixed):
    found = verdicts(mixed)
    assert found["test_capital"] == "INPUT_CHANGED"
    assert "REGRESSION" in found.values(), found



# -- accept: some of the candidates ---------------------------------------------------------------


def test_accept_only_a_verdict_takes_those_cases_and_lists_each_case_left(mixed):
    before, candidates = read_goldens(mixed, GOLDEN), read_goldens(mixed, CANDIDATE)
    found = verdicts(mixed)
    regressions = sorted(key for key, verdict in found.items() if verdict == "REGRESSION")
    accepted = llm_golden("accept", "llm-candidates", "--only", "regression", cwd=mixed.path)
    assert accepted.returncode == 1, accepted.stdout + accepted.stderr  # some cases were left
    lines = accepted.stdout.splitlines()
    taken = [line for line in lines if line.startswith("accepted ")]
    left = [line for line in lines if line.startswith("left ")]
    assert taken == [f"accepted REGRESSION     {GOLDEN} [{key!r}]['cpu/float32']" for key in regressions]
    assert f"left     INPUT_CHANGED  {GOLDEN} ['test_capital']['cpu/float32']" in left
    assert len(left) == len(found) - len(regressions)
    assert lines[-1] == f"summary: accepted {len(regressions)} case(s), left {len(left)} in llm-candidates"
    after = read_goldens(mixed, GOLDEN)
    for key in found:
        assert after[key] == (candidates[key] if key in regressions else before[key]), key
    # What is left is what diff still flags: the prompt change, the drift.
    assert verdicts(mixed) == {key: "IDENTICAL" if key in regressions else verdict
                               for key, verdict in found.items()}


def test_accept_k_takes_the_cases_whose_test_key_contains_it(mixed):
    before, candidates = read_goldens(mixed, GOLDEN), read_goldens(mixed, CANDIDATE)
    accepted = llm_golden("accept", "llm-candidates", "-k", "two_checks", "--except", "LOGIT_DRIFT",
                          cwd=mixed.path)
    assert accepted.returncode == 1, accepted.stdout + accepted.stderr
    assert [line.split()[3] for line in accepted.stdout.splitlines() if line.startswith("accepted ")] == [
        "['test_two_checks#2']['cpu/float32']"]
    after = read_goldens(mixed, GOLDEN)
    assert after["test_two_checks#2"] == candidates["test_two_checks#2"]
    assert {key: after[key] for key in after if key != "test_two_checks#2"} == \
        {key: before[key] for key in before if key != "test_two_checks#2"}
    nothing = llm_golden("accept", "llm-candidates", "-k", "no such test", cwd=mixed.path)
    assert nothing.returncode == 1
    assert "nothing was accepted: no case of llm-candidates matches -k no such test" in nothing.stdout
    assert read_goldens(mixed, GOLDEN) == after


def test_accept_one_candidate_file_or_a_subfolder_maps_it_under_the_root(mixed, tmp_path):
    """Both were refused before: the file as "not a folder", the subfolder with advice to remove
    a valid candidate."""
    before, candidates = read_goldens(mixed, GOLDEN), read_goldens(mixed, CANDIDATE)
    one = llm_golden("accept", CANDIDATE, "--only", "INPUT_CHANGED", cwd=mixed.path)
    assert one.returncode == 1, one.stdout + one.stderr
    lines = one.stdout.splitlines()
    assert lines[1] == f"candidates: llm-candidates (mirrors the root; {CANDIDATE} is inside it)"
    assert f"accepted INPUT_CHANGED  {GOLDEN} ['test_capital']['cpu/float32']" in lines
    assert read_goldens(mixed, GOLDEN)["test_capital"] == candidates["test_capital"]
    assert read_goldens(mixed, GOLDEN)["test_two_checks"] == before["test_two_checks"]
    assert not (mixed.path / "__golden__").exists()
    assert not (mixed.path / "tests/__golden__/__golden__").exists()

    folder = llm_golden("accept", "llm-candidates/tests/__golden__", cwd=mixed.path)
    assert folder.returncode == 0, folder.stdout + folder.stderr  # every case of the folder taken
    assert "\nleft " not in folder.stdout
    assert read_goldens(mixed, GOLDEN) == candidates
    changed = perturbed_tiny_copy(tmp_path / "again", scale=0.5, seed=0)
    mixed.runpytest("tests", f"--llm-model={changed}").assert_outcomes(passed=4)


# -- review: case by case on a terminal -----------------------------------------------------------


class Terminal:
    """`llm-golden ARGS` on a pseudo-terminal, read and typed into as a user would."""

    def __init__(self, *args, cwd):
        import pty

        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: its stdin, stdout and stderr are the terminal
            os.chdir(cwd)
            os.execv(sys.executable, [sys.executable, "-m", "pytest_llmdeterminism.cli", *map(str, args)])
        self.output = ""
        self.typed_at = 0

    def read_until(self, text, deadline=120):
        """The output so far, once ``text`` appeared in what came since the last keys typed."""
        end = time.monotonic() + deadline
        while text not in self.output[self.typed_at:]:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, end - time.monotonic()))
            chunk = self._read() if ready else ""
            ended = "the end" if ready else "the deadline"
            assert chunk, f"no {text!r} before {ended}; the terminal shows:\n{self.output}"
            self.output += chunk
        return self.output

    def type(self, keys):
        self.typed_at = len(self.output)
        os.write(self.fd, keys.encode())

    def finish(self):
        """The exit status, once the command ended; the rest of its output read."""
        while chunk := self._read():
            self.output += chunk
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        return os.waitstatus_to_exitcode(status)

    def _read(self):
        try:
            return os.read(self.fd, 65536).decode(errors="replace").replace("\r\n", "\n")
        except OSError:  # the child closed the terminal
            return ""


def test_review_asks_case_by_case_riskiest_first_and_writes_each_case_as_it_is_accepted(mixed):
    original, candidates = (mixed.path / GOLDEN).read_bytes(), read_goldens(mixed, CANDIDATE)
    found = verdicts(mixed)
    terminal = Terminal("review", cwd=mixed.path)
    shown = terminal.read_until("accept? [a/s/q] ")
    assert f"{len(found)} case(s) to review; answer each with a key and Enter: [a]ccept" in shown
    first = shown.split(f"[1/{len(found)}] ")[1]
    assert first.startswith("REGRESSION     tests/__golden__/test_suite.json ['test_param[Count: one,]']"
                            "['cpu/float32']  step 2: ' three'(374) -> ' b'(282), golden margin")  # as diff
    assert "\n  expected top-" in first and "\n  got:      " in first  # then the tokens around the change
    # Every top-k id decoded as the failing check decoded it, with the model's tokenizer (before: '<id 416>').
    assert "token ids are decoded with the tokenizer of llm_model 'builtin:tiny', as the failing check " \
           "decoded them" in shown
    assert "<id " not in shown
    terminal.type("a\n")
    terminal.read_until(f"[2/{len(found)}] REGRESSION")
    # Written as soon as it is accepted: no later crash or Ctrl-C can lose it.
    assert read_goldens(mixed, GOLDEN)["test_param[Count: one,]"] == candidates["test_param[Count: one,]"]
    terminal.type("x\n")  # not a key: asked again
    terminal.read_until("[a]ccept")
    terminal.type("s\n")
    terminal.read_until(f"[3/{len(found)}] REGRESSION")
    terminal.type("s\n")
    terminal.read_until(f"[4/{len(found)}] INPUT_CHANGED")  # after the regressions
    terminal.type("q\n")
    assert terminal.finish() == 1  # cases were left
    assert ("accepted REGRESSION     tests/__golden__/test_suite.json ['test_param[Count: one,]']"
            "['cpu/float32']") in terminal.output
    assert f"summary: accepted 1 case(s), left {len(found) - 1} in llm-candidates" in terminal.output
    after, before = read_goldens(mixed, GOLDEN), json.loads(original)["goldens"]
    assert {k: v for k, v in after.items() if k != "test_param[Count: one,]"} == \
        {k: v for k, v in before.items() if k != "test_param[Count: one,]"}


@pytest.mark.parametrize(("keys", "status", "said"), [
    ("\x03", 130, "interrupted: the rest is left in the candidates."),  # Ctrl-C
    ("q\n", 1, "quit: the rest is left in the candidates."),
    ("\x04", 1, "end of input: the rest is left in the candidates."),  # Ctrl-D
])
def test_ctrl_c_ctrl_d_or_quit_in_review_keep_every_case_accepted_before(mixed, keys, status, said):
    """Before, Ctrl-C and Ctrl-D threw away every answer given (nothing was written until the end)."""
    candidates = read_goldens(mixed, CANDIDATE)
    terminal = Terminal("review", "llm-candidates", cwd=mixed.path)
    terminal.read_until("accept? [a/s/q] ")
    terminal.type("a\n")
    terminal.read_until("[2/")
    terminal.type(keys)
    assert terminal.finish() == status, terminal.output
    assert said in terminal.output
    assert "\naccepted REGRESSION     tests/__golden__/test_suite.json ['test_param[Count: one,]']" \
        in terminal.output
    assert "summary: accepted 1 case(s)" in terminal.output
    assert read_goldens(mixed, GOLDEN)["test_param[Count: one,]"] == candidates["test_param[Count: one,]"]


def test_review_after_an_accept_passes_over_the_identical_cases_instead_of_crashing(mixed):
    """Before, review met the cases accepted earlier (now IDENTICAL) last, crashed on the first of
    them (an AssertionError in the failure text) and wrote none of the answers given before it."""
    found = verdicts(mixed)
    regressions = sorted(key for key, verdict in found.items() if verdict == "REGRESSION")
    assert llm_golden("accept", "llm-candidates", "--only", "REGRESSION", cwd=mixed.path).returncode == 1
    candidates = read_goldens(mixed, CANDIDATE)
    terminal = Terminal("review", cwd=mixed.path)
    left = len(found) - len(regressions)
    shown = terminal.read_until("accept? [a/s/q] ")
    assert (f"{left} case(s) to review ({len(regressions)} IDENTICAL to the project's golden, nothing to "
            "accept); answer each") in shown
    for number in range(1, left + 1):
        terminal.type("a\n")
        if number < left:
            terminal.read_until(f"[{number + 1}/{left}] ")
    assert terminal.finish() == 0, terminal.output
    assert "Traceback" not in terminal.output
    assert f"summary: accepted {left} case(s), left 0 in llm-candidates" in terminal.output
    assert read_goldens(mixed, GOLDEN) == candidates


# -- diff reads goldens only ----------------------------------------------------------------------


def test_diff_of_the_project_and_its_candidates_ignores_json_that_is_no_golden(mixed):
    """Before, data/cities.json stopped the comparison with exit 2 and advice to delete it."""
    found = llm_golden("diff", ".", "llm-candidates", cwd=mixed.path)
    assert found.returncode == 1, found.stdout + found.stderr  # the regressions need review
    assert "REGRESSION     tests/__golden__/test_suite.json" in found.stdout
    assert "INPUT_CHANGED  tests/__golden__/test_suite.json ['test_capital']" in found.stdout
    assert "llm-candidates/" not in found.stdout  # the candidates inside the project are not its goldens
    assert found.stderr == ("llm-golden diff: ignored 2 JSON file(s) under . or llm-candidates "
                            "(data/cities.json, models/tiny/config.json) that are not goldens (in no "
                            "__golden__ folder, and no golden format in their header)\n")
    (mixed.path / "llm-candidates" / "run.json").write_text("{}")
    alone = llm_golden("diff", "llm-candidates", cwd=mixed.path)
    assert alone.returncode == 1 and alone.stderr.count("\n") == 1 and "run.json" in alone.stderr
    assert "delete" not in found.stderr + alone.stderr


def test_diff_against_a_folder_without_goldens_says_so_in_one_hint(mixed, tmp_path):
    wrong = llm_golden("diff", "data", "llm-candidates/tests/__golden__", cwd=mixed.path)
    assert wrong.returncode == 1, wrong.stderr
    assert [line.split()[0] for line in wrong.stdout.splitlines()[:-2]] == ["NEW"] * 6
    assert wrong.stdout.splitlines()[-1] == (
        "hint: no goldens in BASE 'data', so every candidate reads NEW: is it the project's root, or the "
        "__golden__ folder that mirrors CAND? (With CAND alone, `llm-golden diff "
        "llm-candidates/tests/__golden__` compares it with the project found from here.)")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "tox.ini").write_text("[pytest]\n")
    alone = llm_golden("diff", mixed.path / "llm-candidates", cwd=elsewhere)
    assert alone.returncode == 1
    assert alone.stdout.splitlines()[-1].startswith(
        "hint: no goldens in the root '.' for these candidates, so every one reads NEW: is it the project")
