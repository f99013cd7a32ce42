"""The committed golden the `llm-golden diff` tests read (unit and pytester tiers)."""

from tests.helpers import DATA

RECORDED = DATA / "test_tiny_model.intel-avx512-native-0.1.0.json"

