"""A candidate is untrusted: one that `diff` reads IDENTICAL is never written by `accept` (the golden
stays byte for byte), one that differs from the golden only in fields a check does not compare
(its fingerprint, its text) is its own finding, FIELDS_CHANGED; and nothing a command prints from
an artifact reaches the terminal with a control character in it."""

import json

from pytest_llmdeterminism import cli
from pytest_llmdeterminism.errors import printable
from tests.helpers import DATA

VALID = (DATA / "test_tiny_model.intel-avx512-native-0.1.0.json").read_bytes()
GOLDEN = "tests/__golden__/test_x.json"


def project(tmp_path, candidate: bytes, name: str = GOLDEN):
    """A root holding the recorded golden file, and a candidates folder holding ``candidate``."""
    root, candidates = tmp_path / "root", tmp_path / "candidates"
    (root / GOLDEN).parent.mkdir(parents=True)
    (root / GOLDEN).write_bytes(VALID)
    (root / "tox.ini").write_text("[pytest]\n")
    (candidates / name).parent.mkdir(parents=True)
    (candidates / name).write_bytes(candidate)
    return root, candidates


def forged(**changes) -> bytes:
    """The recorded file with test_capital's entry changed: ``fingerprint`` fields, or ``text``."""
    document = json.loads(VALID)
    entry = document["goldens"]["test_capital"]["cpu/float32"]
    entry["fingerprint"].update(changes.pop("fingerprint", {}))
    entry.update(changes)
    return json.dumps(document, indent=2).encode()


def test_accept_leaves_a_golden_that_diff_reads_identical_byte_for_byte(tmp_path, capsys):
    """Before, accept rewrote every golden of the file from the candidate, IDENTICAL ones included."""
    root, candidates = project(tmp_path, VALID)
    before = (root / GOLDEN).read_bytes()
    (root / GOLDEN).write_bytes(before.replace(b'{\n  "goldens"', b'{"goldens"', 1))  # formatted by hand
    kept = (root / GOLDEN).read_bytes()
    assert cli.main(["accept", str(candidates), "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "8 case(s) IDENTICAL to the project's golden: nothing to accept, left as they are" in out
    assert "\naccepted " not in out
    assert (root / GOLDEN).read_bytes() == kept
    assert cli.main(["accept", str(candidates), "--root", str(root), "--only", "IDENTICAL"]) == 0
    assert "summary: accepted 0 case(s), left 0 in" in capsys.readouterr().out
    assert (root / GOLDEN).read_bytes() == kept


def test_a_forged_fingerprint_is_its_own_finding_and_accept_takes_it_only_by_name(tmp_path, capsys,
                                                                                   monkeypatch):
    """Before, a candidate whose torch version was forged read IDENTICAL ("nothing needs review") and
    accept wrote it: every later check of it was judged across environments, near_tie."""
    root, candidates = project(tmp_path, forged(fingerprint={"torch": "9.9.9"}))
    monkeypatch.chdir(root)
    assert cli.main(["diff", str(candidates)]) == 1
    out = capsys.readouterr().out
    assert (f"FIELDS_CHANGED {GOLDEN} ['test_capital']['cpu/float32']  same tokens and logit hashes, but "
            "fingerprint.torch '2.13.0+cpu' -> '9.9.9': no run writes that") in out
    assert out.splitlines()[-1] == ("summary: 1 FIELDS_CHANGED, 7 IDENTICAL; 1 case(s) need review "
                                    "(--fail-on=regression)")
    before = (root / GOLDEN).read_bytes()
    assert cli.main(["accept", str(candidates)]) == 1  # a plain accept of the folder leaves it
    out = capsys.readouterr().out
    assert f"left     FIELDS_CHANGED {GOLDEN} ['test_capital']['cpu/float32']" in out
    assert (root / GOLDEN).read_bytes() == before
    assert cli.main(["accept", str(candidates), "--only", "FIELDS_CHANGED"]) == 0
    out = capsys.readouterr().out
    assert f"accepted FIELDS_CHANGED {GOLDEN} ['test_capital']['cpu/float32']" in out
    written = json.loads((root / GOLDEN).read_text())["goldens"]["test_capital"]["cpu/float32"]
    assert written["fingerprint"]["torch"] == "9.9.9"  # chosen by name, as the reviewer asked


def test_an_edited_text_is_its_own_finding_in_diff(tmp_path, capsys):
    root, candidates = project(tmp_path, forged(text=" Lyon."))
    assert cli.main(["diff", str(root / "tests"), str(candidates / "tests")]) == 1
    assert "FIELDS_CHANGED __golden__/test_x.json ['test_capital']['cpu/float32']  same tokens and " \
           "logit hashes, but text ' Paris.' -> ' Lyon.'" in capsys.readouterr().out


def test_printable_escapes_what_would_steer_a_terminal_or_a_ci_log():
    assert printable("tests/__golden__/test_x.json") == "tests/__golden__/test_x.json"
    assert printable("a\x1b]52;c;ZXZpbA==\x07b") == "a\\x1b]52;c;ZXZpbA==\\x07b"  # OSC 52: the clipboard
    assert printable("x\r\n::set-output name=a::b") == "x\\r\\n::set-output name=a::b"
    assert printable("\x9b2J \u202eevil\u2066 Ünïcödé — …") == "\\x9b2J \\u202eevil\\u2066 Ünïcödé — …"


def test_a_candidate_file_name_with_escapes_and_newlines_is_printed_escaped(tmp_path, capsys):
    """Before, a file name carrying ESC or a newline was printed raw: a review line could be
    rewritten, or a line of the candidate's choosing started (`::set-output`, `##vso[`)."""
    name = "tests/__golden__/x\x1b[2K\r\n##vso[task.setvariable]\u202e.json"
    root, candidates = project(tmp_path, VALID, name=name)
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_bytes(VALID)
    assert cli.main(["diff", str(root / "tests"), str(candidates / "tests")]) == 0
    out = capsys.readouterr().out
    shown = "__golden__/x\\x1b[2K\\r\\n##vso[task.setvariable]\\u202e.json"
    assert f"IDENTICAL      {shown} ['test_capital']['cpu/float32']" in out
    lines = out.split("\n")
    assert all("\x1b" not in line and "\r" not in line and not line.startswith("##") for line in lines)
