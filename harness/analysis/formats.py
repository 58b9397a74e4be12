"""Numbers and byte counts as every table prints them: the CLI summary, abl cost, the report, the dashboard.

One place so that a figure reads the same wherever it is shown. Callers pick the
precision (``digits``, ``decimals``) and the mark for a missing value (the dashboard
shows an en dash, text tables a hyphen); the rules are shared.
"""

from __future__ import annotations

import math
from typing import Any

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def fmt(x: float | None, digits: int = 4, signed: bool = False, missing: str = "-") -> str:
    """A mean, difference or interval end at a fixed number of decimals (``signed``: always a sign)."""
    if _missing(x):
        return missing
    assert x is not None
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def fmt_p(p: float | None) -> str:
    """A p-value: four decimals, or ``<0.0001``."""
    if p is None:
        return "-"
    return "<0.0001" if p < 1e-4 else f"{p:.4f}"


def fmt_bytes(n: Any, decimals: int = 1, missing: str = "-") -> str:
    """A byte count in binary units (B, KiB, MiB, GiB, TiB): whole bytes, else ``decimals`` places."""
    if n is None:
        return missing
    x = float(n)
    if not math.isfinite(x):
        return missing
    for unit in _BYTE_UNITS:
        if abs(x) < 1024 or unit == _BYTE_UNITS[-1]:
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.{decimals}f} {unit}"
        x /= 1024
    raise AssertionError("unreachable: the last unit always returns")
