"""docs/writing-tests.md, "Testing your app's own generation code": the section shows the app, its
adapter, its tests and its JSONL cases (run as a project: tests/pytester/test_docs_app_code_runs.py)."""



from tests.helpers.docs_app_code import section_files


def test_the_section_shows_the_app_its_adapter_its_tests_and_its_jsonl_cases():
    assert set(section_files()) == {"myapp.py", "conftest.py", "test_myapp.py", "questions.jsonl"}
