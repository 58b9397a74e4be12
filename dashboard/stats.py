"""Statistics behind the pages: confidence intervals across seeds, Welch's test, EMA, Pareto.

Seeds are few (2 to 5), so intervals use the t-distribution with n - 1
degrees of freedom, not the normal approximation. Two cells are compared with
Welch's unequal-variance t-test (Welch 1947), whose degrees of freedom come
from the Welch-Satterthwaite equation; it does not assume the two cells have
the same seed-to-seed spread.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

LEVEL = 0.95


def t_halfwidth(std: Any, n: Any, level: float = LEVEL) -> np.ndarray:
    """Half-width of the ``level`` CI of a mean from its sample std and count (NaN if n < 2)."""
    std = np.asarray(std, dtype=float)
    n = np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = sps.t.ppf(0.5 + level / 2, np.where(n >= 2, n - 1, np.nan))
        return np.where(n >= 2, q * std / np.sqrt(n), np.nan)


def summarize(df: pd.DataFrame, by: str | list[str], value: str = "value") -> pd.DataFrame:
    """Per group: n, mean, std, and the 95% t-interval of the mean."""
    g = df.groupby(by, sort=False, dropna=False)[value]
    out = g.agg(n="count", mean="mean", std="std", min="min", max="max").reset_index()
    hw = t_halfwidth(out["std"], out["n"])
    out["ci_lo"] = out["mean"] - hw
    out["ci_hi"] = out["mean"] + hw
    return out


def welch(m1, s1, n1, m2, s2, n2, level: float = LEVEL) -> dict[str, np.ndarray]:
    """Welch's t-test of mean1 - mean2 from summary statistics (arrays broadcast).

    Returns the difference, its ``level`` CI, the Welch-Satterthwaite degrees
    of freedom and the two-sided p-value; NaN where either side has n < 2 or
    both have zero spread.
    """
    m1, s1, n1, m2, s2, n2 = (np.asarray(a, dtype=float) for a in (m1, s1, n1, m2, s2, n2))
    with np.errstate(invalid="ignore", divide="ignore"):
        v1, v2 = s1 ** 2 / n1, s2 ** 2 / n2
        se = np.sqrt(v1 + v2)
        dof = (v1 + v2) ** 2 / (v1 ** 2 / (n1 - 1) + v2 ** 2 / (n2 - 1))
        ok = (n1 >= 2) & (n2 >= 2) & (se > 0)
        diff = m1 - m2
        t = np.where(ok, diff / se, np.nan)
        dof = np.where(ok, dof, np.nan)
        p = np.where(ok, 2 * sps.t.sf(np.abs(t), dof), np.nan)
        hw = np.where(ok, sps.t.ppf(0.5 + level / 2, dof) * se, np.nan)
    return {"diff": diff, "diff_lo": diff - hw, "diff_hi": diff + hw, "t": t, "dof": dof, "p": p}


def paired(a: dict, b: dict, level: float = LEVEL) -> dict[str, float]:
    """Paired t-test of a - b over the keys (seeds) both have: difference, its CI, p, pairs.

    In abl two cells run with the same seed see the same training batches in
    the same order, so their per-seed differences cancel the variance the
    seed causes in both; NaN with fewer than 2 pairs or no spread.
    """
    keys = sorted(set(a) & set(b))
    d = np.array([a[k] - b[k] for k in keys], dtype=float)
    out = {"diff": float(d.mean()) if len(d) else np.nan, "diff_lo": np.nan, "diff_hi": np.nan,
           "p": np.nan, "pairs": len(d)}
    if len(d) >= 2:
        sd = d.std(ddof=1)
        if sd > 0:
            se = sd / np.sqrt(len(d))
            t = out["diff"] / se
            out["p"] = float(2 * sps.t.sf(abs(t), len(d) - 1))
            hw = float(sps.t.ppf(0.5 + level / 2, len(d) - 1) * se)
            out["diff_lo"], out["diff_hi"] = out["diff"] - hw, out["diff"] + hw
    return out


def holm(p: Any) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (NaN entries are left out and stay NaN)."""
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


def stars(p: float) -> str:
    if p is None or not np.isfinite(p):
        return "n/a"
    if p < 0.001:
        return "***"
    if p < 0.01:
        return "**"
    if p < 0.05:
        return "*"
    return "n.s."


def ema(values: np.ndarray, weight: float) -> np.ndarray:
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


def ema_by_group(df: pd.DataFrame, group: str, col: str, weight: float) -> np.ndarray:
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


def downsample(df: pd.DataFrame, group: str, max_points: int) -> pd.DataFrame:
    """Keep at most ``max_points`` evenly spaced rows per group (always the first and last)."""
    if df.empty:
        return df
    pos = df.groupby(group, sort=False).cumcount().to_numpy()
    size = df.groupby(group, sort=False)[group].transform("size").to_numpy()
    stride = np.maximum(1, np.ceil(size / max_points)).astype(int)
    keep = (pos % stride == 0) | (pos == size - 1)
    return df[keep]


def flatten(obj: Any, prefix: str = "$") -> dict[str, Any]:
    """A config as {JSON path: scalar}."""
    if isinstance(obj, str):
        try:
            obj = json.loads(obj)
        except json.JSONDecodeError:
            return {prefix: obj}
    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}"))
    elif isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = obj
    return out


def config_diff(a: Any, b: Any, ignore: tuple[str, ...] = ("$.seed",)) -> pd.DataFrame:
    """Rows (path, a, b) where two configs differ, keys missing on one side included."""
    fa, fb = flatten(a), flatten(b)
    rows = []
    for path in sorted(set(fa) | set(fb)):
        if path in ignore:
            continue
        va, vb = fa.get(path, "(absent)"), fb.get(path, "(absent)")
        if va != vb:
            rows.append({"path": path[2:], "this run": _show(va), "baseline": _show(vb)})
    return pd.DataFrame(rows, columns=["path", "this run", "baseline"])


def _show(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)
