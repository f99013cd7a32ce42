"""docs/writing-tests.md, "Testing your app's own generation code": its files, as the page shows them,
are a project that records, then passes, and fails on a changed model; its production path runs."""


import pytest

from tests.helpers.docs_app_code import section_files
from tests.helpers.models import perturbed_tiny_copy


@pytest.fixture
def app_project(pytester):
    pytester.makeini("[pytest]\nllm_model = builtin:tiny\n")
    for name, text in section_files().items():
        (pytester.path / name).write_text(text, encoding="utf-8")
    pytester.syspathinsert()  # as a project's rootdir is, under python -m pytest
    return pytester


def test_the_app_example_records_passes_and_catches_a_changed_model(app_project, tmp_path):
    recorded = app_project.runpytest("--llm-golden-update")
    recorded.assert_outcomes(passed=5)
    recorded.stdout.fnmatch_lines(["golden checks: 6 recorded"])
    again = app_project.runpytest()
    again.assert_outcomes(passed=5)
    again.stdout.fnmatch_lines(["golden checks: 6 IDENTICAL"])
    changed = perturbed_tiny_copy(tmp_path / "changed", scale=0.5)
    app_project.runpytest(f"--llm-model={changed}").assert_outcomes(failed=5)


def test_the_app_s_production_path_generates_with_transformers(app_project):
    """The page's transformers_generate, on the plugin's own tiny model and tokenizer: text in, text out,
    for a prompt and for a conversation."""
    app_project.makepyfile(test_production="""
        from myapp import Answerer, ChatBot, transformers_generate

        def test_production(llm_model):
            generate = transformers_generate(llm_model.model, llm_model.tokenizer)
            assert isinstance(Answerer(generate, max_new_tokens=4).answer("What is 2 + 2?"), str)
            bot = ChatBot(generate, max_new_tokens=4)
            assert isinstance(bot.reply("Hello!"), str) and len(bot.history) == 3
    """)
    app_project.runpytest("test_production.py").assert_outcomes(passed=1)
