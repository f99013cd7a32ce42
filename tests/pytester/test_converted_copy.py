"""The float32 copy a ``.gguf`` file is converted into once (engines/cached.py) is checked against its
digest at every load: a changed, cut or unlisted file, or a copy with no digest, is converted again
from the file, and the load line says so."""

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
