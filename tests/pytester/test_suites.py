"""Prompt suites as data: test_*.llm.jsonl lines become golden-checked items, generated B at a time."""

import json

import pytest

PROMPTS = ["The capital of France is", "Count: one,", "The sky is", "Hello, world!", "The cat sat on the",
           "def add(a, b):", "Once upon a time", "Q: What is the capital of Peru? A:", "The weather today is",
           "My favourite colour is", "Count: three,", "The colour of the grass is",
           "Q: What is the capital of Kenya? A:",
           "def mul(a, b):", "The snow is", "Hello, model!"]

CHECK_ALONE = """
import json
from pathlib import Path
from pytest_llmdeterminism import assert_tokens_match

def test_each_prompt_alone_matches_the_batched_suite(llm_model):
    goldens = json.loads(Path("__golden__/test_prompts.llm.json").read_text())["goldens"]
    cases = [json.loads(line) for line in Path("test_prompts.llm.jsonl").read_text().splitlines()]
    assert len(goldens) == len(cases) == 16
    for case in cases:
        alone = llm_model.generate(case["prompt"], **({"max_new_tokens": case["max_new_tokens"]}
                                                      if "max_new_tokens" in case else {}))
        assert_tokens_match(alone, goldens[case["id"]]["cpu/float32"])
"""


def write_suite(pytester):
    lines = [json.dumps({"id": f"case-{i:02d}", "prompt": p, **({"max_new_tokens": 3} if i % 5 == 0 else {})})
             for i, p in enumerate(PROMPTS)]
    (pytester.path / "test_prompts.llm.jsonl").write_text("\n".join(lines) + "\n")


def test_jsonl_suite_of_16_prompts_records_checks_and_matches_one_at_a_time(suite):
    write_suite(suite)
    recorded = suite.runpytest("--llm-golden-update", "-v")
    recorded.assert_outcomes(passed=16)
    recorded.stdout.fnmatch_lines(["test_prompts.llm.jsonl::case-00 PASSED*", "*golden checks: 16 recorded"])
    suite.runpytest().assert_outcomes(passed=16)
    suite.makepyfile(test_alone=CHECK_ALONE)
    suite.runpytest("test_alone.py").assert_outcomes(passed=1)


def test_a_changed_model_fails_the_affected_lines_only(suite, tmp_path, tiny):
    """A copy that boosts the " m" token (cat/mat) changes some continuations and not others: the
    lines that fail are exactly those whose tokens changed, found here by generating each prompt
    alone with the changed model."""
    from pytest_llmdeterminism.engines import load
    from pytest_llmdeterminism.goldens import schema
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings
    from tests.helpers.models import boosted_token_copy

    write_suite(suite)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=16)
    boosted = boosted_token_copy(tmp_path / "boosted", tiny.tokenizer.convert_tokens_to_ids("Ġm"), factor=1.5)
    changed = LLMModel(load(str(boosted), dtype="float32", device="cpu"),
                       GenerationSettings(BatchShape(4, 32), 8, 0))
    goldens = json.loads((suite.path / "__golden__" / "test_prompts.llm.json").read_text())["goldens"]
    affected = set()
    for line in (suite.path / "test_prompts.llm.jsonl").read_text().splitlines():
        case = json.loads(line)
        alone = changed.generate(case["prompt"], **{k: v for k, v in case.items() if k == "max_new_tokens"})
        if alone.token_ids != schema.from_entry(goldens[case["id"]]["cpu/float32"]).token_ids:
            affected.add(case["id"])
    assert 0 < len(affected) < 16

    result = suite.runpytest(f"--llm-model={boosted}", "--llm-tolerance=tokens", "-rf")
    failed = {line.split("::")[1].split(" ")[0] for line in result.stdout.lines if line.startswith("FAILED ")}
    assert failed == affected
    result.assert_outcomes(failed=len(affected), passed=16 - len(affected))


COUNT_GENERATE_CALLS = """
import pytest
from pytest_llmdeterminism.model.llm_model import LLMModel

CALLS = []
_generate = LLMModel.generate

def counting(self, prompt, **overrides):
    CALLS.append(len(prompt) if isinstance(prompt, list) else 1)
    return _generate(self, prompt, **overrides)

LLMModel.generate = counting

def pytest_collection_modifyitems(items):
    if {order!r} == "reversed":
        items.reverse()

def pytest_sessionfinish(session):
    LLMModel.generate = _generate
    session.config.rootpath.joinpath("calls.txt").write_text(" ".join(map(str, CALLS)))
"""


@pytest.mark.parametrize("order", ["file", "reversed"])
def test_chunks_are_generated_once_whatever_the_test_order(suite, order):
    write_suite(suite)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=16)
    suite.makeconftest(COUNT_GENERATE_CALLS.format(order=order))
    result = suite.runpytest("-v")
    result.assert_outcomes(passed=16)
    ran = [line for line in result.stdout.lines if " PASSED" in line]
    assert ("case-15" if order == "reversed" else "case-00") in ran[0]
    # 12 prompts at the default budget and 4 at 3 tokens, 4 rows per call: four calls of 4.
    assert (suite.path / "calls.txt").read_text().split() == ["4", "4", "4", "4"]


def test_suite_items_go_through_the_fixtures_so_the_audit_covers_them(suite):
    (suite.path / "test_few.llm.jsonl").write_text(
        '{"id": "sky", "prompt": "The sky is"}\n'
        '{"id": "count", "prompt": "Count: one,", "tolerance": "tokens"}\n')
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=2)
    result = suite.runpytest("--llm-audit=2")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["test_few.llm.jsonl::sky: audit of 'The sky is' at 4x32:",
                                 "test_few.llm.jsonl::count: audit of 'Count: one,' at 4x32:",
                                 "audit summary: 2 generation(s), 0 nondeterministic*"])


def test_a_bad_tolerance_on_a_line_is_a_collection_error(suite):
    (suite.path / "test_bad.llm.jsonl").write_text('{"id": "a", "prompt": "x", "tolerance": "loose"}\n')
    result = suite.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*test_bad.llm.jsonl:1 tolerance = 'loose': expected one of exact, tokens*"])


@pytest.mark.parametrize(("line", "problem"), [
    ('{"id": "a"}', 'expected an object with string "id" and either a string "prompt" or chat "messages"'),
    ('{"id": "a", "prompt": "x", "messages": []}', 'either a string "prompt" or chat "messages"'),
    ('{"id": "a", "messages": [{"role": "user"}]}', 'expected "messages" as a list of'),
    ('{"id": "a", "prompt": "x", "temprature": 0.7}',
     "unknown field(s); accepted: continuation, do_sample, id, max_new_tokens, messages, min_p, prompt, "
     "seed, temperature, tolerance, top_k, top_p"),
    ('{"id": "a", "prompt": "x", "temperature": 0.7}', 'sample with "do_sample": true'),
    ('{"id": "a", "prompt": "x", "do_sample": true, "temperature": 0}', "temperature=0 with do_sample=True"),
    ('{"id": "a", "prompt": "x", "max_new_tokens": 0}', "max_new_tokens must be an integer >= 1"),
    ("not json", "not valid JSON"),
])
def test_bad_lines_are_collection_errors_naming_file_and_line(suite, line, problem):
    (suite.path / "test_bad.llm.jsonl").write_text('{"id": "ok", "prompt": "x"}\n' + line + "\n")
    result = suite.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*test_bad.llm.jsonl:2*{problem}*"])


def test_a_failing_line_prints_the_message_only_and_module_fixtures_work(suite):
    suite.makeconftest("""
        import pytest

        @pytest.fixture(scope="module", autouse=True)
        def per_module(request):
            return request.module
    """)
    (suite.path / "test_two.llm.jsonl").write_text('{"id": "one", "prompt": "The sky is"}\n'
                                                   '{"id": "two", "prompt": "Count: one,"}\n')
    # on the previous kernels the batch shape is part of every golden: changing it fails both lines
    suite.runpytest("--llm-golden-update", "--llm-batch-invariant=false").assert_outcomes(passed=2)
    result = suite.runpytest("--llm-batch-shape=2x40", "--llm-batch-invariant=false")
    result.assert_outcomes(failed=2)
    failures = result.stdout.str().split("= FAILURES =")[1].split("- llm goldens -")[0]
    assert "pluggy" not in failures and "_pytest" not in failures and "Traceback" not in failures
    assert len(failures.strip().splitlines()) <= 18  # two failures of about eight lines each
    result.stdout.fnmatch_lines(["golden mismatch in 'one': INPUT_CHANGED — batch_shape*",
                                 "FAILED test_two.llm.jsonl::one - golden mismatch in 'one': INPUT_CHANGED*"])


def test_chat_lines_render_with_the_template_and_match_the_same_conversation_in_python(suite):
    (suite.path / "test_chat.llm.jsonl").write_text(
        '{"id": "japan", "messages": [{"role": "user", "content": "What is the capital of Japan?"}]}\n'
        '{"id": "plain", "prompt": "The sky is"}\n')
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=2)
    goldens = json.loads((suite.path / "__golden__" / "test_chat.llm.json").read_text())["goldens"]
    entry = goldens["japan"]["cpu/float32"]
    assert entry["prompt_form"] == "chat" and entry["prompt"].endswith("Q: What is the capital of Japan? A:")
    assert "prompt_form" not in goldens["plain"]["cpu/float32"]  # plain prompts keep the old layout
    assert "".join(step["piece"] for step in entry["steps"]).startswith(" Tokyo")
    suite.makepyfile(test_same="""
        import json
        from pathlib import Path
        from pytest_llmdeterminism import assert_tokens_match

        def test_same_conversation(llm_model):
            goldens = json.loads(Path("__golden__/test_chat.llm.json").read_text())["goldens"]
            golden = goldens["japan"]["cpu/float32"]
            result = llm_model.generate([{"role": "user", "content": "What is the capital of Japan?"}])
            assert result.prompt_form == "chat"
            assert_tokens_match(result, golden)
    """)
    suite.runpytest().assert_outcomes(passed=3)



SAMPLED_ALONE = """
import json
from pathlib import Path

def test_each_sampled_line_alone_matches_the_batched_suite(llm_model):
    goldens = json.loads(Path("__golden__/test_stories.llm.json").read_text())["goldens"]
    for case in map(json.loads, Path("test_stories.llm.jsonl").read_text().splitlines()):
        settings = {k: v for k, v in case.items() if k not in ("id", "prompt")}
        settings.setdefault("seed", 0)  # the test's seed by default
        alone = llm_model.generate(case["prompt"], **settings)
        golden = goldens[case["id"]]["cpu/float32"]
        assert [step["token"] for step in golden["steps"]] == list(alone.token_ids)
        assert golden["draw_margins"] == list(alone.draw_margins)
        assert golden["generation_config"]["seed"] == settings["seed"]
"""


def test_sampled_lines_record_their_settings_and_each_its_own_seed(suite):
    """JSONL lines take llm_model.generate's sampling fields: lines with the same settings run as one
    chunk, each with its own seed (the test's by default), and each equals its line run alone."""
    lines = [{"id": "a", "prompt": "Once upon a time", "do_sample": True, "temperature": 1.3, "seed": 5},
             {"id": "b", "prompt": "The cat sat on the", "do_sample": True, "temperature": 1.3},
             {"id": "c", "prompt": "Once upon a time", "do_sample": True, "temperature": 1.3, "seed": 3},
             {"id": "d", "prompt": "Once upon a time", "do_sample": True, "temperature": 0.7, "top_k": 20}]
    (suite.path / "test_stories.llm.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=4)
    suite.runpytest().assert_outcomes(passed=4)
    suite.makepyfile(test_alone=SAMPLED_ALONE)
    suite.runpytest("test_alone.py").assert_outcomes(passed=1)
    goldens = json.loads((suite.path / "__golden__" / "test_stories.llm.json").read_text())["goldens"]
    tokens = {key: [s["token"] for s in goldens[key]["cpu/float32"]["steps"]] for key in "ac"}
    assert tokens["a"] != tokens["c"]  # the same prompt, another seed (seeds 5 and 6 agree for 8 tokens)
