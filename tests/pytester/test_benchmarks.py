"""Every script in benchmarks/ runs in its smoke form (``--smoke``: one short round on builtin:tiny), exits
0 and prints its result lines, so a benchmark the docs cite cannot rot (natural_test.py, which the
README's "What it costs" cites, once crashed on a renamed argument and nothing noticed). Scripts are
listed from the folder: a new one without a smoke form fails here. The llama.cpp one runs in
tests/engines/test_benchmarks_engines.py."""

from __future__ import annotations

import shutil

import pytest

from tests.helpers.benchmarks import LLAMACPP, run_smoke, scripts

NEEDS_GCC = ("fixed_order_kernel", "linear_kernels")  # they build C kernels


@pytest.mark.subprocess
@pytest.mark.parametrize("name", [name for name in scripts() if name not in LLAMACPP])
def test_the_benchmark_runs_in_its_smoke_form(name):
    if name in NEEDS_GCC and shutil.which("gcc") is None:
        pytest.skip(f"benchmarks/{name}.py builds C kernels: needs gcc")
    run_smoke(name)

