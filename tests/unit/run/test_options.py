"""Settings parsed and checked without a run: batch shapes, a marker's seed within what torch takes,
and the visible GPU each xdist worker takes."""

import re

import pytest

from pytest_llmdeterminism.errors import ConfigurationError
from pytest_llmdeterminism.run.markers import validate_marker_kwargs
from pytest_llmdeterminism.run.options import MAX_SEED
from pytest_llmdeterminism.shape import BatchShape


@pytest.mark.parametrize(("text", "rows", "length"), [("4x64", 4, 64), (" 1X8 ", 1, 8), ("16x512", 16, 512)])
def test_batch_shape_parses(text, rows, length):
    assert BatchShape.parse(text) == BatchShape(rows, length)
    assert str(BatchShape.parse(text)) == f"{rows}x{length}"


@pytest.mark.parametrize("text", ["4by64", "0x64", "4x0", "4x", "x64", "-1x8", "4x64x2", ""])
def test_batch_shape_rejects(text):
    with pytest.raises(ConfigurationError, match=r"llm_batch_shape = .*expected 'BxL'.*'4x64'"):
        BatchShape.parse(text)


@pytest.mark.parametrize("seed", [2**80, 2**63, -1])
def test_a_marker_seed_beyond_what_torch_takes_names_the_range(seed):
    with pytest.raises(ConfigurationError, match=re.escape(
            f"@deterministic(seed=...) = '{seed}': expected an integer from 0 to 2**63 - 1 (")):
        validate_marker_kwargs({"seed": seed}, "test_m.py::test_x")
    assert validate_marker_kwargs({"seed": 2**63 - 1}, "test_m.py::test_x") == {"seed": 2**63 - 1}


def test_the_largest_seed_accepted_is_one_torch_takes():
    import torch

    torch.Generator().manual_seed(MAX_SEED)  # raises "Overflow when unpacking long long" past 2**64 - 1


@pytest.mark.parametrize(("worker", "count", "index"), [
    (None, 4, 0), ("gw0", 4, 0), ("gw3", 4, 3), ("gw5", 4, 1), ("gw7", 2, 1), ("gw2", 1, 0),
    ("gw2", 0, 0), ("master", 4, 0),
])
def test_each_xdist_worker_takes_its_own_visible_gpu(worker, count, index):
    from pytest_llmdeterminism.engines import worker_cuda_index

    assert worker_cuda_index(worker, count) == index
