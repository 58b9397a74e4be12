"""The whole grid's ETA when several cells share a GPU (issue 37, item 2).

At start the speed comes from the store's earlier runs, which may have run alone: a cell's speed alone,
times the cells run at once, is what the grid does only if packing costs none of the GPU's speed. The
honest start figure is a range, from that up to the GPU's speed shared by its cells; once cells run,
their measured (contended) speed gives one figure, spread over the cells that actually ran at once.
No GPU: the estimate is given its slots and GPUs, the clock is passed in.
"""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from abl.run.estimate import GridEstimate
from abl.run.progress import LineProgress, grid_eta


@pytest.fixture
def jobs(norm_grid_jobs):
    return norm_grid_jobs


def _ten_seconds_a_cell(jobs, registry) -> dict[str, list[float]]:
    per_cell = GridEstimate(jobs, registry, slots=1).total() / len(jobs)
    return {"flops": [per_cell / 10.0]}  # an earlier run did a cell's work in 10 s


def test_three_cells_on_one_gpu_do_not_start_with_a_third_of_the_alone_time(jobs, registry):
    """3 cells of 10 s each (alone, in the store) packed on one GPU: the old ETA said 10 s, as if each kept
    its alone speed beside the others; the figure is now 30 s (the GPU's speed shared), 10 s the least."""
    est = GridEstimate(jobs, registry, slots=3, prior=_ten_seconds_a_cell(jobs, registry), gpus=1)
    eta, source = est.eta([])
    assert eta == pytest.approx(30.0)
    low, high, _ = est.eta_span([])
    assert (low, high) == (pytest.approx(10.0), pytest.approx(30.0))
    assert "3 cells share each GPU" in source
    line = est.start_line()
    assert "ETA 10s to 30s" in line and "1 earlier run(s)" in line
    assert grid_eta(est, []).startswith("whole grid: ETA 10s to 30s (")


def test_one_cell_per_gpu_and_the_cpu_keep_one_figure(jobs, registry):
    prior = _ten_seconds_a_cell(jobs, registry)
    for est in (GridEstimate(jobs, registry, slots=3, prior=prior),  # CPU: --workers 3
                GridEstimate(jobs, registry, slots=3, prior=prior, gpus=3)):  # a GPU each
        eta, source = est.eta([])
        assert eta == pytest.approx(10.0) and "share" not in source
        assert "ETA 10s (" in est.start_line()


def test_a_two_gpu_cell_counts_the_gpus_it_takes(jobs, registry):
    for j in jobs:
        j.cell.train.devices = 2
    est = GridEstimate(jobs, registry, slots=2, prior=_ten_seconds_a_cell(jobs, registry), gpus=2)
    low, high, _ = est.eta_span([])
    assert (low, high) == (pytest.approx(15.0), pytest.approx(30.0))  # 2 at once on 2 GPUs, or 1 alone


def test_once_cells_run_their_measured_speed_is_spread_over_the_cells_that_ran_at_once(jobs, registry):
    """3 slots, but the GPU's memory held 2 cells at once: the speed those 2 measured is not multiplied by 3."""
    est = GridEstimate(jobs, registry, slots=3, prior=_ten_seconds_a_cell(jobs, registry), gpus=1)
    now = time.time()
    a, b = jobs[0], jobs[1]
    for j in (a, b):
        j.started, j.step = now - 10.0, 50  # half a cell in 10 s each, side by side
    low, high, source = est.eta_span([a, b], now=now)
    assert source == "measured so far"
    assert low == high == pytest.approx(20.0)  # the 2 halves left and the third cell, 2 at a time: 2W / (2 x W/20 s)


def test_the_heartbeat_shows_the_range(jobs, registry):
    out = io.StringIO()
    est = GridEstimate(jobs, registry, slots=3, prior=_ten_seconds_a_cell(jobs, registry), gpus=1)
    lines = LineProgress(Console(file=out, width=300), 3, 3600.0, est)
    lines.update(jobs[0])
    lines.heartbeat()
    assert "whole grid: ETA 10s to 30s (from 1 earlier run(s) in the store" in out.getvalue()


def test_the_runner_gives_the_estimate_the_gpus_its_cells_share(jobs, registry, tmp_path, monkeypatch):
    """``abl run``'s start line passes the local executor's GPUs to the estimate (a range when they share)."""
    from abl.run import estimate, runner

    seen = {}

    class Spy(GridEstimate):
        def __init__(self, *a, **k):
            seen.update(k)
            super().__init__(*a, **k)

    class Local:  # a local executor with two GPUs, three slots
        local, use_gpus, gpus, slots = True, True, [0, 1], 3

    monkeypatch.setattr(estimate, "GridEstimate", Spy)
    monkeypatch.setattr(runner.store, "completed_rates", lambda db: {})
    runner.start_estimate(jobs, registry, tmp_path / "abl.duckdb", Local(), Console(file=io.StringIO()))
    assert seen.get("gpus") == 2
    Local.use_gpus = False  # the CPU: no GPUs to share
    runner.start_estimate(jobs, registry, tmp_path / "abl.duckdb", Local(), Console(file=io.StringIO()))
    assert seen.get("gpus") is None
