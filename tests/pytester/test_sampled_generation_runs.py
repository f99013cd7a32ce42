"""Sampled goldens in pytest runs of the tiny model: checked, and a changed model fails; a sample flip
said so in the failure and in every report; a golden recorded before the top-k default reads
INPUT_CHANGED with both fixes; the docs' n-samples recipe runs as written; goldens recorded under
xdist are identical in a serial run."""

from __future__ import annotations

import json

import pytest

from pytest_llmdeterminism.reporting.documents import run_report_markdown
from tests.helpers import ROOT

STORY = """
from pytest_llmdeterminism import deterministic

@deterministic(seed=7)
def test_story(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Once upon a time", do_sample=True, temperature=1.5{extra}))
"""


def test_a_golden_recorded_before_the_top_k_default_reads_input_changed_with_both_fixes(suite):
    """A sampled golden recorded when no top_k meant no cut (top_k 0, what top_k=0 records today),
    checked by the same test without top_k: INPUT_CHANGED naming the changed default and both fixes,
    the golden untouched. top_k=0 passes against it; a golden recorded again holds top_k 50 and passes."""
    suite.makepyfile(test_story=STORY.format(extra=", top_k=0"))
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    (golden,) = suite.path.glob("__golden__/*.json")
    before = golden.read_bytes()
    assert next(iter(json.loads(before)["goldens"]["test_story"].values()))["generation_config"]["top_k"] == 0
    suite.makepyfile(test_story=STORY.format(extra=""))
    changed = suite.runpytest()
    changed.assert_outcomes(failed=1)
    changed.stdout.fnmatch_lines([
        "*golden mismatch in 'test_story': INPUT_CHANGED*",
        "E  *  generation_config.top_k: 0 -> 50 (a sampled test that passes no top_k now cuts at top_k=50, "
        "transformers' default for do_sample=True; this golden was drawn with no cut, the old default. To "
        "draw as it did, pass top_k=0 to llm_model.generate(); to take the new default, record it again "
        "with the Accept line below)",
        "E  *Accept with: pytest test_story.py::test_story --llm-golden-update"])
    assert golden.read_bytes() == before
    suite.makepyfile(test_story=STORY.format(extra=", top_k=0"))
    suite.runpytest().assert_outcomes(passed=1)
    suite.makepyfile(test_story=STORY.format(extra=""))
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    assert next(iter(json.loads(golden.read_text())["goldens"]["test_story"].values()))[
        "generation_config"]["top_k"] == 50
    again = suite.runpytest()
    again.assert_outcomes(passed=1)
    again.stdout.fnmatch_lines(["*golden checks: 1 IDENTICAL*"])


def test_the_docs_n_samples_recipe_runs_as_written(suite):
    """docs/sampled-generation.md's "N samples of one prompt" block: five goldens, one seed each."""

    page = (ROOT / "docs" / "sampled-generation.md").read_text(encoding="utf-8")
    section = page.split("## N samples of one prompt", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    suite.makepyfile(test_stories="from pytest_llmdeterminism import deterministic\n\n\n" + block)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    goldens = json.loads((suite.path / "__golden__" / "test_stories.json").read_text())["goldens"]
    seeds = {key: next(iter(variants.values()))["generation_config"]["seed"]
             for key, variants in goldens.items()}
    assert seeds == {f"test_five_stories::story {n}": n for n in range(5)}
    suite.runpytest().assert_outcomes(passed=1)


def test_a_sampled_golden_is_checked_and_a_changed_model_fails(suite, capsys):
    suite.makepyfile(test_story="""
        from pytest_llmdeterminism import deterministic

        @deterministic(seed=7)
        def test_story(llm_model, golden_tokens):
            golden_tokens.check(llm_model.generate("Once upon a time", do_sample=True, temperature=1.5,
                                                   top_p=0.95))
    """)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    (golden,) = suite.path.glob("__golden__/*.json")
    entry = next(iter(json.loads(golden.read_text())["goldens"]["test_story"].values()))
    assert entry["generation_config"]["seed"] == 7 and entry["generation_config"]["top_p"] == 0.95
    assert len(entry["draw_margins"]) == len(entry["steps"])
    checked = suite.runpytest()
    checked.assert_outcomes(passed=1)
    checked.stdout.fnmatch_lines(["*golden checks: 1 IDENTICAL*"])
    from pytest_llmdeterminism.cli.show import show

    capsys.readouterr()
    assert show(golden) == 0
    shown = capsys.readouterr().out
    assert ("  sampled: gumbel-xxh3-splitmix/1, temperature 1.5, top_k 50, top_p 0.95, min_p 0.0, "
            "seed 7") in shown
    defect = suite.runpytest("--llm-plant-defect")
    defect.assert_outcomes(failed=1)
    # noise 0.5 moves the logits by more than most draw margins: a flip within that drift is a
    # SAMPLE_FLIP (DESIGN §14), one away from it a REGRESSION; either fails
    defect.stdout.fnmatch_lines(["*golden mismatch in 'test_story': * at step *"])


def test_a_sample_flip_says_so_in_the_failure_and_in_every_report(suite, capsys):
    """A sampled golden whose draw was a near tie, read in the same environment: the failure names
    SAMPLE_FLIP, the step, both tokens, the draw margin against the tie margin over T and the
    settings; so do the JSON, Markdown and HTML reports and ``llm-golden diff``."""
    suite.makepyfile(test_story="""
        from pytest_llmdeterminism import deterministic

        @deterministic(seed=7)
        def test_story(llm_model, golden_tokens):
            golden_tokens.check(llm_model.generate("Once upon a time", do_sample=True, temperature=1.5))
    """)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    (golden,) = suite.path.glob("__golden__/*.json")
    data = json.loads(golden.read_text())
    entry = next(iter(data["goldens"]["test_story"].values()))
    step = entry["steps"][1]
    step["token"] = next(token for token, _ in step["top"] if token != step["token"])
    entry["draw_margins"][1] = 0.001
    golden.write_text(json.dumps(data))
    result = suite.runpytest("--llm-report=r.json", "--llm-report=r.md", "--llm-report=r.html",
                             "--llm-golden-artifacts=cand")
    result.assert_outcomes(failed=1)
    drawn = "sampled: temperature 1.5, top_k 50, seed 7 (gumbel-xxh3-splitmix/1)"
    result.stdout.fnmatch_lines(
        ["*SAMPLE_FLIP at step 1*(sampled); draw margin 0.001 < bound 0.0333 (tie margin 0.05 / T 1.5)*",
         f"E   *{drawn}"])
    (check,) = json.loads((suite.path / "r.json").read_text())["checks"]
    assert check["verdict"] == "SAMPLE_FLIP" and check["draw_margin"] == 0.001
    assert check["sampling"] == {"sampler": "gumbel-xxh3-splitmix/1", "temperature": 1.5, "top_k": 50,
                                 "top_p": 1.0, "min_p": 0.0, "seed": 7}
    markdown = (suite.path / "r.md").read_text()
    assert f"  - {drawn}; the golden's draw margin there 0.001" in markdown
    assert f"{drawn}; the golden&#x27;s draw margin there 0.001" in (suite.path / "r.html").read_text()
    from pytest_llmdeterminism.cli.diff import diff

    capsys.readouterr()
    assert diff(suite.path / "__golden__", suite.path / "cand" / "__golden__", fail_on="tie_flip") == 1
    assert (f"draw margin 0.001 (bound 0.0333 = tie margin 0.05 / T 1.5); {drawn}"
            in capsys.readouterr().out)
    greedy_check = {**check, "sampling": {}, "draw_margin": None}  # a greedy check's lines say nothing of it
    assert "sampled:" not in run_report_markdown({**json.loads((suite.path / "r.json").read_text()),
                                                  "checks": [greedy_check]})


@pytest.mark.subprocess
def test_sampled_goldens_recorded_under_xdist_are_identical_in_a_serial_run(suite):
    """Two xdist workers (one thread each) record the sampled goldens of four tests; a serial run at
    the same thread count reads every one IDENTICAL: the draw does not depend on the process."""
    for name, seed in (("a", 1), ("b", 2), ("c", 3), ("d", 4)):
        suite.makepyfile(**{f"test_{name}": f"""
            from pytest_llmdeterminism import deterministic

            @deterministic(seed={seed})
            def test_{name}(llm_model, golden_tokens):
                golden_tokens.check(llm_model.generate("Once upon a time", do_sample=True, temperature=1.3))
        """})
    recorded = suite.runpytest_subprocess("-n", "2", "--llm-golden-update", "--llm-threads=1")
    recorded.assert_outcomes(passed=4)
    serial = suite.runpytest_subprocess("--llm-threads=1")
    serial.assert_outcomes(passed=4)
    serial.stdout.fnmatch_lines(["*golden checks: 4 IDENTICAL*"])
