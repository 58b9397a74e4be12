"""Multiple-comparison corrections over a table's comparisons."""

from __future__ import annotations

from typing import Any

import numpy as np

HOLM, NO_CORRECTION = "holm", "none"


def holm(p: Any) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (NaN entries are left out and stay NaN).

    Holm 1979, "A simple sequentially rejective multiple test procedure",
    Scandinavian Journal of Statistics 6(2): the i-th smallest of m p-values
    is multiplied by m - i + 1, capped at 1 and made monotone, which keeps the
    family-wise error rate at alpha.
    """
    p = np.asarray(p, dtype=float)
    out = np.full_like(p, np.nan)
    idx = np.where(~np.isnan(p))[0]
    if len(idx) == 0:
        return out
    order = idx[np.argsort(p[idx])]
    m = len(order)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out
