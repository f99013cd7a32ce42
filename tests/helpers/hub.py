"""The hub repository and commits the tests of test_hub.py lay out in a local cache."""

from __future__ import annotations

REPO = "Org/Tiny"
OLD = "0123456789abcdef0123456789abcdef01234567"
NEW = "fedcba9876543210fedcba9876543210fedcba98"

