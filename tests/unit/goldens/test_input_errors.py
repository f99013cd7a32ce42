"""What no golden can hold, refused before anything is written: a prompt or an entry's text that is not
valid Unicode (named by its place), a key the store could not read back, one text limit for writing
and reading; and every report renders huge, infinite and NaN numbers."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import msgspec
import pytest

from pytest_llmdeterminism.errors import ConfigurationError, GoldenFileError
from pytest_llmdeterminism.goldens import schema, store
from pytest_llmdeterminism.goldens.schema import MAX_TEXT_CHARS
from tests.helpers.strategies import sample_generation

# -- prompts ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("prompt", "where", "shown"), [
    ("hi \ud800", "prompt", "'hi \\ud800'"),
    (["fine", "x\udfff y"], "prompt[1]", "'x\\udfff y'"),
    ([{"role": "user", "content": "a\ud800"}], "conversation[0]['content']", "'a\\ud800'"),
    ([[{"role": "user", "content": "b\udc80"}], [{"role": "user", "content": "ok"}]],
     "prompt[0][0]['content']", "'b\\udc80'"),
])
def test_a_prompt_that_is_not_valid_unicode_names_its_place_in_the_call(make_llm, prompt, where, shown):
    with pytest.raises(ConfigurationError) as info:
        make_llm(max_new_tokens=1).generate(prompt)
    message = str(info.value)
    assert message.startswith(f"llm_model.generate({where}) = {shown}: holds a lone surrogate")
    assert "not valid Unicode" in message and "errors='replace'" in message
    assert info.value.setting == f"llm_model.generate({where})"


def test_a_long_prompt_shows_only_the_text_around_its_surrogate(make_llm):
    prompt = "a" * 5000 + "\ud800" + "b" * 5000
    with pytest.raises(ConfigurationError, match=r"= 'a{20}\\ud800b{19}': holds a lone surrogate '\\ud800' "
                                                 r"at character 5000"):
        make_llm(shape="1x32", max_new_tokens=1).generate(prompt)


def test_the_store_refuses_a_key_it_could_not_read_back_and_leaves_the_file_as_it_was(tmp_path):
    path = tmp_path / "test_m.json"
    entry = schema.to_entry(sample_generation())
    store.merge(path, {"test_x": {"cpu/float32": entry}})
    before = path.read_bytes()
    for updates in ({"test_x::\ud800": {"cpu/float32": entry}}, {"test_x": {"cpu/\udc00": entry}}):
        with pytest.raises(GoldenFileError, match=r"was not written: the (key|variant) .* holds a lone "
                                                  r"surrogate .* so the file would not read back\. The file "
                                                  r"was left untouched"):
            store.merge(path, updates)
        assert path.read_bytes() == before
    with pytest.raises(GoldenFileError, match="was not written"):
        store.write(tmp_path / "new.json", {"\udfff": {}})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test_m.json"]


def test_an_entry_with_text_that_is_not_valid_unicode_is_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "test_m.json"
    store.merge(path, {"k": {"cpu/float32": schema.to_entry(sample_generation())}})
    before = path.read_bytes()
    for field, value in (("text", "x\ud800"), ("prompt", "\udc00"), ("finish_reason", "stop\ud800")):
        entry = {**schema.to_entry(sample_generation()), field: value}
        with pytest.raises(msgspec.ValidationError, match=f"{field} holds a lone surrogate"):
            store.merge(path, {"k2": {"cpu/float32": entry}})
    piece = schema.to_entry(sample_generation())
    piece["steps"][1]["piece"] = "\ud800"
    with pytest.raises(msgspec.ValidationError, match="the piece of step 1 holds a lone surrogate"):
        store.merge(path, {"k2": {"cpu/float32": piece}})
    config = {**schema.to_entry(sample_generation()), "generation_config": {"x\ud800": 1, "y": 2}}
    with pytest.raises(msgspec.ValidationError, match="surrogate .* in a fingerprint or generation_config"):
        store.merge(path, {"k2": {"cpu/float32": config}})
    assert path.read_bytes() == before


def test_the_text_limit_is_the_same_for_writing_and_reading(tmp_path):
    entry = schema.to_entry(sample_generation())
    at_limit = {**entry, "text": " " * MAX_TEXT_CHARS}
    path = tmp_path / "test_m.json"
    store.merge(path, {"k": {"cpu/float32": at_limit}})
    assert store.read(path)["k"]["cpu/float32"].text == " " * MAX_TEXT_CHARS
    size = path.stat().st_size
    assert size < MAX_TEXT_CHARS + 2000  # the text once; the pieces are the sample's own
    for field in ("text", "prompt"):
        over = {**entry, field: " " * (MAX_TEXT_CHARS + 1)}
        with pytest.raises(msgspec.ValidationError, match=rf"Expected `str` of length <= {MAX_TEXT_CHARS}"):
            store.merge(path, {"k2": {"cpu/float32": over}})
        assert path.stat().st_size == size
    # a hand-made file beyond the limit is refused by the reader as well, naming the place
    path.write_text(path.read_text().replace(" " * MAX_TEXT_CHARS, " " * (MAX_TEXT_CHARS + 1)))
    with pytest.raises(GoldenFileError, match=r"malformed golden: \['k'\]\['cpu/float32'\] text: Expected "
                                              rf"`str` of length <= {MAX_TEXT_CHARS}"):
        store.read(path)
    pieces = schema.to_entry(dataclasses.replace(
        sample_generation(), pieces=("x" * (MAX_TEXT_CHARS // 2 + 1),) * 2))
    with pytest.raises(msgspec.ValidationError, match="the steps' pieces together have 1,000,002 characters"):
        store.merge(path, {"k2": {"cpu/float32": pieces}})


# -- reports ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("huge", [1e308, 1.7976931348623157e308, math.inf, -math.inf, math.nan])
def test_every_report_renders_huge_infinite_and_nan_numbers(huge):
    from pytest_llmdeterminism.judge.compare import Comparison, Divergence, Verdict
    from pytest_llmdeterminism.judge.decision import Decision
    from pytest_llmdeterminism.reporting import documents
    from pytest_llmdeterminism.run.session import TestOutcomes

    golden = dataclasses.replace(sample_generation(), margins=(huge, huge))
    sampled = {"max_new_tokens": 2, "do_sample": True, "temperature": huge, "seed": 3, "sampler": "x"}
    actual = dataclasses.replace(sample_generation(), token_ids=(10, 99), margins=(huge, 1.0),
                                 generation_config=sampled)
    top = ((10, -0.1),)
    comparison = Comparison(Verdict.REGRESSION, divergence=Divergence(1, 11, 99, top, top, golden_margin=huge,
                                                                      draw_margin=huge),
                            max_logprob_delta=huge, tie_margin=huge)
    outcomes = TestOutcomes()
    outcomes.decided(Path("g.json"), "test_x", Decision(comparison, False, actual, golden, "cpu/float32"))
    drift = dataclasses.replace(comparison, verdict=Verdict.LOGIT_DRIFT)
    outcomes.decided(Path("g.json"), "test_y", Decision(drift, True, golden, golden, "cpu/float32"))
    document = documents.run_report([msgspec.structs.replace(check, test="t.py::t")
                                     for check in outcomes.data.checks], [])
    text = documents.json_text(document)  # strict JSON: a number that is not finite is null
    assert "Infinity" not in text and "NaN" not in text
    html = documents.run_report_html(document)
    markdown = documents.run_report_markdown(document)
    shown = "1e+308" if huge == 1e308 else "1.8e+308" if math.isfinite(huge) else "n/a"
    assert f"max |Δlogprob| in top-k {shown}" in html and f"id 11, margin {shown}" in html
    if math.isfinite(huge):  # a null golden or draw margin (the golden had stopped) is left out
        assert f"golden margin {shown}" in html and f"| {shown} |" in markdown
        assert f"draw margin there {shown}" in markdown
    assert 'style="width:60px"' in html  # a huge margin is a full bar
