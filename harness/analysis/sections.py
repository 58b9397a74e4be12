"""When a section of the report, the dashboard or the run summary means something.

One place for the rules, so ``abl report``, ``abl dashboard`` and the ``abl
run`` summary show and hide the same things:

- a scaling-law fit only over at least ``MIN_SIZES`` distinct model sizes
  spanning at least ``MIN_SPAN`` x in parameters (the Chinchilla form has five
  free parameters; one model +-2k parameters fits a flat line);
- an axis of FLOPs (or any cost) only when the cells' values differ by more
  than ``AXIS_REL_TOL`` (5%): the norms grid's cells differ by 1% in
  parameters (a norm's bias), which no reader can see on an axis and which
  says nothing about cost; the tables still list every figure;
- confidence bands only with at least ``MIN_SEEDS_FOR_BANDS`` seeds (at n = 2
  the 95% t multiplier is 12.7, so a band is a smear): seed lines otherwise;
- speed figures marked as contended when the run's ``contended`` metric (set
  at ingest from the load and the CPU time the run got) says so.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

MIN_SIZES = 4
MIN_SPAN = 4.0
REL_TOL = 0.05  # sizes (and costs) closer than this are one size (one model +- a norm's bias)
AXIS_REL_TOL = REL_TOL
MIN_SEEDS_FOR_BANDS = 3
CONTENDED = "contended"  # a run's final metric: 1.0 when the machine was contended during its loop


def scaling_fit_applies(n_params: Iterable[float]) -> str | None:
    """None when a scaling fit means something over these model sizes; else why not (one sentence)."""
    sizes = sorted({float(n) for n in n_params if n is not None and math.isfinite(float(n)) and float(n) > 0})
    distinct: list[float] = []
    for n in sizes:  # sizes within REL_TOL of each other are one size (one model +- a norm's bias)
        if not distinct or n > distinct[-1] * (1 + REL_TOL):
            distinct.append(n)
    if len(distinct) < MIN_SIZES:
        return (f"a scaling fit needs at least {MIN_SIZES} model sizes; these cells have {len(distinct)} "
                f"distinct size{'s' if len(distinct) != 1 else ''}")
    span = distinct[-1] / distinct[0]
    if span < MIN_SPAN:
        return (f"a scaling fit needs sizes spanning at least {MIN_SPAN:g}x in parameters; these span "
                f"{span:.2g}x")
    return None


def differs(values: Iterable[float | None], rel_tol: float = AXIS_REL_TOL) -> bool:
    """True when the finite values differ by more than ``rel_tol`` of the largest magnitude."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if len(xs) < 2:
        return False
    scale = max(abs(x) for x in xs) or 1.0
    return (max(xs) - min(xs)) > rel_tol * scale


def bands_by_default(seeds_per_cell: Iterable[int]) -> bool:
    """Confidence bands are drawn by default only when every cell shown has enough seeds."""
    ns = list(seeds_per_cell)
    return bool(ns) and min(ns) >= MIN_SEEDS_FOR_BANDS


def is_contended(final: Mapping[str, float | None]) -> bool:
    """A run whose speed figures were measured on a contended machine (its ``contended`` metric)."""
    v = final.get(CONTENDED)
    return v is not None and float(v) >= 0.5
