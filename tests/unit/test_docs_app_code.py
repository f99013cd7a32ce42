"""docs/writing-tests.md, "Testing your app's own generation code": its files, as the page shows them,
are a project that records, then passes, and fails on a changed model; its production path runs."""



from tests.helpers.docs_app_code import section_files


def test_the_section_shows_the_app_its_adapter_its_tests_and_its_jsonl_cases():
    assert set(section_files()) == {"myapp.py", "conftest.py", "test_myapp.py", "questions.jsonl"}
