"""Engine specs in an ini file: their local paths resolve relative to the file (the specs' parsing:
tests/unit/engines/test_spec.py)."""

from __future__ import annotations


def test_engine_specs_in_an_ini_file_resolve_their_local_paths_relative_to_it(pytester):
    (pytester.path / "models").mkdir()
    pytester.makeini("[pytest]\nllm_model = "
                     "openai:http://127.0.0.1:9/v1#model=m&tokenizer=models/tok&timeout=1&x\n")
    pytester.makeconftest("""
def pytest_configure(config):
    from pytest_llmdeterminism.run.configuration import read
    print("SPEC", read(config).model)
""")
    result = pytester.runpytest("-s", "--co")
    resolved = f"{pytester.path}/models/tok"
    result.stdout.fnmatch_lines([f"SPEC openai:http://127.0.0.1:9/v1#model=m&tokenizer={resolved}&timeout=1&x"])
