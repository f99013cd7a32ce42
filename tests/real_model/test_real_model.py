"""The real SmolLM2-135M-Instruct model (GGUF, dequantised to fp32), through pytest itself.

Two separate pytest processes: the first records goldens, the second must reproduce every token
and every logit hash bit for bit.
"""


import pytest

from tests.helpers.projects import REAL_GOLDEN, REAL_SUITE, read_goldens


@pytest.mark.subprocess
def test_smollm2_goldens_reproduce_bitwise_in_a_second_process(pytester, smollm2_gguf):
    pytester.makeini(f"[pytest]\nllm_model = {smollm2_gguf}\nllm_batch_shape = 2x32\n")
    pytester.makepyfile(test_real=REAL_SUITE)
    recorded = pytester.runpytest_subprocess("--llm-golden-update", "-rP")
    recorded.assert_outcomes(passed=3)
    recorded.stdout.fnmatch_lines(["llm: loading *SmolLM2-135M-Instruct.Q4_1.gguf (float32, device auto) ...",
                                   "llm: loaded *SmolLM2-135M-Instruct.Q4_1.gguf in * s on cpu*",
                                   "golden checks: 5 recorded"])
    assert "de-quantizing" not in recorded.stdout.str() + recorded.stderr.str()  # no third-party bar
    assert read_goldens(pytester, REAL_GOLDEN)["test_chat"]["cpu/float32"]["prompt_form"] == "chat"

    goldens = read_goldens(pytester, REAL_GOLDEN)
    capital = goldens["test_capital"]["cpu/float32"]
    assert "Paris" in capital["text"]
    assert capital["fingerprint"]["model"] == smollm2_gguf.name
    assert len(capital["steps"]) >= 2 and all(len(s["hash"]) == 16 for s in capital["steps"])

    checked = pytester.runpytest_subprocess()
    checked.assert_outcomes(passed=3)
    checked.stdout.fnmatch_lines(["golden checks: 5 IDENTICAL"])


def test_a_gguf_file_is_converted_once_and_later_loads_read_its_float32_copy(smollm2_gguf, tmp_path,
                                                                             monkeypatch):
    """The first float32 load saves what transformers made of the file; the next reads that copy
    (engines/cached.py) and gives the same generations, bit for bit, and the same fingerprint. A
    cache that cannot be written costs the copy, not the load."""
    from pytest_llmdeterminism import engines
    from pytest_llmdeterminism.engines.cached import keep_converted
    from pytest_llmdeterminism.model.fingerprint import fingerprint
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    monkeypatch.setenv("LLMDET_CACHE_DIR", str(tmp_path / "cache"))
    first = engines.load(str(smollm2_gguf), dtype="float32", device="cpu")
    (folder,) = (tmp_path / "cache" / "converted").iterdir()
    assert first.origin == f"converted to float32 once, into {folder}, for later loads"
    assert folder.name.startswith("SmolLM2-135M-Instruct.Q4_1-") and (folder / "model.safetensors").is_file()
    assert not [path for path in folder.parent.iterdir() if path.name.endswith(".partial")]
    second = engines.load(str(smollm2_gguf), dtype="float32", device="cpu")
    assert second.origin == f"from its float32 copy in {folder}"
    settings = GenerationSettings(BatchShape(2, 32), 6, 0)
    prompts = ["The capital of France is", "def fibonacci(n):"]
    fresh, copied = (LLMModel(loaded, settings).generate(prompts) for loaded in (first, second))
    assert [(g.token_ids, g.step_hashes) for g in fresh] == [(g.token_ids, g.step_hashes) for g in copied]
    assert fingerprint(first) == fingerprint(second)  # the .gguf file's hash, the same tokenizer
    # A copy that cannot be written (here: its folder's parent is a file) is given up, the model intact.
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    config = dict(first.model.config.to_dict())
    assert keep_converted(first.model, first.tokenizer, blocked / "copy") is False
    assert first.model.config.to_dict() == config and not blocked.read_text()
    assert [(g.token_ids, g.step_hashes) for g in LLMModel(first, settings).generate(prompts)] == \
        [(g.token_ids, g.step_hashes) for g in fresh]
