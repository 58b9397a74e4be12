"""Numbers as every table prints them (means, p-values, significance stars), and rows grouped by seed."""

from __future__ import annotations

import math
from typing import Hashable, Iterable

import numpy as np


def stars(p: float | None) -> str:
    if p is None or not np.isfinite(p):
        return "n/a"
    if p < 0.001:
        return "***"
    if p < 0.01:
        return "**"
    if p < 0.05:
        return "*"
    return "n.s."


def fmt(x: float | None, digits: int = 4) -> str:
    """The one number format of tables (reports and CLI)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{digits}f}"


def fmt_p(p: float | None) -> str:
    if p is None:
        return "-"
    return "<0.0001" if p < 1e-4 else f"{p:.4f}"


def seeds_of(rows: Iterable[tuple[Hashable, Hashable, float]]) -> dict[Hashable, dict[Hashable, float]]:
    """Group (cell key, seed, value) rows into cell key -> {seed: value}, keeping first-seen order."""
    out: dict[Hashable, dict[Hashable, float]] = {}
    for key, seed, value in rows:
        out.setdefault(key, {})
        if value is not None:
            out[key][seed] = value
    return out
