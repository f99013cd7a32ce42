"""The kinds of golden as plug-ins (issue 50): the registry answers for every record and every stored
entry, nothing outside goldens/kinds/ asks which kind it holds, every golden file committed in the
repository reads and writes back byte for byte (with and without a plugged-in kind registered), and
a plugged-in kind's entries keep the file's checks (its duplicate keys, its own validation)."""

from __future__ import annotations

import ast
import contextlib
import json
import subprocess
from pathlib import Path

import pytest

from pytest_llmdeterminism.errors import GoldenFileError
from pytest_llmdeterminism.generation import Generation, Score
from pytest_llmdeterminism.goldens import codec, kinds, schema, store
from pytest_llmdeterminism.judge.compare import Verdict, compare, kind_of
from tests.helpers.choice_kind import CHOICE, ChoiceEntry, choose, registered
from tests.helpers.strategies import sample_generation, sample_score

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "pytest_llmdeterminism"


def _committed_goldens() -> list[str]:
    """Every golden file the repository holds: tracked JSON that declares a golden format."""
    listed = subprocess.run(["git", "ls-files", "*.json"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.split()
    return [name for name in listed if codec.declares_golden_format((ROOT / name).read_bytes())]


COMMITTED = _committed_goldens()


def test_the_repository_holds_goldens_of_every_format():
    headers = {json.loads((ROOT / name).read_text())["schema"] for name in COMMITTED}
    assert headers == {1, "pytest-llmdeterminism/golden/2", "pytest-llmdeterminism/golden/3"}, COMMITTED


@pytest.mark.parametrize("plugged_in", [False, True], ids=["built-in kinds", "a kind plugged in"])
@pytest.mark.parametrize("name", COMMITTED)
def test_every_committed_golden_reads_and_writes_back_byte_for_byte(name, plugged_in):
    """A file of the current formats (2, 3) is written back with every byte it has; a format-1 file
    is rewritten in format 2, with only its header changed (and its step lines' spacing where an old
    version wrote them spaced), and that rewrite writes back byte for byte."""
    data = (ROOT / name).read_bytes()
    with registered() if plugged_in else contextlib.nullcontext():
        goldens = codec.parse(ROOT / name, data)
        written = codec.dumps(goldens).encode()
        assert codec.dumps(codec.parse(ROOT / name, written)).encode() == written
    assert codec.parse(ROOT / name, written) == goldens
    if json.loads(data)["schema"] != 1:
        assert written == data
    else:
        assert _canonical(written) == _canonical(data)


def _canonical(text: bytes) -> list[str]:
    """The file's lines without its header, each JSON value compacted."""
    lines = []
    for line in text.decode().splitlines():
        if line.startswith(('  "schema"', '  "logit_hash"')):
            continue
        body = line.strip().removesuffix(",")
        try:
            compact = json.dumps(json.loads(body), separators=(",", ":"))
            lines.append(compact if body.startswith('{"') else body)
        except json.JSONDecodeError:
            lines.append(body)
    return lines


@pytest.mark.parametrize("name", [n for n in COMMITTED if json.loads((ROOT / n).read_text())["schema"] != 1])
def test_committed_goldens_take_the_fast_duplicate_key_proof_their_kinds_count(name):
    """The key count of each entry comes from its kind; were one miscounted, every file would take
    the slow exact check, silently."""
    data = (ROOT / name).read_bytes()
    goldens = codec.parse(ROOT / name, data)
    assert codec._no_duplicate_keys(data, goldens, header_keys=1)


# -- the registry ---------------------------------------------------------------------------------

def test_the_registry_answers_for_each_record_and_each_stored_entry():
    assert set(kinds.KINDS) == {"generation", "score", "eval"}
    for record, kind in ((sample_generation(), kinds.GENERATION), (sample_score(), kinds.SCORE)):
        assert kinds.of(record) is kind and kinds.is_record(record) and kind_of(record) == kind.name
        entry = schema.to_struct(schema.to_entry(record))
        assert kinds.named(entry.kind) is kind and schema.from_entry(entry) == record
    assert not kinds.is_record({"prompt": "x"})
    with pytest.raises(TypeError, match="dict is no kind of golden"):
        kinds.of({"prompt": "x"})


def test_records_of_two_kinds_compare_input_changed_by_kind():
    comparison = compare(sample_generation(), sample_score())
    assert comparison.verdict is Verdict.INPUT_CHANGED
    assert comparison.input_changes == (("kind", "generation", "score"),)


def test_a_registered_kind_is_judged_stored_and_read_and_taken_back_whole(tmp_path):
    golden = choose("Sky?", {"blue": -0.1, "grey": -2.5})
    with registered():
        assert kinds.of(golden) is CHOICE and kind_of(golden) == "choice"
        assert compare(golden, choose("Sky?", {"blue": -0.1, "grey": -2.5})).verdict is Verdict.IDENTICAL
        assert compare(golden, choose("Sky?", {"blue": -0.2, "grey": -2.5})).verdict is Verdict.LOGIT_DRIFT
        assert compare(golden, choose("Sky?", {"blue": -3.0, "grey": -2.5})).verdict is Verdict.REGRESSION
        path = tmp_path / "test_m.json"
        store.write(path, {"test_sky": {"cpu/float32": schema.to_entry(golden)},
                           "test_gen": {"cpu/float32": schema.to_entry(sample_generation())}})
        goldens = store.read(path)
        assert isinstance(goldens["test_sky"]["cpu/float32"], ChoiceEntry)
        assert schema.from_entry(goldens["test_sky"]["cpu/float32"]) == golden
        assert isinstance(schema.from_entry(goldens["test_gen"]["cpu/float32"]), Generation)
        assert json.loads(path.read_text())["schema"] == "pytest-llmdeterminism/golden/3"  # its kind's format
    assert set(kinds.KINDS) == {"generation", "score", "eval"} and not kinds.is_record(golden)
    with pytest.raises(TypeError, match="Choice is no kind of golden"):
        compare(golden, golden)
    with pytest.raises(GoldenFileError, match=r"kind: Invalid enum value 'choice' \(an entry's kind is"):
        store.read(path)  # a file holding a kind no one registered names the kinds there are


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda e: e.update(logprobs=[-0.1]), "has 2 options and 1 logprobs"),  # the kind's own rule
    (lambda e: e.update(logprobs=[-0.1, 0.5]), "logprobs[1]: Expected `float` <= 0.0"),  # its field's type
    (lambda e: e.update(colour="blue"), "Object contains unknown field `colour`"),
    (lambda e: e.pop("fingerprint"), "Object missing required field `fingerprint`"),  # every kind's field
])
def test_a_plugged_in_kinds_broken_entry_is_one_golden_file_error(tmp_path, edit, problem):
    with registered():
        entry = schema.to_entry(choose("Sky?", {"blue": -0.1, "grey": -2.5}))
        edit(entry)
        path = tmp_path / "test_m.json"
        path.write_text(json.dumps({"goldens": {"test_sky": {"cpu/float32": entry}},
                                    "schema": "pytest-llmdeterminism/golden/3"}))
        with pytest.raises(GoldenFileError) as raised:
            store.read(path)
    assert "has a malformed golden: ['test_sky']['cpu/float32'] " in str(raised.value)
    assert problem in str(raised.value)


def test_a_plugged_in_kinds_duplicate_key_is_found_by_the_exact_check(tmp_path):
    with registered():
        path = tmp_path / "test_m.json"
        entry = schema.to_entry(choose("Sky?", {"b": -0.1, "g": -2.5}))
        store.write(path, {"test_sky": {"cpu/float32": entry}})
        text = path.read_text().replace('"prompt": "Sky?"', '"prompt": "Sky?",\n        "prompt": "Sea?"')
        path.write_text(text)
        with pytest.raises(GoldenFileError, match="has the key 'prompt' twice in one object"):
            store.read(path)


# -- nothing else asks which kind it holds ----------------------------------------------------------

def _kind_branches(path: Path) -> list[str]:
    """``isinstance(x, Generation)``, ``isinstance(x, (Generation, Score))`` and the like in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance" \
                and len(node.args) == 2:
            named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            if named & {Generation.__name__, Score.__name__}:
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_outside_the_kinds_modules_nothing_branches_on_which_kind_it_holds():
    kinds_folder = PACKAGE / "goldens" / "kinds"
    sources = [p for p in PACKAGE.rglob("*.py") if kinds_folder not in p.parents]
    assert [branch for path in sources for branch in _kind_branches(path)] == []


def test_the_branch_finder_sees_a_branch_on_a_kind(tmp_path):
    """Negative control for the test above."""
    planted = tmp_path / "planted.py"
    planted.write_text("def f(x, y):\n"
                       "    return isinstance(x, (Generation, Score)) or isinstance(y, Score)\n")
    assert _kind_branches(planted) == ["planted.py:2", "planted.py:2"]
