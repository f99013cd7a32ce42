"""Goldens under hostile input, concurrency and crashes; reports that stay valid and inert (the
loader fuzzed with 1000 examples a test: tests/slow/test_golden_fuzz.py)."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import re
import stat
from pathlib import Path

import msgspec
import pytest

from pytest_llmdeterminism import cli
from pytest_llmdeterminism.errors import GoldenFileError
from pytest_llmdeterminism.goldens import atomic, codec, schema, store
from pytest_llmdeterminism.judge.compare import Comparison, Verdict, compare
from pytest_llmdeterminism.judge.decision import Decision
from pytest_llmdeterminism.reporting import documents
from pytest_llmdeterminism.run.session import TestOutcomes
from tests.helpers.golden_safety import BAD_GOLDENS, VALID_GOLDEN
from tests.helpers.strategies import sample_generation


def _valid_document(steps: int = 2) -> dict:
    return json.loads(codec.dumps({"test_x": {"cpu/float32": schema.to_entry(sample_generation(steps))}}))


def _write(tmp_path, document, name="test_m.json"):
    path = tmp_path / name
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def _rejected(path, match):
    before = path.read_bytes()
    with pytest.raises(GoldenFileError, match=match) as info:
        store.read(path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == before  # never rewritten while the error stands
    return info.value


@pytest.mark.parametrize("where", ["goldens", "fingerprint"])
def test_deep_nesting_is_a_golden_file_error_in_checks_and_in_llm_golden_show(tmp_path, capsys, where):
    deep = "[" * 100_000 + "]" * 100_000
    if where == "goldens":
        text = '{"schema": 1, "goldens": ' + deep + "}"
        problem = r"malformed golden: goldens: Expected `object`, got `array`"
    else:
        text = json.dumps(_valid_document()).replace('"fingerprint": {',
                                                     '"fingerprint": {"deep": ' + deep + ", ", 1)
        problem = r"malformed golden: .*fingerprint.*got `array`"
    path = _write(tmp_path, text)
    _rejected(path, problem)
    assert cli.main(["show", str(path)]) == 2
    assert "test_m.json" in capsys.readouterr().err


@pytest.mark.parametrize("literal", ["NaN", "-Infinity", "Infinity", "1e400"])
def test_non_finite_numbers_are_refused(tmp_path, literal):
    text = codec.dumps({"test_x": {"cpu/float32": schema.to_entry(sample_generation())}})
    text = text.replace('"margin":2.4', f'"margin":{literal}', 1)
    assert literal in text
    _rejected(_write(tmp_path, text), "not valid JSON|malformed golden")


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda e: e["steps"][0].update(piece=7), r"steps\[0\].piece: Expected `str`, got `int`"),
    (lambda e: e.update(fingerprint=["cpu"]), r"fingerprint: Expected `object`, got `array`"),
    (lambda e: e.update(fingerprint="cpu"), r"fingerprint: Expected `object`, got `str`"),
    (lambda e: e["fingerprint"].update(dtype=["float32"]), r"fingerprint\[...\]: Expected .*, got `array`"),
    (lambda e: e["fingerprint"].update(dtype=32), r"fingerprint field 'dtype' is 32, expected a string"),
    (lambda e: e["steps"][0].update(top=[]), r"step 0 has an empty 'top'"),
    (lambda e: e["steps"][0].update(hash="xyz"), r"steps\[0\].hash: Expected `str` of length >= 16"),
    (lambda e: e.update(extra=1), r"Object contains unknown field `extra`"),
])
def test_wrong_types_are_named_with_their_place(tmp_path, edit, problem):
    document = _valid_document()
    edit(document["goldens"]["test_x"]["cpu/float32"])
    _rejected(_write(tmp_path, document), r"malformed golden: \['test_x'\]\['cpu/float32'\] .*" + problem)


def test_duplicate_keys_are_an_error_at_any_depth(tmp_path):
    text = codec.dumps({"test_x": {"cpu/float32": schema.to_entry(sample_generation())}})
    twice = text.replace('    "test_x": {', '    "test_x": {},\n    "test_x": {', 1)
    _rejected(_write(tmp_path, twice, "a.json"), "has the key 'test_x' twice")
    in_step = text.replace('"token":10,', '"token":10,"token":11,', 1)
    assert in_step != text
    _rejected(_write(tmp_path, in_step, "b.json"), "has the key 'token' twice")


def test_a_duplicate_hidden_by_a_missing_field_is_still_found(tmp_path):
    """A missing field must never let one duplicate key balance the key count."""
    text = VALID_GOLDEN.decode()
    no_fingerprint = re.sub(r'"fingerprint": \{.*?\n        \},\n', "", text, count=1, flags=re.DOTALL)
    assert '"fingerprint"' not in no_fingerprint
    twice = no_fingerprint.replace('"text": "', '"text": "FAKE", "text": "', 1)
    _rejected(_write(tmp_path, twice, "a.json"),
              "missing required field `fingerprint`|has the key 'text' twice")
    no_piece = text.replace('"piece":"a",', "", 1).replace('"token":10,', '"token":10,"token":11,', 1)
    _rejected(_write(tmp_path, no_piece, "b.json"),
              "missing required field `piece`|has the key 'token' twice")
    logit_hash = json.dumps(codec.LEGACY_LOGIT_HASH)
    header_only = f'{{"logit_hash": {logit_hash}, "schema": 2, "schema": 1}}'
    _rejected(_write(tmp_path, header_only, "c.json"), "has the key 'schema' twice")


def test_an_unknown_top_level_field_is_an_error_not_an_empty_file(tmp_path):
    document = _valid_document()
    document["Goldens"] = document.pop("goldens")
    _rejected(_write(tmp_path, document), "unknown field `Goldens`")


def test_json_inside_prompts_keeps_the_fast_duplicate_proof(tmp_path):
    generation = sample_generation()
    entry = {**schema.to_entry(generation), "prompt": 'Reply in JSON: {"a": 1, "b": [2]}'}
    data = codec.dumps({"test_x": {"cpu/float32": entry}}).encode()
    goldens = codec.parse(tmp_path / "x.json", data)
    assert codec._no_duplicate_keys(data, goldens, header_keys=1)
    assert goldens["test_x"]["cpu/float32"].prompt == entry["prompt"]


def test_a_piece_that_starts_with_a_colon_keeps_the_fast_proof_and_a_duplicate_is_still_found(tmp_path):
    """Code generations have pieces and texts that start with a colon (``":"``, ``":\\n"``): no key,
    and the fast proof holds (real Gemma 3 goldens have them); a duplicated key beside one is found."""
    generation = sample_generation()
    entry = schema.to_entry(generation)
    entry = {**entry, "text": ":" + entry["text"], "prompt": ': "quoted": ['}
    entry["steps"] = [{**step, "piece": ":"} for step in entry["steps"]]
    data = codec.dumps({"test_x": {"cpu/float32": entry}}).encode()
    assert b'":"' in data
    goldens = codec.parse(tmp_path / "x.json", data)
    assert codec._no_duplicate_keys(data, goldens, header_keys=1)
    twice = data.decode().replace('"text": ":', '"text": ":FAKE", "text": ":', 1)
    _rejected(_write(tmp_path, twice, "a.json"), "has the key 'text' twice")


def test_a_symlinked_golden_is_updated_through_its_link(tmp_path):
    target = tmp_path / "real" / "test_m.json"
    store.merge(target, {"k": {"cpu/float32": schema.to_entry(sample_generation())}})
    link = tmp_path / "test_m.json"
    link.symlink_to(target)
    store.merge(link, {"k2": {"cpu/float32": schema.to_entry(sample_generation())}})
    assert link.is_symlink() and sorted(store.read(target)) == ["k", "k2"]


def test_a_string_schema_says_it_is_a_string(tmp_path):
    document = {**_valid_document(), "schema": "1"}
    _rejected(_write(tmp_path, document), r"schema version '1' \(a str\), which no pytest-llm")


_TEXT_ONLY = 2**40  # generation.TEXT_ONLY_IDS: a served token that is no vocabulary entry


@pytest.mark.parametrize("token", [10**400, 2**64 + 1, 2**40 + 2**32, 2**31, 2**40 - 1, -1, True])
@pytest.mark.parametrize("field", ["token", "top", "prompt_token_ids"])
def test_a_token_id_no_engine_produces_is_a_golden_file_error_not_a_verdict(tmp_path, token, field):
    """Read as a golden, such an id would be reported as a REGRESSION: the file is malformed instead."""
    document = _valid_document()
    entry = document["goldens"]["test_x"]["cpu/float32"]
    if field == "token":
        entry["steps"][1]["token"], where = token, r"steps\[1\]\.token"
    elif field == "top":
        entry["steps"][1]["top"][1][0], where = token, r"steps\[1\]\.top\[1\](\[0\])?"
    else:
        entry["prompt_token_ids"][0], where = token, r"prompt_token_ids\[0\]"
    _rejected(_write(tmp_path, document),
              r"has a malformed golden: \['test_x'\]\['cpu/float32'\] " + where + ": Expected ")


def test_a_served_tokens_text_only_ids_are_token_ids(tmp_path):
    document = _valid_document()
    step = document["goldens"]["test_x"]["cpu/float32"]["steps"][0]
    step["token"] = step["top"][0][0] = _TEXT_ONLY + 2**32 - 1
    step["top"][1][0] = _TEXT_ONLY
    assert store.read(_write(tmp_path, document))["test_x"]["cpu/float32"].steps[0].token == 2**40 + 2**32 - 1


@pytest.mark.parametrize(("mark", "named", "fix"), [
    (b"\xef\xbb\xbf", r"starts with a UTF-8 byte-order mark \(EF BB BF\), which JSON does not allow",
     "save it without BOM"),
    (b"\xff\xfe", r"starts with a UTF-16 byte-order mark \(FF FE\): it is UTF-16", "save it as UTF-8"),
])
def test_a_byte_order_mark_is_named_with_the_fix(tmp_path, mark, named, fix):
    path = tmp_path / "test_m.json"
    path.write_bytes(mark + VALID_GOLDEN)
    assert _rejected(path, named).args[0].count(fix) == 1


# -- concurrency, modes, temp files -------------------------------------------------------------

def _update(path: str, key: str, barrier, locked: bool) -> None:
    """In a forked process: merge ``key`` into ``path`` at the barrier, with a widened read-write window."""
    import contextlib
    import time
    from pathlib import Path

    if not locked:  # the negative control: both processes provably read before either writes
        store.folder_lock = lambda _path: contextlib.nullcontext()
    original = store.read

    def slow_read(target):
        goldens = original(target)
        if locked:
            time.sleep(0.05)  # the other process, at the lock, would be between read and write here
        else:
            barrier.wait(timeout=30)
        return goldens

    store.read = slow_read
    barrier.wait(timeout=30)
    store.merge(Path(path), {key: {"cpu/float32": schema.to_entry(sample_generation())}})


def _race(path, trials: int, *, locked: bool) -> int:
    """Two processes merge different keys into one file at the same moment; returns updates lost."""
    context = multiprocessing.get_context("fork")
    lost = 0
    for trial in range(trials):
        path.unlink(missing_ok=True)
        barrier = context.Barrier(2)
        workers = [context.Process(target=_update, args=(str(path), f"test_{side}", barrier, locked))
                   for side in ("a", "b")]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=60)
            assert worker.exitcode == 0, f"trial {trial}: a writer failed"
        lost += 2 - len(store.read(path))
    return lost


def test_concurrent_updates_of_one_file_lose_nothing(tmp_path):
    assert _race(tmp_path / "test_shared.json", 20, locked=True) == 0


def test_the_race_is_real_without_the_lock(tmp_path):
    """Negative control: the same race, lock removed, loses updates (both read before either writes)."""
    assert _race(tmp_path / "test_shared.json", 3, locked=False) == 3


def test_written_goldens_keep_their_mode_or_get_the_umask_default(tmp_path):
    new = tmp_path / "new.json"
    store.merge(new, {"k": {"cpu/float32": schema.to_entry(sample_generation())}})
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(new.stat().st_mode) == 0o666 & ~umask
    os.chmod(new, 0o640)
    store.merge(new, {"k2": {"cpu/float32": schema.to_entry(sample_generation())}})
    assert stat.S_IMODE(new.stat().st_mode) == 0o640


def test_temp_files_of_killed_writers_are_removed_by_the_next_write(tmp_path):
    path = tmp_path / "test_m.json"
    dead = multiprocessing.get_context("fork").Process(target=lambda: None)
    dead.start()
    dead.join()
    orphan = tmp_path / f".test_m.json.{atomic.HOST}-{dead.pid}.abc123.tmp"
    orphan.write_text("half a golden")
    os.utime(orphan, (0, 0))  # older than a minute
    live = tmp_path / f".test_m.json.{atomic.HOST}-{os.getppid()}.def456.tmp"  # a running process's: kept
    live.write_text("being written")
    os.utime(live, (0, 0))
    fresh = tmp_path / f".test_m.json.{atomic.HOST}-{dead.pid}.ghi789.tmp"  # too recent to judge: kept
    fresh.write_text("just now")
    other_host = tmp_path / f".test_m.json.otherhost-{dead.pid}.jkl012.tmp"  # not ours to judge: kept
    other_host.write_text("elsewhere")
    os.utime(other_host, (0, 0))
    store.merge(path, {"k": {"cpu/float32": schema.to_entry(sample_generation())}})
    assert not orphan.exists() and live.exists() and fresh.exists() and other_host.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [live.name, fresh.name, other_host.name, "test_m.json"])


def test_an_invalid_entry_is_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "test_m.json"
    store.merge(path, {"k": {"cpu/float32": schema.to_entry(sample_generation())}})
    before = path.read_bytes()
    bad = schema.to_entry(sample_generation())
    bad["steps"][0]["margin"] = math.nan
    with pytest.raises(msgspec.ValidationError):
        store.merge(path, {"k2": {"cpu/float32": bad}})
    assert path.read_bytes() == before


# -- reports -------------------------------------------------------------------------------------

HOSTILE = "<script>alert(1)</script> | `code` ![x](http://e/x.png) <img src=x onerror=alert(1)>"


def test_reports_are_strict_json_and_inert_markdown():
    generation = sample_generation()
    entry = schema.to_entry(generation)
    other = schema.from_entry({**entry, "steps": entry["steps"][:1]})
    comparison = compare(other, generation)  # the golden stopped where the actual went on: margin inf
    assert comparison.divergence.golden_margin == math.inf
    outcomes = TestOutcomes()
    outcomes.decided(Path("g.json"), HOSTILE, Decision(comparison, False, generation, other, "cpu/float32",
                                                       changed=(("torch", HOSTILE, "2.13|0"),)))
    document = documents.run_report(
        [msgspec.structs.replace(check, test=HOSTILE) for check in outcomes.data.checks], [])
    text = json.dumps(document, allow_nan=False)  # raises on NaN or Infinity
    assert json.loads(text)["checks"][0]["golden_margin"] is None
    markdown = documents.run_report_markdown(document)
    timed = next(line for line in markdown.split("### Time per test")[1].splitlines() if "script" in line)
    assert len(re.split(r"(?<!\\)\|", timed)[1:-1]) == 4  # the time per test's row too
    row = next(line for line in markdown.split("### Failing checks")[1].splitlines() if "script" in line)
    cells = re.split(r"(?<!\\)\|", row)[1:-1]
    assert len(cells) == 7  # no cell was split by a '|' from the data
    test, _, _, _, _, _, changed = (cell.strip() for cell in cells)
    # identifiers are code spans (HTML inside one is shown, not run) with no backtick inside to end them
    assert test.startswith("`") and test.endswith("`") and "`" not in test[1:-1] and "<script>" in test
    assert "<" not in changed and ">" not in changed and "`" not in changed and "&lt;script&gt;" in changed
    html = documents.run_report_html(document)
    assert "<script>alert" not in html and "&lt;script&gt;" in html  # the page's own filter script only


def test_markdown_shows_expected_and_got_text_inert_and_cut_around_the_change():
    import dataclasses

    generation = sample_generation()
    entry = schema.to_entry(generation)
    golden = schema.from_entry({**entry, "steps": entry["steps"][:1]})
    comparison = compare(golden, generation)
    prefix = "x" * 300  # the change sits far into the text: shown around it, not from the start
    expected = dataclasses.replace(golden, text=prefix + " Paris.", prompt="What is the capital? |")
    actual = dataclasses.replace(generation, text=prefix + " Lyon\n``` " + HOSTILE + " " + "y" * 500,
                                 prompt="What is the capital? |")
    outcomes = TestOutcomes()
    outcomes.decided(Path("g.json"), "test_capital",
                     Decision(comparison, False, actual, expected, "cpu/float32"))
    outcomes.decided(Path("g.json"), "test_new", Decision(Comparison(Verdict.MISSING), False, actual, None,
                                                          "cpu/float32"))
    document = documents.run_report(
        [msgspec.structs.replace(check, test="t.py::t") for check in outcomes.data.checks], [])
    lines = documents.run_report_markdown(document).splitlines()
    section = lines[lines.index("### What the model says (expected → got)"):]
    assert section[2] == "- `t.py::t` `test_capital`: `REGRESSION` at step 1"
    assert section[3] == "  - prompt: `'What is the capital? |'`"
    got = next(line for line in section if line.startswith("  - got: "))
    # one line, in a code span whose fence is longer than any backtick run inside, so nothing inside is read
    span = got.removeprefix("  - got: ")
    assert span.startswith("````") and span.endswith("````") and "`" * 4 not in span[4:-4]
    assert "x Lyon\\n``` <script>alert(1)</script> | `code`" in span  # the new line shown as \n
    assert len(span) < 300 and span[4:-4].strip().startswith("…'x") and span[4:-4].strip().endswith("…")
    expected_line = next(line for line in section if line.startswith("  - expected: "))
    assert expected_line.endswith("x Paris.'`")
    assert next(line for line in section if "no golden; got:" in line).startswith("  - no golden; got: `")


@pytest.mark.parametrize("bad", sorted(BAD_GOLDENS))
def test_llm_golden_diff_and_accept_name_the_bad_file(tmp_path, capsys, bad):
    good = tmp_path / "base" / "test_m.json"
    good.parent.mkdir()
    good.write_bytes(VALID_GOLDEN)
    broken = tmp_path / "candidates" / "test_m.json"
    broken.parent.mkdir()
    broken.write_text(BAD_GOLDENS[bad])
    assert cli.main(["diff", str(good), str(broken)]) == 2
    assert cli.main(["accept", str(broken.parent), "--root", str(tmp_path / "base")]) == 2
    err = capsys.readouterr().err
    assert err.count("llm-golden: golden file") == 2 and "candidates/test_m.json" in err
    assert good.read_bytes() == VALID_GOLDEN


def test_a_hostile_verdict_in_a_merged_report_is_inert_in_the_markdown():
    """A shard report is an artifact: its verdict strings reach the pull-request comment only inside
    code spans, in the counts table and the failing-checks table alike."""
    generation = sample_generation()
    comparison = compare(schema.from_entry(schema.to_entry(generation)), generation)
    outcomes = TestOutcomes()
    outcomes.decided(Path("g.json"), "test_capital",
                     Decision(comparison, False, generation, None, "cpu/float32"))
    document = documents.run_report(
        [msgspec.structs.replace(check, test="t.py::t", verdict="X` " + HOSTILE)
         for check in outcomes.data.checks], [])
    markdown = documents.run_report_markdown(document)
    rows = [line for line in markdown.splitlines() if "<script>" in line and line.startswith("|")]
    assert len(rows) == 2  # the counts table and the failing-checks table
    # one code span, no backtick or pipe of its own inside: the HTML is shown, not run, the table intact
    span = "`X' <script>alert(1)</script> \\| 'code' ![x](http://e/x.png) <img src=x onerror=alert(1)>`"
    assert all(f"| {span} |" in row for row in rows), rows
