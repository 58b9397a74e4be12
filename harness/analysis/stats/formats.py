"""Significance stars, and rows grouped by seed (the number formats, fmt and fmt_p, are abl.analysis.formats's)."""

from __future__ import annotations

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


def seeds_of(rows: Iterable[tuple[Hashable, Hashable, float]]) -> dict[Hashable, dict[Hashable, float]]:
    """Group (cell key, seed, value) rows into cell key -> {seed: value}, keeping first-seen order."""
    out: dict[Hashable, dict[Hashable, float]] = {}
    for key, seed, value in rows:
        out.setdefault(key, {})
        if value is not None:
            out[key][seed] = value
    return out
