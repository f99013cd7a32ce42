"""What a failing run says to run instead (reporting/hints.py), built without a run: another thread
count names ``llm_threads``, not a re-recording; the upgrade advice needs a failing check on another
checkpoint; the CI page shows the advice the code prints."""


from pytest_llmdeterminism.reporting.hints import across_environments, after_model_change
from pytest_llmdeterminism.reporting.records import CheckRecord
from tests.helpers import ROOT


def test_another_thread_count_names_llm_threads_not_a_re_recording():
    hint = across_environments([("torch_threads", 2, 1)], tolerance="near_tie(margin=0.05, atol=0.001)",
                               explicit=False, run_variant="cpu/float32")
    assert hint.startswith("compared across environments: torch_threads 2 → 1;")
    assert ("the golden ran on 2 thread(s), this run on 1 (under pytest-xdist each worker takes its share "
            "of the cores, cores // workers). Pin it so that serial and pytest-xdist runs compute the same "
            "bits: --llm-threads=2 (pytest.ini: llm_threads = 2; pyproject.toml: llm_threads = \"2\")"
            ) in hint
    assert "re-record" not in hint
    # with another field changed too, the thread count alone does not explain it
    both = across_environments([("torch_threads", 2, 1), ("torch", "2.12.0", "2.13.0")], tolerance="exact",
                               explicit=False, run_variant="cpu/float32")
    assert "llm_threads" not in both and "after an upgrade (torch)" in both


def _check(verdict, passed, changed, drift=0.0):
    return CheckRecord(name="k", variant="cpu/float32", verdict=verdict, passed=passed,
                       changed_fingerprint=changed, max_logprob_delta=drift, tie_margin=0.05)


def test_the_upgrade_advice_needs_a_failing_check_on_another_checkpoint():
    weights = {"weights_hash": ("a", "b")}
    assert after_model_change([_check("LOGIT_DRIFT", True, weights, 0.01)], candidates=None) == []
    assert after_model_change([_check("REGRESSION", False, {"torch": ("1", "2")})], candidates=None) == []
    checks = [_check("REGRESSION", False, weights), _check("LOGIT_DRIFT", False, weights, 0.013)]
    lines = after_model_change(checks, candidates=None)
    assert lines[0].startswith("the model changed (weights_hash) under 2 failing check(s) (1 LOGIT_DRIFT, "
                               "1 REGRESSION)")
    assert "--llm-tolerance='near_tie(margin=0.05, atol=0.02)'" in lines[1]
    assert lines[2] == ("  to see what moved, case by case: llm-golden diff llm-candidates (rerun with "
                        "--llm-golden-artifacts=llm-candidates to write them), or llm-golden review "
                        "llm-candidates")


def test_the_ci_page_shows_the_advice_the_code_prints():
    page = (ROOT / "docs" / "ci" / "index.md").read_text(encoding="utf-8")
    checks = [_check("LOGIT_DRIFT", False, {"weights_hash": ("a", "b")}, 0.0439)] * 6
    advice = after_model_change(checks, candidates="llm-candidates")
    assert [line for line in advice if line not in page] == []
    threads = across_environments([("torch_threads", 2, 1)], tolerance="near_tie(margin=0.05, atol=0.001)",
                                  explicit=False, run_variant="cpu/float32")
    assert threads in page
