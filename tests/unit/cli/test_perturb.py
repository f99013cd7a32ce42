"""`llm-golden perturb` (cli/perturb.py) in process on the tiny model: a GGUF file read through its
float32 conversion, and the help's measured scales (the command itself, run as the README runs it:
tests/pytester/test_perturb_commands.py)."""

from pytest_llmdeterminism.engines import BUILTIN_MODELS
from tests.helpers import ROOT
from tests.helpers.models import perturbed_tiny_copy
from tests.helpers.perturb import TINY_FILES, weights


def test_perturb_reads_a_gguf_file_through_its_float32_conversion(tmp_path, monkeypatch):
    """The same conversion a load makes (engines/hf.float32_folder); its digest file is not copied."""
    import shutil

    from pytest_llmdeterminism.cli import perturb as perturb_module
    from pytest_llmdeterminism.engines import cached

    converted = tmp_path / "converted"
    shutil.copytree(BUILTIN_MODELS["tiny"], converted)
    (converted / cached.DIGEST).write_text("{}")
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    asked = []
    monkeypatch.setattr(perturb_module.hf, "float32_folder",
                        lambda spec, path, *, scratch: asked.append((spec, path)) or converted)
    written = perturb_module.perturb(str(gguf), tmp_path / "copy", scale=0.5, seed=3)
    assert asked == [(str(gguf), gguf)]
    assert written.copied == tuple(TINY_FILES) and not (tmp_path / "copy" / cached.DIGEST).exists()
    reference = weights(perturbed_tiny_copy(tmp_path / "reference", scale=0.5, seed=3))
    copy = weights(tmp_path / "copy")
    assert all(copy[name].equal(reference[name]) for name in reference)


def test_the_helps_measured_scales_for_the_tiny_model_are_what_the_benchmark_measures():
    """The help's figures come from benchmarks/perturb_scales.py; the tiny model's are measured again
    here (portable CPU numerics give the same logits on any CPU), so the help cannot drift from them."""
    import importlib.util

    from pytest_llmdeterminism.cli.perturb import HELP

    spec = importlib.util.spec_from_file_location("perturb_scales", ROOT / "benchmarks" / "perturb_scales.py")
    assert spec is not None and spec.loader is not None
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    measured = dict(benchmark.measure("builtin:tiny", [3e-2, 0.1, 2.0], seed=0, max_new_tokens=8))
    assert measured == {3e-2: {"LOGIT_DRIFT": 8}, 0.1: {"LOGIT_DRIFT": 5, "REGRESSION": 3},
                        2.0: {"REGRESSION": 8}}
    assert "  drift only      1e-6 to 3e-2: 8 LOGIT_DRIFT" in HELP
    assert "  a few changed   0.1: 3 of 8 REGRESSION" in HELP
    assert "  everything      2: 8 of 8 REGRESSION" in HELP
