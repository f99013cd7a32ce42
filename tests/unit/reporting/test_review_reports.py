"""Report pieces a reviewer reads, built without a run: the summary counts each verdict once, saying
how many failed, and the HTML score card shows one moved position per line (the reports of real
runs: tests/pytester/test_review_reports_runs.py)."""

from __future__ import annotations

from pytest_llmdeterminism.judge.compare import Verdict
from pytest_llmdeterminism.judge.decision import Outcome, Written
from pytest_llmdeterminism.reporting.terminal import summary


def test_summary_counts_each_verdict_once_saying_how_many_failed():
    counts = {Outcome(Verdict.TIE_FLIP, True): 1, Outcome(Verdict.TIE_FLIP, False): 1,
              Outcome(Verdict.REGRESSION, False): 2, Outcome(Verdict.IDENTICAL, True): 3,
              Outcome(Verdict.REGRESSION, False, Written.UPDATED): 1}
    assert summary(counts, [], [])[0] == ("golden checks: 3 IDENTICAL, 2 REGRESSION (failed), "
                                          "2 TIE_FLIP (1 failed), 1 updated (over 1 REGRESSION)")


def test_the_html_score_card_shows_one_moved_position_per_line():
    import re

    from pytest_llmdeterminism.reporting import documents
    from pytest_llmdeterminism.reporting.records import CheckRecord, MovedPosition

    def moved(position: int, piece: str, old: float, new: float) -> MovedPosition:
        return MovedPosition(position=position, token=100 + position, piece=piece, expected_logprob=old,
                             actual_logprob=new, expected_rank=1, actual_rank=1, rank_margin=2.0)

    check = CheckRecord(test="test_s.py::test_score", name="test_score", variant="cpu/float32",
                        verdict="REGRESSION", passed=False, kind="score", log_likelihood=(-3.5, -4.25),
                        moved_positions=[moved(0, " Paris", -0.5, -1.0), moved(2, " is", -1.0, -1.5)])
    page = documents.run_report_html(documents.run_report([check], []))
    score = re.search(r"<ul class=score>(.*?)</ul>", page)
    assert score is not None
    assert re.findall(r"<li>(.*?)</li>", score.group(1)) == [
        "log-likelihood -3.500000 → -4.250000 (Δ -0.75)",
        "position 0 &#x27; Paris&#x27; (id 100): -0.500000 → -1.000000",
        "position 2 &#x27; is&#x27; (id 102): -1.000000 → -1.500000"]
