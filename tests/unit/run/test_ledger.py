"""The run's ledger, alone: no model, no pytest run."""

from pathlib import Path

from pytest_llmdeterminism.goldens.store import read
from pytest_llmdeterminism.judge.decision import Written
from pytest_llmdeterminism.reporting.recorder import TestOutcomes
from pytest_llmdeterminism.run.ledger import Ledger
from tests.helpers import ROOT


def recorded_payload(tmp_path: Path, key: str) -> dict:
    """A real recorded golden: the example suite's first entry, recorded again under ``key``."""
    from pytest_llmdeterminism.goldens import schema

    examples = ROOT / "examples" / "__golden__" / "test_tiny_model.json"
    entry = next(iter(read(examples).values()))["cpu/float32"]
    outcomes = TestOutcomes()
    outcomes.record(tmp_path / "g.json", key, schema.from_entry(entry), written=Written.RECORDED)
    payload = outcomes.to_json()
    assert payload is not None
    return payload


def test_a_test_that_failed_after_recording_keeps_nothing(tmp_path):
    ledger = Ledger()
    for nodeid in ("t.py::ok", "t.py::bad"):
        ledger.collect(recorded_payload(tmp_path, nodeid.split("::")[1]), nodeid)
        ledger.test_finished(nodeid, "call", "passed")
    ledger.test_finished("t.py::bad", "teardown", "failed")  # a failing teardown after a passing call
    keep, held = ledger.goldens_to_write()
    assert list(keep[str(tmp_path / "g.json")]) == ["ok"] and held == ["t.py::bad"]


def test_an_attempt_that_will_be_retried_is_not_an_outcome():
    ledger = Ledger()
    ledger.test_finished("t.py::flaky", "call", "rerun")  # pytest-rerunfailures' intermediate attempt
    ledger.test_finished("t.py::flaky", "call", "passed")
    assert ledger.outcomes == {"t.py::flaky": "passed"}


def test_each_attempt_of_a_rerun_test_starts_clean_and_sees_the_earlier_outputs(tmp_path):
    import dataclasses

    from pytest_llmdeterminism.goldens import schema
    from pytest_llmdeterminism.judge.compare import Verdict
    from pytest_llmdeterminism.judge.decision import contradicted

    examples = ROOT / "examples" / "__golden__" / "test_tiny_model.json"
    generation = schema.from_entry(next(iter(read(examples).values()))["cpu/float32"])
    drifted = dataclasses.replace(generation, step_hashes=("0" * 16,) * len(generation.step_hashes))
    outcomes = TestOutcomes()
    outcomes.record(tmp_path / "g.json", "k", generation, written=Written.RECORDED)
    assert contradicted(outcomes.earlier("k"), drifted) is None  # a first attempt has nothing to contradict
    outcomes.end_attempt()
    assert outcomes.to_json() is None and outcomes.attempt == 2
    assert contradicted(outcomes.earlier("k"), generation) is None
    earlier, between = contradicted(outcomes.earlier("k"), drifted)
    assert (earlier.number, str(earlier.outcome), between.verdict) == (1, "recorded", Verdict.LOGIT_DRIFT)


def test_counts_are_honest_about_held_back_goldens_and_updates_name_what_they_replaced(tmp_path):
    from pytest_llmdeterminism.goldens import schema
    from pytest_llmdeterminism.judge.compare import Verdict
    from pytest_llmdeterminism.reporting.terminal import summary

    examples = ROOT / "examples" / "__golden__" / "test_tiny_model.json"
    generation = schema.from_entry(next(iter(read(examples).values()))["cpu/float32"])
    ledger = Ledger()
    for nodeid, verdict, outcome in (("t.py::ok", Verdict.REGRESSION, "passed"),
                                     ("t.py::drift", Verdict.LOGIT_DRIFT, "passed"),
                                     ("t.py::bad", Verdict.REGRESSION, "failed")):
        outcomes = TestOutcomes()
        outcomes.record(tmp_path / "g.json", nodeid.split("::")[1], generation, written=Written.UPDATED,
                        overwrote=verdict)
        ledger.collect(outcomes.to_json(), nodeid)
        ledger.test_finished(nodeid, "call", outcome)
    lines = summary(ledger.outcome_counts(), ["g.json (2 goldens)"], [], overwritten=ledger.overwritten())
    assert lines[0] == "golden checks: 1 not recorded, 2 updated (over 1 LOGIT_DRIFT, 1 REGRESSION)"
    assert lines[2].startswith("updated 1 golden(s) over a REGRESSION or INPUT_CHANGED")
    assert lines[3:] == ["  REGRESSION    t.py::ok ['ok']"]  # not the held-back one, not the drift


def test_the_records_on_a_retried_attempts_teardown_report_are_not_the_tests(tmp_path):
    """pytest-rerunfailures logs a retried attempt's teardown as passed; its records are not the test's."""
    ledger = Ledger()
    for outcome in ("rerun", "passed"):  # the first attempt's call is retried, the second passes
        for when, reported in (("setup", "passed"), ("call", outcome), ("teardown", "passed")):
            ledger.test_finished("t.py::flaky", when, reported, 0.5)
        if not ledger.retried("t.py::flaky"):
            ledger.collect(recorded_payload(tmp_path, "flaky"), "t.py::flaky")
    assert len(ledger.recorded["t.py::flaky"]) == 1 and ledger.outcomes == {"t.py::flaky": "passed"}
