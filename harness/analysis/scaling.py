"""Scaling-law fit: L(N, D) = E + A / N^alpha + B / D^beta (Chinchilla form).

Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models",
arXiv:2203.15556, sec. 3.3 (Approach 3); the fitting procedure is its App. D.2: with
E = exp(e), A = exp(a), B = exp(b), minimise

    sum_i Huber_delta( LSE(a - alpha log N_i, b - beta log D_i, e) - log L_i ),  delta = 1e-3

with L-BFGS from a grid of starting points (alpha, beta in {0, 0.5, ..., 2},
e in {-1, -0.5, ..., 1}, a, b in {0, 5, ..., 25}). To keep this cheap, the
objective is evaluated at every grid point at once and L-BFGS starts from the
best of them in turn, until a few starts in a row find nothing better; the
best local optimum wins.

N is the non-embedding parameter count (Kaplan et al. 2020, arXiv:2001.08361,
fig. 6: without the embeddings, models of different depths fall on one trend) and D the training tokens.
When every point has the same D (a pure model-size ladder), B / D^beta is a
constant that E absorbs: the fit is L(N) = E' + A / N^alpha and ``B`` and
``beta`` are None (likewise for a single N).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

HUBER_DELTA = 1e-3
ALPHA_GRID = (0.0, 0.5, 1.0, 1.5, 2.0)
E_GRID = (-1.0, -0.5, 0.0, 0.5, 1.0)
LOG_COEF_GRID = (0.0, 5.0, 10.0, 15.0, 20.0, 25.0)


class ScalingFitError(ValueError):
    """Too few or unusable points for a fit."""


@dataclass
class ScalingFit:
    E: float
    A: float | None
    alpha: float | None
    B: float | None
    beta: float | None
    n_points: int
    n_sizes: int  # distinct N
    n_token_budgets: int  # distinct D
    form: str  # which terms were fitted
    objective: float  # the Huber objective at the optimum (sum over points)
    rmse_log: float  # root-mean-square residual of log L
    starts: int  # L-BFGS starts run
    converged: bool
    notes: list[str] = field(default_factory=list)

    def predict(self, n: float | np.ndarray, d: float | np.ndarray) -> np.ndarray:
        out = np.full(np.broadcast(np.asarray(n, float), np.asarray(d, float)).shape, self.E, dtype=float)
        if self.A is not None:
            out = out + self.A / np.asarray(n, float) ** self.alpha
        if self.B is not None:
            out = out + self.B / np.asarray(d, float) ** self.beta
        return out

    def optimal_allocation(self, flops: float) -> tuple[float, float] | None:
        """Compute-optimal (N, D) for a budget C = 6 N D (Hoffmann et al. eq. 4); None without both terms."""
        if None in (self.A, self.B, self.alpha, self.beta) or not (self.alpha and self.beta):
            return None
        a, b, big_a, big_b = self.alpha, self.beta, self.A, self.B
        assert big_a is not None and big_b is not None
        g = (a * big_a / (b * big_b)) ** (1 / (a + b))
        n = g * (flops / 6) ** (b / (a + b))
        return n, flops / (6 * n)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("E", "A", "alpha", "B", "beta", "n_points", "n_sizes",
                                             "n_token_budgets", "form", "objective", "rmse_log",
                                             "starts", "converged", "notes")}


def _huber(r: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Huber loss and its derivative, elementwise."""
    a = np.abs(r)
    loss = np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))
    grad = np.where(a <= delta, r, delta * np.sign(r))
    return loss, grad


def _terms(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, use_n: bool, use_d: bool):
    """Columns of the log-sum-exp and, per column, d(column)/d(theta). theta = (e, a, alpha, b, beta)."""
    cols = [np.full_like(log_n, theta[0])]
    if use_n:
        cols.append(theta[1] - theta[2] * log_n)
    if use_d:
        cols.append(theta[3] - theta[4] * log_d)
    return np.stack(cols, axis=-1)


def _objective(theta, log_n, log_d, log_l, use_n, use_d, delta, scale):
    z = _terms(theta, log_n, log_d, use_n, use_d)
    m = z.max(axis=-1, keepdims=True)
    w = np.exp(z - m)
    s = w.sum(axis=-1, keepdims=True)
    lse = (m + np.log(s))[..., 0]
    w = w / s
    r = lse - log_l
    loss, dr = _huber(r, delta)
    g = np.zeros(5)
    g[0] = np.sum(dr * w[:, 0])
    col = 1
    if use_n:
        g[1] = np.sum(dr * w[:, col])
        g[2] = -np.sum(dr * w[:, col] * log_n)
        col += 1
    if use_d:
        g[3] = np.sum(dr * w[:, col])
        g[4] = -np.sum(dr * w[:, col] * log_d)
    return float(loss.sum()) * scale, g * scale


def _grid_objective(starts: np.ndarray, log_n, log_d, log_l, use_n, use_d, delta) -> np.ndarray:
    """The objective at many starting points at once: starts [S, 5] -> [S]."""
    cols = [np.broadcast_to(starts[:, :1], (len(starts), len(log_n)))]
    if use_n:
        cols.append(starts[:, 1:2] - starts[:, 2:3] * log_n[None, :])
    if use_d:
        cols.append(starts[:, 3:4] - starts[:, 4:5] * log_d[None, :])
    z = np.stack(cols, axis=-1)
    m = z.max(axis=-1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(axis=-1, keepdims=True)))[..., 0]
    loss, _ = _huber(lse - log_l[None, :], delta)
    return loss.sum(axis=1)


def fit(n: Sequence[float], d: Sequence[float], loss: Sequence[float], *, delta: float = HUBER_DELTA,
        n_starts: int = 32, patience: int = 4) -> ScalingFit:
    """Fit L(N, D) = E + A/N^alpha + B/D^beta to points (N_i, D_i, L_i). Raises ScalingFitError.

    L-BFGS runs from the ``n_starts`` best grid points, best first, and stops
    early once ``patience`` starts in a row found no better optimum.
    """
    from scipy.optimize import minimize

    n_arr, d_arr, l_arr = (np.asarray(v, dtype=float) for v in (n, d, loss))
    if not (len(n_arr) == len(d_arr) == len(l_arr)):
        raise ScalingFitError("n, d and loss must have the same length")
    ok = np.isfinite(n_arr) & np.isfinite(d_arr) & np.isfinite(l_arr) & (n_arr > 0) & (d_arr > 0) & (l_arr > 0)
    notes = [] if ok.all() else [f"dropped {int((~ok).sum())} point(s) with non-finite or non-positive values"]
    n_arr, d_arr, l_arr = n_arr[ok], d_arr[ok], l_arr[ok]
    n_sizes, n_budgets = len(np.unique(n_arr)), len(np.unique(d_arr))
    use_n, use_d = n_sizes >= 2, n_budgets >= 2
    if not (use_n or use_d):
        raise ScalingFitError("every point has the same N and D: nothing to fit")
    k = 1 + 2 * use_n + 2 * use_d
    if len(l_arr) <= k:
        raise ScalingFitError(f"{len(l_arr)} points for {k} free constants: need more points")
    if use_n and use_d:
        form = "L(N, D) = E + A/N^alpha + B/D^beta"
    elif use_n:
        form = f"L(N) = E + A/N^alpha at D = {d_arr[0]:.4g} tokens (B/D^beta is folded into E)"
    else:
        form = f"L(D) = E + B/D^beta at N = {n_arr[0]:.4g} (A/N^alpha is folded into E)"
    log_n, log_d, log_l = np.log(n_arr), np.log(d_arr), np.log(l_arr)

    grid = np.array(list(itertools.product(
        E_GRID, LOG_COEF_GRID if use_n else (0.0,), ALPHA_GRID if use_n else (0.0,),
        LOG_COEF_GRID if use_d else (0.0,), ALPHA_GRID if use_d else (0.0,))))
    scores = _grid_objective(grid, log_n, log_d, log_l, use_n, use_d, delta)
    order = np.argsort(scores, kind="stable")[:n_starts]
    # scale so that residuals of order delta give an objective of order 1 (L-BFGS tolerances)
    scale = 1.0 / (delta * delta * len(l_arr))
    bounds = [(-20.0, 10.0),
              (-50.0, 200.0) if use_n else (0.0, 0.0), (0.0, 5.0) if use_n else (0.0, 0.0),
              (-50.0, 200.0) if use_d else (0.0, 0.0), (0.0, 5.0) if use_d else (0.0, 0.0)]
    best, stale, runs = None, 0, 0
    for i in order:
        res = minimize(_objective, grid[i], args=(log_n, log_d, log_l, use_n, use_d, delta, scale),
                       jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": 2000, "ftol": 1e-15, "gtol": 1e-12})
        runs += 1
        improved = best is None or res.fun < best.fun - 1e-9 * max(1.0, abs(best.fun))
        if best is None or res.fun < best.fun:
            best = res
        stale = 0 if improved else stale + 1
        if stale >= patience or best.fun < 1e-12:  # nothing better for a while, or an exact fit
            break
    assert best is not None
    e, a, alpha, b, beta = (float(x) for x in best.x)
    z = _terms(best.x, log_n, log_d, use_n, use_d)
    m = z.max(axis=-1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(axis=-1, keepdims=True)))[..., 0]
    rmse = float(np.sqrt(np.mean((lse - log_l) ** 2)))
    for name, lo_hi, val, used in (("alpha", (0.0, 5.0), alpha, use_n), ("beta", (0.0, 5.0), beta, use_d)):
        if used and (math.isclose(val, lo_hi[0], abs_tol=1e-6) or math.isclose(val, lo_hi[1], abs_tol=1e-6)):
            notes.append(f"{name} hit its bound {val:g}: the fit is not informative about it")
    return ScalingFit(
        E=math.exp(e), A=math.exp(a) if use_n else None, alpha=alpha if use_n else None,
        B=math.exp(b) if use_d else None, beta=beta if use_d else None,
        n_points=len(l_arr), n_sizes=n_sizes, n_token_budgets=n_budgets, form=form,
        objective=float(best.fun) / scale, rmse_log=rmse, starts=runs, converged=bool(best.success),
        notes=notes)
