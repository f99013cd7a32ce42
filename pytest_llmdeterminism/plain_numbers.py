"""Numbers as a test passes them to a setting (a numpy scalar, a ``Fraction``, ...) turned into the
plain ``int`` and ``float`` that goldens and reports hold as JSON. A ``bool`` is never a number here:
``max_new_tokens=True`` is a mistake, not 1."""

from __future__ import annotations

import math
import numbers

__all__ = ["as_float", "as_int"]


def as_int(value: object) -> int | None:
    """``value`` as a plain ``int`` when it is an integer (``int``, ``numpy.int64``, any
    ``numbers.Integral``) and not a bool; else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def as_float(value: object) -> float | None:
    """``value`` as a plain ``float`` when it is a real number (``float``, ``numpy.float32``, an
    integer, any ``numbers.Real``) and not a bool; else None. An integer beyond float's range is
    ``inf`` (a finite check refuses it), not an ``OverflowError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except OverflowError:
        return -math.inf if value < 0 else math.inf
