"""The test suite: tier folders (tests/unit, tests/pytester, ...) and what they share (tests/helpers)."""

import pytest

# The helpers hold assertions of their own (a project that must stop, bits that must match): pytest
# rewrites them as it rewrites the test modules', so a failure shows the values.
pytest.register_assert_rewrite("tests.helpers")
