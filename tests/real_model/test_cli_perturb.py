"""`llm-golden perturb` on the real SmolLM2-135M GGUF file: the copy it writes as safetensors."""




from tests.helpers.projects import llm_golden


def test_perturb_copies_the_real_smollm2_gguf_as_safetensors(tmp_path, smollm2_gguf):
    import torch
    from safetensors import safe_open

    dest = tmp_path / "noisy-smollm2"
    result = llm_golden("perturb", smollm2_gguf, dest, "--scale=1e-3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "  model.safetensors: all " in result.stdout
    assert f"use it with: pytest --llm-model={dest}" in result.stdout
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= {p.name for p in dest.iterdir()}
    assert "llmdet-digest.json" not in {p.name for p in dest.iterdir()}
    with safe_open(dest / "model.safetensors", framework="pt") as opened:
        noisy = opened.get_tensor("model.embed_tokens.weight")
    from pytest_llmdeterminism.engines.cached import converted_folder

    with safe_open(converted_folder(smollm2_gguf) / "model.safetensors", framework="pt") as opened:
        original = opened.get_tensor("model.embed_tokens.weight")
    assert noisy.dtype == torch.float32
    relative = ((noisy - original).std() / original.std()).item()
    assert 0.9e-3 < relative < 1.1e-3  # the relative size asked for
