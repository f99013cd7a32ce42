"""The float32 copy of a ``.gguf`` file in pytest runs: the load line names a copy that was converted
again, and a cache folder others may write stops a GGUF load with the fix (the copy's checks:
tests/unit/engines/test_cached.py)."""

from __future__ import annotations

from tests.helpers.converted_copy import flip_a_byte


def test_the_load_line_names_a_copy_that_was_converted_again(pytester, gguf_and_cache):
    """What the user reads: not a REGRESSION blamed on the model, but why it was converted again."""
    gguf, converted = gguf_and_cache
    pytester.makeini(f"[pytest]\nllm_model = {gguf}\n")
    pytester.makepyfile("def test_x(llm_model): pass")
    pytester.runpytest().assert_outcomes(passed=1)
    (folder,) = converted.iterdir()
    flip_a_byte(folder)
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"llm: loaded {gguf} in * s on cpu (its float32 copy in {folder} failed "
                                 "its digest check: model.safetensors changed; converted again, for later "
                                 "loads)"])


def test_a_cache_folder_others_may_write_stops_a_gguf_load_with_the_fix(pytester, gguf_and_cache):
    """Whoever may write the cache folder could plant the copy a verdict is computed with."""
    gguf, converted = gguf_and_cache
    cache = converted.parent
    cache.mkdir(mode=0o700, exist_ok=True)  # it may hold a built kernel already (with_built_kernel)
    cache.chmod(0o777)
    pytester.makeini(f"[pytest]\nllm_model = {gguf}\n")
    pytester.makepyfile("def test_x(llm_model): pass")
    result = pytester.runpytest()
    cache.chmod(0o700)
    assert result.ret != 0
    result.stdout.fnmatch_lines([
        f"E   pytest_llmdeterminism.CacheFolderError: {cache} (the plugin's cache folder) is not the user's "
        "own or root's or others may write it (mode 777): whoever may write it can put another folder in "
        "converted's place; the plugin reads no converted copy from it (*): set LLMDET_CACHE_DIR to a "
        f"private folder, or make it private: chmod go-w {cache}"])
    assert not converted.exists(), "nothing is made in a folder that was refused"
