"""A valid golden file and bad variants of it (tests/unit/goldens/test_golden_safety.py,
tests/pytester/test_golden_safety_runs.py)."""

from __future__ import annotations

from pytest_llmdeterminism.goldens import codec, schema
from tests.helpers.strategies import sample_generation

VALID_GOLDEN = codec.dumps({"test_x": {"cpu/float32": schema.to_entry(sample_generation(3))}}).encode()


# -- a bad golden everywhere it can be read ------------------------------------------------------

BAD_GOLDENS = {
    "nan": VALID_GOLDEN.decode().replace('"margin":2.4', '"margin":NaN', 1),
    "duplicate": VALID_GOLDEN.decode().replace('    "test_x": {', '    "test_x": {},\n    "test_x": {', 1),
    "string schema": VALID_GOLDEN.decode().replace(f'"schema": "{codec.GENERATION_FORMAT}"', '"schema": "2"'),
}

