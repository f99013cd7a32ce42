"""Reports that answer a reviewer's questions, on real runs of the tiny model whose goldens were
planted with one case of each verdict: which condition a near tie failed (with both numbers), the
bound of a sampled flip, counts per verdict, drift sizes and draw margins in the Markdown report,
near ties of the draw in ``llm-golden show``, the HTML report's filters and ``llm-golden compare``
(both clicked through in a real browser)."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import pytest

SUITE = '''
from pytest_llmdeterminism import deterministic

GREEDY = (("tie_ok", "Once upon a time"), ("tie_bad", "Once upon a time"), ("drift", "The weather today is"),
          ("regression", "Q: What is the capital of Japan? A:"), ("steady", "Hello there"), {extra})


@deterministic(max_new_tokens=6, tolerance="near_tie(margin=0.1, atol=0.01)")
def test_greedy(llm_model, golden_tokens):
    for name, prompt in GREEDY:
        golden_tokens.check(llm_model.generate(prompt), name=name)


@deterministic(seed=7, max_new_tokens=6)
def test_story(llm_model, golden_tokens):
    for name in ("flip", "confident"):
        golden_tokens.check(llm_model.generate("Once upon a time", do_sample=True, temperature=1.5),
                            name=name)
'''
GOLDEN = "__golden__/test_story.json"


def _flip(entry: dict, step: int, margin: float | None = None) -> None:
    """The golden's token at ``step`` replaced by its runner-up (the run keeps the real one)."""
    recorded = entry["steps"][step]
    recorded["token"] = next(token for token, _ in recorded["top"] if token != recorded["token"])
    if margin is not None:
        recorded["margin"] = margin


def _plant(golden: Path) -> None:
    """One case per verdict, planted in the recorded goldens: a near tie that flips with no drift
    before it (passes near_tie) and one with drift 0.24 before it (fails on atol 0.01); a drift of
    0.5 with the same tokens; a confident greedy flip; a sampled flip at a near tie of the draw
    (draw margin 0.001 < 0.05 / T 1.5), and a sampled flip whose greedy margin is large (9.5) but
    whose draw margin (0.119) is small: a REGRESSION less confident than the greedy one."""
    data = json.loads(golden.read_text())
    entries = {key: next(iter(variants.values())) for key, variants in data["goldens"].items()}
    for key in ("test_greedy::tie_ok", "test_greedy::tie_bad"):
        _flip(entries[key], 2, margin=0.05)
    entries["test_greedy::tie_bad"]["steps"][1]["top"][1][1] -= 0.24
    entries["test_greedy::drift"]["steps"][1]["hash"] = "0" * 16
    entries["test_greedy::drift"]["steps"][1]["top"][1][1] -= 0.5
    _flip(entries["test_greedy::regression"], 0)
    _flip(entries["test_story::flip"], 1)
    entries["test_story::flip"]["draw_margins"][1] = 0.001
    _flip(entries["test_story::confident"], 1, margin=9.5)
    entries["test_story::confident"]["draw_margins"][1] = 0.119
    golden.write_text(json.dumps(data))


@pytest.fixture
def two_runs(suite):
    """Run A (every check IDENTICAL, writes a.json), then run B against the planted goldens, with
    the check 'gone' dropped and a new one, 'fresh', added (writes b.json, b.md, b.html)."""
    suite.makepyfile(test_story=SUITE.format(extra='("gone", "Good morning")'))
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=2)
    suite.runpytest("--llm-report=a.json").assert_outcomes(passed=2)
    _plant(suite.path / GOLDEN)
    suite.makepyfile(test_story=SUITE.format(extra='("fresh", "Good morning")'))
    after = suite.runpytest("--llm-report=b.json", "--llm-report=b.md", "--llm-report=b.html")
    after.assert_outcomes(failed=2)
    return suite, after


def test_failures_name_the_condition_that_failed_and_the_markdown_ranks_by_the_deciding_margin(
        two_runs, capsys):
    suite, run = two_runs
    run.stdout.fnmatch_lines_random([
        # the near tie failed on its drift: that condition first, both numbers, then the margin
        ("E*'test_greedy::tie_bad': TIE_FLIP at step 2 — expected * (id *), got * (id *); drift before the "
         "flip 0.24 > atol 0.01 (golden margin 0.05 < tie margin 0.1: near tie, which alone would pass) — "
         "fails under 'near_tie(margin=0.1, atol=0.01)'"),
        ("E*'test_greedy::drift': LOGIT_DRIFT at step 1 — same tokens, logits differ; max |Δlogprob| in "
         "top-k 0.5 > atol 0.01 — fails under 'near_tie(margin=0.1, atol=0.01)'"),
        # a sampled flip prints the bound it was judged against
        ("E*'test_story::flip': SAMPLE_FLIP at step 1 — * (sampled); draw margin 0.001 < bound 0.0333 "
         "(tie margin 0.05 / T 1.5): a near tie of the draw — fails under 'exact'"),
        ("E*'test_story::confident': REGRESSION at step 1 — * (sampled); draw margin 0.119 >= bound 0.0333 "
         "(tie margin 0.05 / T 1.5): not a near tie of the draw — fails under 'exact'"),
        ("golden checks: 1 IDENTICAL, 1 LOGIT_DRIFT (failed), 1 MISSING (failed), 2 REGRESSION (failed), "
         "1 SAMPLE_FLIP (failed), 2 TIE_FLIP (1 failed)"),
    ])
    markdown = (suite.path / "b.md").read_text()
    table = markdown.split("### Failing checks (most confident divergence first)")[1].split("###")[0]
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in table.splitlines()
            if line.startswith("| `")]
    by_name = {row[1].strip("`"): row for row in rows}
    assert by_name["test_greedy::drift"][3:6] == ["1", "", "0.5"]  # step, margin, drift
    assert by_name["test_greedy::tie_bad"][3:6] == ["2", "0.05", "0.24"]
    assert by_name["test_story::confident"][4] == "draw 0.119 (T 1.5)"
    # most confident first, on one scale: the margin over the bound that decided the verdict
    # (6.45 / 0.1 before 0.119 / (0.05 / 1.5), though the sampled golden's greedy margin is 9.5)
    assert [row[1].strip("`") for row in rows][:4] == [
        "test_greedy::regression", "test_story::confident", "test_greedy::tie_bad", "test_story::flip"]

    from pytest_llmdeterminism.cli.show import show

    capsys.readouterr()
    assert show(suite.path / GOLDEN) == 0
    shown = capsys.readouterr().out
    story = shown[shown.index("test_story::flip [cpu/float32]"):]
    flagged = "<- near tie of the draw (< 0.0333 = tie margin 0.05 / T 1.5)"
    draws = json.loads((suite.path / GOLDEN).read_text())["goldens"]["test_story::flip"]["cpu/float32"][
        "draw_margins"]
    assert story.split("\n\n")[0].count(flagged) == sum(draw < 0.05 / 1.5 for draw in draws) >= 1
    assert "draw    0.001  " + flagged in story


def test_the_reviewers_reports_lead_with_the_run_the_next_steps_and_the_time_per_test(two_runs):
    suite, run = two_runs
    import torch
    import transformers

    markdown = (suite.path / "b.md").read_text()
    lead = markdown.split("| verdict | checks | failed |")[0]
    run_line = next(line for line in lead.splitlines() if line.startswith("**Run:** "))
    for part in ("model: builtin:tiny", f"torch: {torch.__version__}",
                 f"transformers: {transformers.__version__}", "shape: 4x32", "dtype: float32"):
        assert part in run_line
    # the next steps are the commands the failures print, verbatim
    steps = lead.split("### Next steps")[1].split("```text")[1].split("```")[0].strip().splitlines()
    accepts = [line.strip() for line in steps if line.startswith("  pytest ")]
    assert accepts == ["pytest test_story.py::test_greedy --llm-golden-update",
                       "pytest test_story.py::test_story --llm-golden-update"]
    for command in accepts:
        assert f"Accept with: {command}" in run.stdout.str() or f"Accept all of them with: {command}" in \
            run.stdout.str()
    times = markdown.split("### Time per test (slowest first; ")[1].split("###")[0]
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in times.splitlines()
            if line.startswith("| `")]
    assert sorted((row[0], row[1], row[2]) for row in rows) == [
        ("`test_story.py::test_greedy`", "6", "4"), ("`test_story.py::test_story`", "2", "2")]
    assert [float(row[3]) for row in rows] == sorted((float(row[3]) for row in rows), reverse=True)

    page = (suite.path / "b.html").read_text()
    head = page.split('<div class="filters">')[0]
    assert f"torch: {torch.__version__}" in head and "shape: 4x32" in head
    assert "<h2>Next steps</h2>" in head and "pytest test_story.py::test_greedy --llm-golden-update" in head
    assert "<h2>Time per test (slowest first; " in head and "<code>test_story.py::test_story</code>" in head
    # each token's tooltip: its logprob and the top 5 ([id, logprob] pairs)
    titles = re.findall(r'<span class="tok[^"]*" title="([^"]*)"', page)
    assert titles and all("logprob " in title and "\ntop 5: " in html.unescape(title) for title in titles)
    # cards riskiest first: failing before passing, REGRESSION first, the most confident first
    cards = re.findall(r'<section class="(\w+)".*?<span class="verdict">(\w+)</span> <code>[^<]*</code> — '
                       r"<code>([^<]*)</code>", page)
    assert [name for _, _, name in cards][:2] == ["test_greedy::regression", "test_story::confident"]
    statuses = [status for status, _, _ in cards]
    assert statuses == sorted(statuses, key="failed passed".index)


def _chromium() -> tuple[str, str] | str:
    """Debian's chromium and chromedriver, or why the browser test cannot run."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    found = [shutil.which(name) for name in ("chromium", "chromedriver")]
    if not all(found):
        return "chromium or chromedriver is not installed (apt-get install chromium chromium-driver)"
    return found[0] or "", found[1] or ""


def _visible(driver, selector: str, column: int) -> list[str]:
    """The text of the ``column``-th <code> of each row the page shows."""
    from selenium.webdriver.common.by import By

    return [row.find_elements(By.TAG_NAME, "code")[column].text
            for row in driver.find_elements(By.CSS_SELECTOR, selector) if row.is_displayed()]


def test_compare_lists_what_moved_and_both_pages_filter_in_a_real_browser(two_runs, tmp_path, capsys,
                                                                         monkeypatch):
    suite, _ = two_runs
    from pytest_llmdeterminism.cli import main

    capsys.readouterr()
    monkeypatch.chdir(suite.path)
    assert main(["compare", "a.json", "b.json", "--html", "compare.html"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "compared a.json -> b.json: 6 changed verdict, 1 appeared, 1 disappeared, 1 unchanged"
    moved = [line.split() for line in out[1:-1]]
    assert [(words[0], words[-1]) for words in moved] == [
        ("changed", "['test_greedy::regression']"), ("changed", "['test_story::confident']"),
        ("changed", "['test_story::flip']"), ("changed", "['test_greedy::tie_bad']"),
        ("changed", "['test_greedy::tie_ok']"), ("changed", "['test_greedy::drift']"),
        ("appeared", "['test_greedy::fresh']"), ("disappeared", "['test_greedy::gone']")]
    assert out[1].split("->")[0].split()[1:] == ["IDENTICAL"] and "REGRESSION (failed)" in out[1]
    assert out[-1] == "wrote compare.html"
    assert main(["compare", "a.json", "a.json"]) == 0
    capsys.readouterr()
    # checks that fail in both runs are listed (nothing moved: the exit status stays 0)
    assert main(["compare", "b.json", "b.json"]) == 0
    still = capsys.readouterr().out.splitlines()
    assert still[0].endswith("0 changed verdict, 0 appeared, 0 disappeared, 8 unchanged, 6 failing in both")
    assert [line.split()[-1] for line in still[1:] if line.startswith("  still failing")] == [
        "['test_greedy::regression']", "['test_story::confident']", "['test_greedy::fresh']",
        "['test_story::flip']", "['test_greedy::tie_bad']", "['test_greedy::drift']"]
    # run B -> run A: every change is for the better, and coloured so
    assert main(["compare", "b.json", "a.json", "--html", "better.html"]) == 1
    better = (suite.path / "better.html").read_text()
    assert better.count('<tr class="changed better') == 6 and "changed (better)" in better
    assert 'class="changed worse' not in better
    (suite.path / "notes.json").write_text('{"a": 1}')
    assert main(["compare", "a.json", "notes.json"]) == 2
    assert "notes.json is not a pytest-llmdeterminism JSON report" in capsys.readouterr().err

    found = _chromium()
    if isinstance(found, str):
        pytest.skip(f"compare's text was checked; the HTML filters were not: {found}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    options.binary_location = found[0]
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=found[1]))
    try:
        driver.get((suite.path / "b.html").as_uri())

        def shown_after(button: str) -> list[str]:
            driver.find_element(By.CSS_SELECTOR, f'.filters button[data-filter="{button}"]').click()
            return _visible(driver, "section[data-groups]", 1)

        everything = shown_after("all")
        assert len(everything) == 8 and driver.find_element(By.ID, "shown").text == "8 of 8 shown"
        assert shown_after("regression") == ["test_greedy::regression", "test_story::confident"]
        assert shown_after("near-tie") == ["test_story::flip", "test_greedy::tie_bad", "test_greedy::tie_ok"]
        assert shown_after("drift") == ["test_greedy::drift"]
        assert shown_after("changed") == [name for name in everything if name != "test_greedy::steady"]
        assert "test_greedy::tie_ok" not in shown_after("failed")
        shown_after("all")
        driver.find_element(By.ID, "search").send_keys("Japan")  # the regression's prompt
        assert _visible(driver, "section[data-groups]", 1) == ["test_greedy::regression"]
        assert shown_after("drift") == []  # the search and the filter both apply
        assert driver.find_element(By.ID, "shown").text == "0 of 8 shown"
        # the filter and the search are in the address: a reload (or a link) opens the page as it was
        assert driver.current_url.endswith("#filter=drift&search=Japan")
        driver.get((suite.path / "b.html").as_uri() + "#filter=regression&search=Japan")
        assert _visible(driver, "section[data-groups]", 1) == ["test_greedy::regression"]
        assert driver.find_element(By.ID, "search").get_attribute("value") == "Japan"
        pressed = driver.find_element(By.CSS_SELECTOR, '.filters button[aria-pressed="true"]')
        assert pressed.get_attribute("data-filter") == "regression"

        driver.set_window_size(1400, 900)
        driver.get((suite.path / "compare.html").as_uri())
        assert len(_visible(driver, "tr[data-groups]", 1)) == 9
        # no sideways scrolling at 1400 px; a change for the worse in red, for the better in green
        assert driver.execute_script("return document.documentElement.scrollWidth <= "
                                     "document.documentElement.clientWidth")
        worse = driver.find_element(By.CSS_SELECTOR, "tr.changed.worse td")
        assert worse.value_of_css_property("color") in ("rgba(221, 51, 51, 1)", "rgb(221, 51, 51)")
        driver.get((suite.path / "better.html").as_uri())
        better = driver.find_element(By.CSS_SELECTOR, "tr.changed.better td")
        assert better.value_of_css_property("color") in ("rgba(26, 127, 55, 1)", "rgb(26, 127, 55)")
        driver.get((suite.path / "compare.html").as_uri())
        driver.find_element(By.CSS_SELECTOR, '.filters button[data-filter="appeared"]').click()
        assert _visible(driver, "tr[data-groups]", 1) == ["test_greedy::fresh"]
        driver.find_element(By.CSS_SELECTOR, '.filters button[data-filter="disappeared"]').click()
        assert _visible(driver, "tr[data-groups]", 1) == ["test_greedy::gone"]
        driver.find_element(By.CSS_SELECTOR, '.filters button[data-filter="changed"]').click()
        assert len(_visible(driver, "tr[data-groups]", 1)) == 6
        driver.find_element(By.ID, "search").send_keys("SAMPLE_FLIP")
        assert _visible(driver, "tr[data-groups]", 1) == ["test_story::flip"]
    finally:
        driver.quit()
