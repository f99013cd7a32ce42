"""The hub repository and commits test_hub.py and test_hub_runs.py lay out in a local cache."""

from __future__ import annotations

REPO = "Org/Tiny"
OLD = "0123456789abcdef0123456789abcdef01234567"
NEW = "fedcba9876543210fedcba9876543210fedcba98"

