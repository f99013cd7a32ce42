"""The fixed-order kernel (compute/fixed_order.py) in pytest runs: a run that records goldens computes
them on oneDNN itself, a checking run on the kernel (its bits: tests/unit/compute/test_fixed_order.py)."""

from __future__ import annotations


def test_a_run_that_records_goldens_computes_them_on_onednn_itself(suite):
    """Goldens are never made of a product of the kernel that its sampled re-check did not cover:
    an update run leaves oneDNN's products on oneDNN (the same bits), a check run uses the kernel."""
    suite.makepyfile(test_one="""
        from pytest_llmdeterminism import deterministic

        @deterministic(max_new_tokens=2)
        def test_one(llm_model, golden_tokens):
            golden_tokens.check(llm_model.generate("The sky is"))
            engine = llm_model.loaded.engine
            print("KERNEL", engine.kernels.fixed_order is not None)
    """)
    recorded = suite.runpytest("--llm-golden-update", "-s")
    recorded.assert_outcomes(passed=1)
    # in plain words: what runs, what it costs, why
    recorded.stdout.fnmatch_lines([
        "llm: matrix multiplications run on PyTorch's own kernel (oneDNN), not the plugin's faster copy of "
        "it: the same results to the bit, only slower, because goldens are recorded with PyTorch's own "
        "kernel, the reference the faster copy is checked against (--llm-golden-update)", "*KERNEL False*"])
    assert "products stay on oneDNN" not in recorded.stdout.str()
    checked = suite.runpytest("-s")
    checked.assert_outcomes(passed=1)
    checked.stdout.fnmatch_lines(["*KERNEL True*"])
    assert "goldens are recorded with PyTorch's own kernel" not in checked.stdout.str()
