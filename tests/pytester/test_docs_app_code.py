"""docs/writing-tests.md, "Testing your app's own generation code": its files, as the page shows them,
are a project that records, then passes, and fails on a changed model; its production path runs."""

import re
from pathlib import Path

import pytest

from .conftest import perturbed_tiny_copy

PAGE = Path(__file__).parent.parent / "docs" / "writing-tests.md"
SECTION = "## Testing your app's own generation code"


def section_files() -> dict[str, str]:
    """The section's code blocks that name their file (```python title="myapp.py"), by file name."""
    text = PAGE.read_text(encoding="utf-8").split(SECTION, 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r'```\w+ title="([^"]+)"\n(.*?)```', text, re.DOTALL))


def test_the_section_shows_the_app_its_adapter_its_tests_and_its_jsonl_cases():
    assert set(section_files()) == {"myapp.py", "conftest.py", "test_myapp.py", "questions.jsonl"}


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
