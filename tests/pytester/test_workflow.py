"""The user's journey through pytest itself (pytester): record, check, catch a changed model, accept."""

import json

import pytest

from tests.helpers.models import perturbed_tiny_copy
from tests.helpers.projects import GOLDEN, golden_keys, suite_project


@pytest.fixture
def project(suite):
    return suite_project(suite)


class Runner:
    """Runs the project's pytest in-process, or in a subprocess with ``-n WORKERS`` (pytest-xdist)."""

    def __init__(self, pytester, workers):
        self.pytester = pytester
        self.workers = workers

    def __call__(self, *args, **outcomes):
        if self.workers:
            result = self.pytester.runpytest_subprocess("-n", str(self.workers), *args)
            outcomes.pop("deselected", None)  # xdist's controller does not count deselected tests
        else:
            result = self.pytester.runpytest(*args)
        if outcomes:
            result.assert_outcomes(**outcomes)
        return result


@pytest.fixture(params=[0, pytest.param(2, marks=pytest.mark.subprocess)], ids=["no-xdist", "xdist-2"])
def run(request, project):
    """The user's journey is the same with and without pytest-xdist: these tests run it both ways."""
    if request.param:
        pytest.importorskip("xdist")
    return Runner(project, request.param)


def test_first_run_fails_naming_the_update_flag_and_writes_nothing(project, run):
    result = run(failed=4)
    result.stdout.fnmatch_lines([
        "E*no golden recorded for 'test_capital' in __golden__/test_suite.json "
        "[[]'test_capital'][[]'cpu/float32'].",
        "E*Record it with: pytest test_suite.py::test_capital --llm-golden-update",
        "golden checks: 6 MISSING (failed)",
    ])
    result.stdout.fnmatch_lines(["E*Record it with: pytest 'test_suite.py::test_param[[]Count: one,]' "
                                 "--llm-golden-update"])
    assert not (project.path / "__golden__").exists()


def test_update_then_check_then_changed_model_then_accept(project, run, tmp_path):
    recorded = run("--llm-golden-update", passed=4)
    recorded.stdout.fnmatch_lines(["golden checks: 6 recorded",
                                   "wrote __golden__/test_suite.json (6 goldens)"])
    assert golden_keys(project) == [
        "test_capital", "test_param[Count: one,]", "test_param[The cat sat on the]",
        "test_two_checks", "test_two_checks#2", "test_two_checks::code",
    ]
    checked = run(passed=4)
    checked.stdout.fnmatch_lines(["golden checks: 6 IDENTICAL"])
    assert "unused golden" not in checked.stdout.str()  # under xdist: each key used by one worker or another

    before = (project.path / GOLDEN).read_bytes()
    changed_model = perturbed_tiny_copy(tmp_path / "changed", scale=0.5, seed=0)
    failed = run(f"--llm-model={changed_model}", "-k", "capital", failed=1, deselected=3)
    failed.stdout.fnmatch_lines([
        ("E*golden mismatch in 'test_capital': REGRESSION at step 0 — expected ' Tokyo' (id *), "
        "got ' Rome' (id *); golden margin * >= tie margin 0.05: not a near tie — fails under 'exact'"),
        "E*expected: [[]step 0] ' Tokyo'(*",
        "E*got:      [[]step 0] ' Rome'(*",
        "E*expected top-5 at step 0: ' Tokyo' *",
        "E*diverged at the first step: 0/* tokens matched",  # nothing before it to call identical
        "E*environment changed (expected -> got):",
        "E*weights_hash: '*' -> '*'",
        "E*Accept with: pytest test_suite.py::test_capital --llm-model=*/changed --llm-golden-update",
    ])
    assert (project.path / GOLDEN).read_bytes() == before  # a failing check never writes

    accepted = run(f"--llm-model={changed_model}", "--llm-golden-update", passed=4)
    accepted.stdout.fnmatch_lines([
        "golden checks: 6 updated (over *REGRESSION*)",
        "wrote __golden__/test_suite.json (6 goldens)",
        "updated * golden(s) over a REGRESSION or INPUT_CHANGED: * review each change before you commit it:",
        "  REGRESSION    test_suite.py::test_capital [[]'test_capital']",
    ])
    assert (project.path / GOLDEN).read_bytes() != before
    run(f"--llm-model={changed_model}", passed=4)
    run(failed=4)  # the original model no longer matches


def test_every_check_of_a_test_is_judged_and_gets_its_candidate_in_one_run(project, run, tmp_path):
    run("--llm-golden-update", passed=4)
    changed_model = perturbed_tiny_copy(tmp_path / "changed", scale=0.5, seed=0)
    result = run(f"--llm-model={changed_model}", "--llm-golden-artifacts=candidates", failed=4)
    source = (project.path / "test_suite.py").read_text().splitlines()
    line = {text.strip(): number for number, text in enumerate(source, start=1)}
    result.stdout.fnmatch_lines([
        ">*golden_tokens.check(first)",  # the traceback points at the first failing check
        "E*3 golden checks failed in this test (every check ran and has its candidate):",
        f"E*[[]1/3] at test_suite.py:{line['golden_tokens.check(first)']} golden mismatch in "
        "'test_two_checks': *",
        f"E*[[]2/3] at test_suite.py:{line['golden_tokens.check(second)']} golden mismatch in "
        "'test_two_checks#2': *",
        "E*[[]3/3] at test_suite.py:* golden mismatch in 'test_two_checks::code': *",
        "E*Accept all of them with: pytest test_suite.py::test_two_checks --llm-model=*/changed "
        "--llm-golden-update",
    ])
    assert result.stdout.str().count("Accept with:") == 3  # once per test with one failing check
    result.stdout.fnmatch_lines(["wrote candidates/__golden__/test_suite.json (6 candidate(s))"])
    candidates = json.loads((project.path / "candidates" / GOLDEN).read_text())["goldens"]
    assert sorted(candidates) == golden_keys(project)


def test_a_test_that_fails_after_recording_keeps_no_golden_and_shows_its_checks(suite, tmp_path, monkeypatch):
    suite.makepyfile(test_then_asserts="""
        import os
        from pytest_llmdeterminism import deterministic

        @deterministic(max_new_tokens=3)
        def test_then_asserts(llm_model, golden_tokens):
            result = llm_model.generate("The sky is")
            golden_tokens.check(result)
            assert "FAIL_AFTER_CHECK" not in os.environ, "the test's own assertion"
    """)
    monkeypatch.setenv("FAIL_AFTER_CHECK", "1")
    held = suite.runpytest("--llm-golden-update")
    held.assert_outcomes(failed=1)
    held.stdout.fnmatch_lines(["golden checks: 1 not recorded",  # never "recorded", then "NOT recorded"
                               "NOT recorded: the goldens of 1 test(s) that recorded, then failed or "
                               "were skipped*",
                               "  test_then_asserts.py::test_then_asserts"])
    assert not (suite.path / "__golden__").exists()  # a known-bad output is never frozen

    monkeypatch.delenv("FAIL_AFTER_CHECK")
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    monkeypatch.setenv("FAIL_AFTER_CHECK", "1")
    changed_model = perturbed_tiny_copy(tmp_path / "changed", scale=0.5, seed=0)
    result = suite.runpytest(f"--llm-model={changed_model}", "--llm-golden-artifacts=candidates")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E*AssertionError: the test's own assertion",
                                 "*- Captured llm golden checks that failed too call -*",
                                 "golden mismatch in 'test_then_asserts': *"])
    assert (suite.path / "candidates").exists()


def test_tiny_weight_noise_is_logit_drift_with_tokens_unchanged(project, tmp_path):
    project.runpytest("--llm-golden-update").assert_outcomes(passed=4)
    drifted = perturbed_tiny_copy(tmp_path / "drifted", scale=1e-4)
    result = project.runpytest(f"--llm-model={drifted}", "-k", "capital")
    result.assert_outcomes(failed=1, deselected=3)
    result.stdout.fnmatch_lines([
        "E*golden mismatch in 'test_capital': LOGIT_DRIFT at step 0 — same tokens, logits differ*fails "
        "under 'exact'",
        "E*all * tokens match: ' Tokyo.'",
    ])


def test_update_new_records_only_missing_goldens(project, tmp_path):
    project.runpytest("--llm-golden-update", "-k", "capital").assert_outcomes(passed=1, deselected=3)
    assert golden_keys(project) == ["test_capital"]
    changed_model = perturbed_tiny_copy(tmp_path / "changed", scale=0.5, seed=0)
    result = project.runpytest(f"--llm-model={changed_model}", "--llm-golden-update=new")
    result.assert_outcomes(passed=3, failed=1)  # the changed capital still fails; the rest is recorded
    result.stdout.fnmatch_lines(["*REGRESSION at step 0*"])
    assert len(golden_keys(project)) == 6


def test_k_selection_and_test_order_do_not_change_results(project):
    project.runpytest("--llm-golden-update").assert_outcomes(passed=4)
    project.runpytest("-k", "two_checks").assert_outcomes(passed=1, deselected=3)
    project.runpytest("-k", "not capital", "-p", "no:randomly").assert_outcomes(passed=3, deselected=1)
    reverse = project.makeconftest("def pytest_collection_modifyitems(items): items.reverse()")
    assert reverse.exists()
    project.runpytest().assert_outcomes(passed=4)


def test_corrupt_golden_is_named_and_kept(project):
    (project.path / "__golden__").mkdir()
    corrupt = project.path / GOLDEN
    corrupt.write_text('{"schema": 1, "goldens": {"test_capital": ')
    for args in ([], ["--llm-golden-update"]):
        result = project.runpytest(*args)
        result.assert_outcomes(failed=4)
        result.stdout.fnmatch_lines([("E*GoldenFileError: golden file '*test_suite.json' is not valid JSON*"
                                     "left untouched*git checkout*")])
        assert corrupt.read_text() == '{"schema": 1, "goldens": {"test_capital": '


def test_checking_the_same_name_twice_is_an_error(suite):
    suite.makepyfile(
        """
        def test_twice(llm_model, golden_tokens):
            result = llm_model.generate("x")
            golden_tokens.check(result, name="a")
            golden_tokens.check(result, name="a")
        """
    )
    result = suite.runpytest("--llm-golden-update")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E*golden 'test_twice::a' is checked twice in one test; give each check "
                                 "its own name="])


def test_golden_dir_option_mirrors_the_test_tree(suite):
    suite.mkpydir("pkg")
    suite.path.joinpath("pkg", "test_in_pkg.py").write_text(
        "def test_a(llm_model, golden_tokens):\n    golden_tokens.check(llm_model.generate('x'))\n"
    )
    suite.runpytest("--llm-golden-update", "--llm-golden-dir=goldens").assert_outcomes(passed=1)
    assert (suite.path / "goldens" / "pkg" / "test_in_pkg.json").is_file()
    suite.runpytest("--llm-golden-dir=goldens").assert_outcomes(passed=1)


def test_global_torch_state_is_restored_after_a_deterministic_test(suite):
    suite.makepyfile(
        """
        import random
        import torch
        from pytest_llmdeterminism import deterministic

        seen = {}

        def snapshot():
            return {
                "deterministic": torch.are_deterministic_algorithms_enabled(),
                "matmul": torch.backends.cuda.matmul.fp32_precision,
                "precision": torch.get_float32_matmul_precision(),
                "cudnn": (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark),
                "torch_rng": torch.get_rng_state().tolist(),
                "python_rng": random.getstate(),
            }

        def test_0_before():
            torch.manual_seed(99)
            random.seed(99)
            seen["before"] = snapshot()

        @deterministic(seed=3)
        def test_1_deterministic(llm_model):
            assert torch.are_deterministic_algorithms_enabled()
            assert torch.initial_seed() == 3
            llm_model.generate("hello")
            torch.rand(10)

        def test_2_after():
            assert snapshot() == seen["before"]
            assert not torch.are_deterministic_algorithms_enabled()
        """
    )
    suite.runpytest("-p", "no:randomly").assert_outcomes(passed=3)


@pytest.mark.subprocess
def test_xdist_worker_crash_keeps_goldens_recorded_before_it(suite):
    pytest.importorskip("xdist")
    suite.makepyfile(
        test_crash="""
        import os

        def test_a(llm_model, golden_tokens):
            golden_tokens.check(llm_model.generate("Count: one,"))

        def test_b_crash():
            os._exit(1)
        """
    )
    result = suite.runpytest_subprocess("-n", "1", "-p", "no:randomly", "--llm-golden-update")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["golden checks: 1 recorded", "wrote __golden__/test_crash.json (1 golden)"])


def test_class_marker_arguments_merge_with_the_methods(suite):
    suite.makepyfile(
        test_cls="""
        from pytest_llmdeterminism import deterministic

        @deterministic(batch_shape="2x16", seed=3)
        class TestGroup:
            @deterministic(max_new_tokens=2)
            def test_m(self, llm_model, golden_tokens):
                result = llm_model.generate("Count: one,")
                assert result.batch_shape == "2x16" and len(result.token_ids) == 2
                golden_tokens.check(result)
        """
    )
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    goldens = json.loads((suite.path / "__golden__" / "test_cls.json").read_text())["goldens"]
    assert list(goldens) == ["TestGroup::test_m"]


def test_unavailable_device_is_a_load_error_reported_once(suite):
    suite.makepyfile("def test_a(llm_model): pass\ndef test_b(llm_model): pass\n")
    result = suite.runpytest("--llm-device=cuda:3")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*llm_device = 'cuda:3' but CUDA is not available here (torch *"])


def test_ci_refuses_to_write_goldens_unless_forced_and_missing_ones_fail(project, monkeypatch):
    monkeypatch.setenv("CI", "true")
    refused = project.runpytest("--llm-golden-update")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines([("ERROR: --llm-golden-update = 'all': refused because CI='true' is set*"
                                  "--llm-golden-update-in-ci*")])
    missing = project.runpytest()
    missing.assert_outcomes(failed=4)
    assert not (project.path / "__golden__").exists()
    forced = project.runpytest("--llm-golden-update", "--llm-golden-update-in-ci")
    forced.assert_outcomes(passed=4)
    project.runpytest().assert_outcomes(passed=4)


def test_junit_xml_carries_one_llm_verdict_property_per_check(project):
    import xml.etree.ElementTree as ET

    project.runpytest("--llm-golden-update").assert_outcomes(passed=4)
    project.runpytest("--junitxml=report.xml").assert_outcomes(passed=4)
    tree = ET.parse(project.path / "report.xml")
    verdicts = {case.get("name"): [p.get("value") for p in case.iter("property")
                                   if p.get("name") == "llm_verdict"]
                for case in tree.iter("testcase")}
    assert verdicts["test_two_checks"] == ["IDENTICAL", "IDENTICAL", "IDENTICAL"]
    assert verdicts["test_capital"] == ["IDENTICAL"]


def test_json_and_markdown_reports_list_every_check(project, tmp_path, monkeypatch):
    project.runpytest("--llm-golden-update").assert_outcomes(passed=4)
    changed_model = perturbed_tiny_copy(tmp_path / "changed", scale=0.5, seed=0)
    summary_file = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary_file))
    result = project.runpytest(f"--llm-model={changed_model}", "--llm-report=out/report.json")
    result.stdout.fnmatch_lines(["wrote out/report.json (report)"])
    document = json.loads((project.path / "out" / "report.json").read_text())
    assert document["schema"] == "pytest-llmdeterminism/report" and document["version"] == 1
    checks = document["checks"]
    assert document["summary"]["checks"] == len(checks) >= 4  # a failing check stops its test
    fields = {"test": str, "name": str, "variant": str, "verdict": str, "passed": bool, "profile": str,
              "max_logprob_delta": float, "input_changes": list, "changed_fingerprint": dict,
              "test_duration_s": float, "steps": dict}
    for check in checks:
        for field, kind in fields.items():
            assert isinstance(check[field], kind), (field, check)
        assert check["first_divergence"] is None or isinstance(check["first_divergence"], int)
        assert check["changed_fingerprint"]["model"] == ["builtin:tiny", "changed"]
    capital = next(c for c in checks if c["name"] == "test_capital")
    assert capital["verdict"] == "REGRESSION" and capital["first_divergence"] == 0 and not capital["passed"]
    assert document["summary"]["failed"] == sum(not c["passed"] for c in checks)

    project.runpytest(f"--llm-model={changed_model}", "--llm-report=report.md")
    markdown = (project.path / "report.md").read_text()
    assert "| `REGRESSION` |" in markdown
    for check in checks:
        if not check["passed"]:
            assert f"`{check['name']}`" in markdown
    assert summary_file.read_text().count("## LLM golden checks") == 2


def test_report_path_must_be_json_or_markdown(suite):
    suite.makepyfile("def test_nothing(): pass")
    result = suite.runpytest("--llm-report=out.txt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*expected a path ending in .json, .md or .html, got 'out.txt'*"])


def test_unused_goldens_are_reported_only_after_a_complete_green_run_and_pruned_on_request(project, run):
    run("--llm-golden-update", passed=4)
    # Remove one check from a test and a whole test; skip another test.
    source = (project.path / "test_suite.py").read_text()
    source = source.replace('golden_tokens.check(llm_model.generate("def add(a, b):"), name="code")', 'pass')
    source = source.replace("@deterministic(max_new_tokens=6)\ndef test_capital",
                            "@deterministic(max_new_tokens=6)\ndef xtest_capital")
    source = source.replace("@deterministic\n@pytest.mark.parametrize",
                            "@pytest.mark.skip('GPU only')\n@deterministic\n@pytest.mark.parametrize")
    project.makepyfile(test_suite=source)
    before = (project.path / GOLDEN).read_bytes()

    partial = run("-k", "two_checks", passed=1, deselected=2)
    assert "unused golden" not in partial.stdout.str()
    not_pruned = run("-k", "two_checks", "--llm-golden-prune")
    not_pruned.stdout.fnmatch_lines(["unused goldens not pruned: this run was partial (-k; 2 "
                                     "test(s) deselected)"])
    assert (project.path / GOLDEN).read_bytes() == before

    complete = run(passed=1, skipped=2)
    complete.stdout.fnmatch_lines([
        "unused golden in __golden__/test_suite.json: 'test_capital'",
        "unused golden in __golden__/test_suite.json: 'test_two_checks::code'",
        "*delete them with: pytest --llm-golden-prune",
    ])
    assert "test_param" not in complete.stdout.str().split("llm goldens")[-1]  # skipped: not exercised
    # under xdist both workers ran tests: the keys either used count as used, each unused one is named once
    assert complete.stdout.str().count("unused golden in") == 2

    pruned = run("--llm-golden-prune")
    pruned.stdout.fnmatch_lines(["pruned 2 unused golden(s):",
                                 "  __golden__/test_suite.json ['test_capital']",
                                 "  __golden__/test_suite.json ['test_two_checks::code']"])
    assert golden_keys(project) == ["test_param[Count: one,]", "test_param[The cat sat on the]",
                                    "test_two_checks", "test_two_checks#2"]


@pytest.mark.subprocess
def test_xdist_four_workers_200_cases_one_model_load_each(suite):
    pytest.importorskip("xdist")
    suite.makeconftest(
        """
        import os
        import pytest_llmdeterminism.engines as backends

        _load = backends.load

        def counting_load(*args, **kwargs):
            with open(f"loads-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.txt", "a") as log:
                log.write("load\\n")
            return _load(*args, **kwargs)

        backends.load = counting_load
        """
    )
    suite.makepyfile(
        test_many="""
        import pytest

        WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]

        @pytest.mark.parametrize("n", range(200))
        def test_case(llm_model, golden_tokens, n):
            prompt = f"Count: {WORDS[n % 10]}, {WORDS[(n // 10) % 10]}" + "!" * (n // 100)
            golden_tokens.check(llm_model.generate(prompt, max_new_tokens=2))
        """
    )
    recorded = suite.runpytest_subprocess("-n", "4", "--llm-golden-update")
    recorded.assert_outcomes(passed=200)
    recorded.stdout.fnmatch_lines(["golden checks: 200 recorded",
                                   "wrote __golden__/test_many.json (200 goldens)"])
    goldens = json.loads((suite.path / "__golden__" / "test_many.json").read_text())["goldens"]
    assert sorted(goldens) == sorted(f"test_case[{n}]" for n in range(200))
    logs = sorted(suite.path.glob("loads-gw*.txt"))
    assert len(logs) == 4 and all(log.read_text() == "load\n" for log in logs)
    checked = suite.runpytest_subprocess("-n", "4")
    checked.assert_outcomes(passed=200)
    checked.stdout.fnmatch_lines(["golden checks: 200 IDENTICAL"])
    # a plain run, in this process: without the counting conftest, whose wrapper would outlive the run here
    (suite.path / "conftest.py").unlink()
    suite.runpytest("-p", "no:xdist").assert_outcomes(passed=200)


def test_html_report_is_self_contained_and_shows_every_check(project, tmp_path):
    from html.parser import HTMLParser

    project.runpytest("--llm-golden-update").assert_outcomes(passed=4)
    changed_model = perturbed_tiny_copy(tmp_path / "changed", scale=0.5, seed=0)
    project.runpytest(f"--llm-model={changed_model}", "--llm-report=report.json", "--llm-report=report.html")
    checks = json.loads((project.path / "report.json").read_text())["checks"]
    page = (project.path / "report.html").read_text()

    class Collect(HTMLParser):
        def __init__(self):
            super().__init__()
            self.sections, self.divergent, self.external = [], 0, []

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if tag == "section":
                self.sections.append(attrs["class"])
            if "div" in (attrs.get("class") or "").split() and tag == "span":
                self.divergent += 1
            if attrs.get("src") or (tag == "link" and attrs.get("href")):
                self.external.append(attrs)

    parsed = Collect()
    parsed.feed(page)
    assert len(parsed.sections) == len(checks)
    assert parsed.sections.count("failed") == sum(not c["passed"] for c in checks)
    assert parsed.divergent >= 2  # the divergent token is outlined on both sides of a regression
    assert parsed.external == []
    assert "test_capital" in page and "REGRESSION" in page
    # The prompt, visible whitespace (' Tokyo' starts with a space) and the size of every drift.
    assert "Q:·What·is·the·capital·of·Japan?·A:" in page and "·Tokyo" in page
    drifted = [c for c in checks if c["verdict"] == "LOGIT_DRIFT"]
    assert drifted and all(f"max |Δlogprob| in top-k {c['max_logprob_delta']:.3g}" in page for c in drifted)


def test_a_skip_after_a_failing_check_does_not_hide_it_and_hidden_helpers_point_at_the_test(suite):
    suite.makepyfile(test_helpers="""
        import pytest
        from pytest_llmdeterminism import deterministic

        def check_prompt(llm_model, golden_tokens, prompt):
            __tracebackhide__ = True
            golden_tokens.check(llm_model.generate(prompt))

        @deterministic(max_new_tokens=2)
        def test_skips_after(llm_model, golden_tokens):
            golden_tokens.check(llm_model.generate("The sky is"))
            pytest.skip("not on this machine")

        @deterministic(max_new_tokens=2)
        def test_through_a_helper(llm_model, golden_tokens):
            check_prompt(llm_model, golden_tokens, "Count: one,")
    """)
    result = suite.runpytest()
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*no golden recorded for 'test_skips_after'*"])
    result.stdout.fnmatch_lines([">*check_prompt(llm_model, golden_tokens, \"Count: one,\")",
                                 "E*no golden recorded for 'test_through_a_helper'*"])


def test_the_header_says_what_is_in_force_and_the_model_load_is_announced(suite):
    suite.makepyfile(test_one="""
        def test_one(llm_model):
            assert llm_model.generate("The sky is").token_ids
    """)
    verbose = suite.runpytest()
    verbose.stdout.fnmatch_lines([("llm: model=builtin:tiny shape=4x32 dtype=float32 device=auto seed=0 "
                                   "max_new_tokens=8 tolerance=exact (near_tie across environments) "
                                   "threads=torch default (* cores)"),
                                  "llm cpu numerics: portable*"])
    quiet = suite.runpytest("-q", "--llm-tolerance=tokens")
    quiet.assert_outcomes(passed=1)
    # pytest prints no header under -q: the llm: line still says what is in force
    quiet.stdout.fnmatch_lines(["llm: model=builtin:tiny shape=4x32 * tolerance=tokens threads=*",
                                "llm: loading builtin:tiny (float32, device auto) ...",
                                "llm: loaded builtin:tiny in * s on cpu"])
    assert "llm cpu numerics" not in quiet.stdout.str()  # -q: the one llm: line
    assert "tolerance=tokens" in suite.runpytest("--llm-tolerance=tokens").stdout.str()


def test_the_planted_defect_fails_every_check_in_any_project_and_writes_nothing(project, monkeypatch):
    project.runpytest("--llm-golden-update").assert_outcomes(passed=4)
    before = (project.path / GOLDEN).read_bytes()
    result = project.runpytest("-q", "--llm-plant-defect", "--llm-golden-artifacts=candidates")
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines([
        "llm: model=builtin:tiny *",
        "llm: PLANTED DEFECT on (--llm-plant-defect): * every golden check must fail*",
        "llm: PLANTED DEFECT: noise of relative size 0.5 on * weight tensors of builtin:tiny*",
    ])
    result.stdout.fnmatch_lines(["E*golden mismatch in 'test_capital': REGRESSION at step 0*"])
    result.stdout.fnmatch_lines(["golden checks: * REGRESSION (failed)",
                                 "planted defect caught: all 6 golden check(s) failed, as they must",
                                 "--llm-golden-artifacts ignored: nothing is written under a planted defect"])
    assert (project.path / GOLDEN).read_bytes() == before and not (project.path / "candidates").exists()
    project.runpytest().assert_outcomes(passed=4)  # the defect lived in memory only

    refused = project.runpytest("--llm-plant-defect", "--llm-golden-update")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*--llm-golden-update = 'all': refused with --llm-plant-defect: * its "
                                  "outputs must never become goldens*"])
    monkeypatch.setenv("LLMDET_PLANT_DEFECT", "1")  # the variable a CI step can set
    by_variable = project.runpytest("--llm-golden-update")
    assert by_variable.ret == pytest.ExitCode.USAGE_ERROR
    by_variable.stderr.fnmatch_lines(["*refused with LLMDET_PLANT_DEFECT=1: *; to record goldens, "
                                      "unset LLMDET_PLANT_DEFECT"])
    assert (project.path / GOLDEN).read_bytes() == before


def test_the_planted_defect_refuses_an_engine_whose_weights_it_cannot_reach(suite):
    suite.makepyfile("def test_nothing(): pass")
    result = suite.runpytest("--llm-plant-defect", "--llm-model=openai:http://127.0.0.1:9/v1#model=m")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--llm-plant-defect: llm_model 'openai:*' runs on the openai engine, but *"
                                 "llm-golden perturb SRC DEST --scale 0.5*"])
