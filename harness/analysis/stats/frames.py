"""Frames and curves for the dashboard: group summaries, smoothing, Pareto fronts, downsampling.

The helpers take pandas objects but do not import pandas.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .ttest import CONFIDENCE, t_halfwidth


def summarize_groups(df: Any, by: str | list[str], value: str = "value",
                     confidence: float = CONFIDENCE) -> Any:
    """Per group of a DataFrame: n, mean, std, min, max and the t-interval of the mean (ci_lo, ci_hi)."""
    g = df.groupby(by, sort=False, dropna=False)[value]
    out = g.agg(n="count", mean="mean", std="std", min="min", max="max").reset_index()
    hw = t_halfwidth(out["std"], out["n"], confidence)
    out["ci_lo"] = out["mean"] - hw
    out["ci_hi"] = out["mean"] + hw
    return out


def ema(values: Any, weight: float) -> np.ndarray:
    """Debiased exponential moving average (TensorBoard's smoothing), weight in [0, 1)."""
    y = np.asarray(values, dtype=float)
    if weight <= 0 or len(y) == 0:
        return y
    from scipy.signal import lfilter

    finite = np.isfinite(y)
    filled = np.where(finite, y, 0.0)
    num = lfilter([1 - weight], [1, -weight], filled)
    den = lfilter([1 - weight], [1, -weight], finite.astype(float))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def ema_by_group(df: Any, group: str, col: str, weight: float) -> np.ndarray:
    """EMA of ``col`` within each group; ``df`` must be sorted by group then step."""
    if weight <= 0:
        return df[col].to_numpy(dtype=float)
    out = np.empty(len(df))
    values = df[col].to_numpy(dtype=float)
    keys = df[group].to_numpy()
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    ends = np.r_[starts[1:], len(df)]
    for a, b in zip(starts, ends):
        out[a:b] = ema(values[a:b], weight)
    return out


def pareto_mask(x: Any, y: Any, x_better: str = "lower") -> np.ndarray:
    """True for points not dominated by another: y lower is better, x per ``x_better``."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    sx = -x if x_better == "higher" else x
    ok = np.isfinite(sx) & np.isfinite(y)
    mask = np.zeros(len(x), dtype=bool)
    idx = np.where(ok)[0]
    # sweep by cost ascending (ties: better y first); a point is on the front if it beats
    # every cheaper point's y
    order = idx[np.lexsort((y[idx], sx[idx]))]
    best = math.inf
    for i in order:
        if y[i] < best:
            mask[i] = True
            best = y[i]
    return mask


def downsample(df: Any, group: str, max_points: int) -> Any:
    """Keep at most ``max_points`` evenly spaced rows per group (always the first and last)."""
    if df.empty:
        return df
    pos = df.groupby(group, sort=False).cumcount().to_numpy()
    size = df.groupby(group, sort=False)[group].transform("size").to_numpy()
    stride = np.maximum(1, np.ceil(size / max_points)).astype(int)
    keep = (pos % stride == 0) | (pos == size - 1)
    return df[keep]
