"""A JSON report is a CI artifact: `llm-golden compare` and `merge` read its strings as the schema
says a run writes them (a known verdict, test ids without control characters or CI log commands),
and refuse one that is not, naming the file, before anything of it is printed."""

import pytest

from pytest_llmdeterminism import cli
from pytest_llmdeterminism.reporting.records import CheckRecord
from tests.helpers.reports import write_report

TEST = "test_a.py::test_capital"


def check(**changes) -> CheckRecord:
    fields = {"test": TEST, "name": "test_capital", "variant": "cpu/float32", "verdict": "IDENTICAL",
              "passed": True, **changes}
    return CheckRecord(**fields)


def test_two_reports_as_a_run_writes_them_compare(tmp_path, capsys):
    before = write_report(tmp_path / "a.json", [check()], tests=(TEST,))
    after = write_report(tmp_path / "b.json", [check(verdict="REGRESSION", passed=False)], tests=(TEST,))
    assert cli.main(["compare", str(before), str(after)]) == 1
    assert "  changed      IDENTICAL                -> REGRESSION (failed)      test_a.py::test_capital " \
           "['test_capital']" in capsys.readouterr().out


@pytest.mark.parametrize(("changes", "said"), [
    ({"verdict": "FINE"}, "has verdict 'FINE', which is none of FIELDS_CHANGED, IDENTICAL, INPUT_CHANGED"),
    ({"test": "test_a.py::x\x1b]52;c;ZXZpbA==\x07"},
     "a check's test id 'test_a.py::x\\x1b]52;c;ZXZpbA==\\x07' holds a control character"),
    ({"test": "test_a.py::x\n::set-output name=a::b"}, "holds a control character"),
    ({"name": "::add-mask::x"}, "a check's golden key '::add-mask::x' holds a control character or a CI log"),
    ({"name": "k ##vso[task.setvariable variable=x]y"}, "a check's golden key 'k ##vso[task"),
    ({"variant": "cpu/\u202efloat32"}, "a check's variant 'cpu/\\u202efloat32' holds a control character"),
])
@pytest.mark.parametrize("command", ["compare", "merge"])
def test_a_report_string_no_run_writes_is_refused_naming_the_file(tmp_path, capsys, changes, said, command):
    """Before, compare and merge printed such strings raw (an escape sequence reached the terminal, a
    line of the report's choosing reached the CI log) and took any verdict string."""
    good = write_report(tmp_path / "a.json", [check()], tests=(TEST,))
    bad = write_report(tmp_path / "b.json", [check(**changes)], tests=(TEST,))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    arguments = [str(good), str(bad)] if command == "compare" else [str(bad), "--root", str(tmp_path)]
    assert cli.main([command, *arguments]) == 2
    out, err = capsys.readouterr()
    assert f"{bad} is not a report this plugin wrote: " in err and said in err
    assert "\x1b" not in out + err and "\u202e" not in out + err
    assert not any(line.startswith(("::", "##")) for line in (out + err).splitlines())
