"""The real Gemma 3 270M (``llm-golden fetch gemma3``: Q4_K_M GGUF, dequantised to float32), through
pytest itself, against goldens committed in this repository (recorded at 4x32 on a 2-core AMD EPYC,
tests/real_model/goldens/test_gemma3.json): IDENTICAL at 1x128 and at 8x64, on this machine or
another CPU. Its alternating sliding-window and full attention layers run on the batch- and
phase-invariant kernels: each generation's steps are the score of its own tokens, bit for bit, and
prompt-lookup speculation gives the same steps. Never re-record these goldens to make a run pass:
a failure here is the product's to fix (CONTRIBUTING.md)."""

from __future__ import annotations

import shutil

import pytest

from pytest_llmdeterminism.compute.private_folder import CACHE_SETTING, cache_root
from tests.helpers import ROOT

GOLDEN = ROOT / "tests" / "real_model" / "goldens" / "test_gemma3.json"
# The plugin's cache as this process found it, before pytester points HOME elsewhere: the projects
# load the float32 copy of the GGUF file made once there (a conversion takes about a minute).
CACHE = cache_root()
# The suite the committed goldens were recorded by (pytest --llm-golden-update at llm_batch_shape = 4x32,
# PHASES = True).
GEMMA3_SUITE = '''
import pytest

from pytest_llmdeterminism import assert_decode_matches_prefill, deterministic

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]


PHASES = {phases}


@deterministic(max_new_tokens=24)
@pytest.mark.parametrize("prompt", PROMPTS)
def test_gemma3(llm_model, golden_tokens, prompt):
    generation = llm_model.generate(prompt)
    golden_tokens.check(generation)
    if PHASES:
        assert_decode_matches_prefill(llm_model, generation)  # decode = prefill, bit for bit
        speculated = llm_model.generate(prompt, prompt_lookup_num_tokens=3)
        assert speculated.step_hashes == generation.step_hashes and speculated.speculation.drafted > 0
'''


# Each prompt alone (with its decode = prefill and speculation checks), and batched in 8 rows.
@pytest.mark.parametrize(("shape", "phases"), [("1x128", True), ("8x64", False)])
def test_gemma3s_committed_goldens_are_identical_at_other_shapes(pytester, gemma3_gguf, shape, phases,
                                                                 monkeypatch):
    monkeypatch.setenv(CACHE_SETTING, str(CACHE))
    pytester.makeini(f"[pytest]\nllm_model = {gemma3_gguf}\nllm_batch_shape = {shape}\n")
    pytester.makepyfile(test_gemma3=GEMMA3_SUITE.format(phases=phases))
    (pytester.path / "__golden__").mkdir()
    shutil.copy(GOLDEN, pytester.path / "__golden__" / GOLDEN.name)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*kernels batch-invariant*", "golden checks: 3 IDENTICAL"])
    assert (pytester.path / "__golden__" / GOLDEN.name).read_bytes() == GOLDEN.read_bytes()


def test_gemma3s_windowed_layers_decode_past_their_window_as_the_prefill_computes(gemma3_gguf):
    """Gemma 3's sliding-window layers (512 positions) over a 600-token prompt: the generation's
    decode steps run on a windowed cache that dropped the keys out of the window, the score's one
    forward on every key with the window masked; each step's logits are the score's, bit for bit."""
    from pytest_llmdeterminism import assert_decode_matches_prefill, engines
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings
    from tests.helpers.phases import LONG_TEXT

    loaded = engines.load(str(gemma3_gguf), dtype="float32", device="cpu")
    assert loaded.model.config.sliding_window == 512 and loaded.engine.kernels.phase_invariant
    ids = loaded.tokenizer(" ".join([LONG_TEXT] * 20))["input_ids"][:600]
    llm = LLMModel(loaded, GenerationSettings(BatchShape(1, 640), 8, 0), verify_batch_invariance=False)
    generation = llm.generate(token_ids=ids)
    assert len(generation.token_ids) == 8
    found = assert_decode_matches_prefill(llm, generation)
    assert found.identical == 8, found.lines()
