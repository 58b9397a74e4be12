"""A cell that shared its GPU says so where it ends (issue 37, item 3): its speed figures are contended.

No GPU: the jobs are made by hand, with the GPUs and the packing the executor would have given them
(``Job.gpus``, ``Job.packed``: abl.run.executors.LocalExecutor._place).
"""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console

from abl.contracts.status import COMPLETED, FAILED
from abl.run.executors import Job
from abl.run.progress import BarProgress, LineProgress, packed_note


def _job(tmp_path: Path, name: str, packed: int, gpus: list[int]) -> Job:
    cell = SimpleNamespace(run_id=name, label=f"norm={name}", seed=0, varied={},
                           train=SimpleNamespace(steps=10, devices=1, threads=0))
    job = Job(cell=cell, run_dir=tmp_path, index=0, gpus=gpus, packed=packed)  # type: ignore[arg-type]
    job.step, job.train_loss = 10, 3.25
    return job


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=160, force_terminal=False, color_system=None), out


def test_the_plain_end_line_says_the_cell_shared_its_gpu(tmp_path):
    console, out = _console()
    display = LineProgress(console, total=2, interval=3600.0)
    display.finish(_job(tmp_path, "a", packed=3, gpus=[1]), COMPLETED, 12.0)
    display.finish(_job(tmp_path, "b", packed=1, gpus=[0]), COMPLETED, 12.0)
    first, second = out.getvalue().splitlines()
    assert first.startswith("end   [1/2] norm=a seed=0: completed")
    assert "shared GPU 1 with 2 other cell(s)" in first and "contended" in first
    assert "shared" not in second and "contended" not in second  # alone on its GPU: nothing to say


def test_the_note_keeps_the_machine_contention_note_beside_it(tmp_path):
    console, out = _console()
    display = LineProgress(console, total=1, interval=3600.0)
    display.finish(_job(tmp_path, "a", packed=2, gpus=[0]), FAILED, 5.0, note="machine contended (load 3.00 per core)")
    line = out.getvalue().strip()
    assert "machine contended (load 3.00 per core)" in line and "shared GPU 0 with 1 other cell(s)" in line


def test_the_bar_end_line_says_the_cell_shared_its_gpu(tmp_path):
    console, _ = _console()
    display = BarProgress(console, total=1)
    line = display.end_line(_job(tmp_path, "a", packed=2, gpus=[0, 1]), COMPLETED, 12.0)
    assert "completed" in line and "shared GPUs 0,1 with 1 other cell(s)" in line
    assert "shared" not in display.end_line(_job(tmp_path, "b", packed=1, gpus=[0]), COMPLETED, 12.0)


def test_a_cpu_cell_has_no_gpu_note(tmp_path):
    assert packed_note(_job(tmp_path, "a", packed=1, gpus=[])) == ""
