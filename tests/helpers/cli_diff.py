"""The committed golden the `llm-golden diff` tests read (tests/unit/cli/test_diff.py,
tests/pytester/test_cli_diff.py)."""

from tests.helpers import DATA

RECORDED = DATA / "test_tiny_model.intel-avx512-native-0.1.0.json"

