"""What ``abl run`` shows while it runs: plain lines in a log file, whole timers at 80 columns."""

import io
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import ROOT, tiny_grid_text
from rich.console import Console

from abl.run.executors import Job
from abl.run.progress import BarProgress, LineProgress, contention_note, fmt_duration, heartbeat_interval

GRID = tiny_grid_text(experiment={"name": "progress"}, model={"n_layers": 2, "context": 32},
                      train={"steps": 40, "batch_size": 4, "eval_every": 20, "threads": None}, eval=None,
                      dataset={"pystdlib": {"max_bytes": 200000}})

TIMER = r"(\d+:\d\d:\d\d|-:--:--)"


def fake_job(index, label, steps=500, step=0, loss=None):
    cell = SimpleNamespace(label=label, seed=3, run_id=f"r{index}", train=SimpleNamespace(steps=steps))
    job = Job(cell=cell, run_dir=None, index=index)  # type: ignore[arg-type]
    job.step, job.train_loss = step, loss
    return job


def test_bar_keeps_both_timers_whole_at_80_columns():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80, color_system=None)
    bars = BarProgress(console, 12)
    label = "model.norm=rmsnorm, model.block=sandwich, model.position=rope, model.mixer=gqa"
    bars.update(fake_job(2, label, step=120, loss=3.4123))
    bars.update(fake_job(10, "model.norm=none", step=7, loss=5.0))
    render = io.StringIO()
    Console(file=render, width=80, color_system=None).print(bars.progress.get_renderable())
    lines = [line for line in render.getvalue().splitlines() if line.strip()]
    assert len(lines) == 3, lines
    for line in lines:
        assert len(line) <= 80
        assert re.search(TIMER + r"\s+" + TIMER + r"\s*$", line), line  # elapsed and remaining, whole
    assert "cells 0/12" in lines[0]
    # the long label loses its axis names, then is cut from the middle of its values: every value, the
    # cell number and the seed stay (tests/test_progress_line.py: at 80 columns with a 2-axis grid)
    assert "[3/12]" in lines[1] and "rope, gqa seed=3" in lines[1] and "…" in lines[1]
    assert "120 loss 3.412" in lines[1]
    assert "[11/12] model.norm=none seed=3" in lines[2]


def test_heartbeat_lines_give_step_loss_and_eta():
    out = io.StringIO()
    lines = LineProgress(Console(file=out, width=200), 4, 30.0)
    job = fake_job(0, "model.norm=rmsnorm", steps=100)
    lines.update(job)
    job.step, job.train_loss = 10, 4.5
    lines.update(job)
    lines.running[job.cell.run_id][1].first = (0.0, 10)  # 10 steps per second since step 10
    lines.running[job.cell.run_id][1].last = (4.0, 50)
    job.step, job.train_loss = 50, 3.25
    lines.heartbeat()
    lines.finish(job, "completed", 75.0)
    text = out.getvalue()
    assert "start [1/4] model.norm=rmsnorm seed=3: 100 steps" in text
    assert "cells 0/4 done, 1 running" in text
    assert "[1/4] model.norm=rmsnorm seed=3: step 50/100, loss 3.250, ETA 5s" in text
    assert "end   [1/4] model.norm=rmsnorm seed=3: completed at step 50/100, loss 3.250, wall 1m15s (cells 1/4)" \
        in text


def test_durations_and_interval(monkeypatch):
    assert [fmt_duration(s) for s in (4.4, 65, 3725, None)] == ["4s", "1m05s", "1h02m", "-"]
    monkeypatch.setenv("ABL_HEARTBEAT_S", "0.5")
    assert heartbeat_interval() == 0.5
    monkeypatch.setenv("ABL_HEARTBEAT_S", "soon")
    assert heartbeat_interval() == 30.0


def test_end_line_warns_of_a_contended_machine():
    assert contention_note({"load_per_core": 0.3, "cpu_util": 0.95}, {"device_type": "cpu"}) == ""
    assert contention_note({}, {}) == ""  # a run from before the figures: no warning
    cpu = contention_note({"load_per_core": 0.3, "cpu_util": 0.4}, {"device_type": "cpu"})
    assert cpu.startswith("machine contended") and "40% of its threads' CPU time" in cpu
    gpu = contention_note({"load_per_core": 2.5, "cpu_util": 0.4}, {"device_type": "cuda"})
    assert "load 2.50 per core" in gpu and "CPU time" not in gpu
    assert contention_note({"load_per_core": 0.3, "cpu_util": 0.4}, {"device_type": "cuda"}) == ""
    out = io.StringIO()
    lines = LineProgress(Console(file=out, width=200), 1, 30.0)
    job = fake_job(0, "model.norm=rmsnorm", steps=10)
    lines.update(job)
    lines.finish(job, "completed", 3.0, cpu)
    assert out.getvalue().splitlines()[-1].endswith("(cells 1/1); " + cpu)


@pytest.mark.slow
def test_log_file_gets_start_end_and_heartbeat_lines_and_a_rerun_draws_no_bar(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(GRID)
    db = tmp_path / "out" / "x.duckdb"
    log = tmp_path / "run.log"
    env = dict(os.environ, ABL_HEARTBEAT_S="0.3", COLUMNS="80")
    with open(log, "w") as f:  # stdout is a file, as under nohup or in CI
        r = subprocess.run([sys.executable, "-m", "abl.cli", "run", str(grid), "--db", str(db)], cwd=ROOT,
                           stdout=f, stderr=subprocess.PIPE, text=True, env=env, timeout=600)
    text = log.read_text()
    assert r.returncode == 0, text + r.stderr
    for n, norm in ((1, "rmsnorm"), (2, "layernorm")):
        assert re.search(rf"^start \[{n}/2\] .*norm={norm} seed=0: 40 steps, \d+ thread\(s\) \(.*\)$", text,
                         re.MULTILINE), text
        assert re.search(rf"^end   \[{n}/2\] .*norm={norm} seed=0: completed at step 40/40, loss \d+\.\d{{3}} "
                         rf"val \d+\.\d{{3}}, wall \d+s \(cells \d/2\)(; machine contended \(.*\): .*)?$",
                         text, re.M), text
    assert re.search(r"^heartbeat \S+: cells [012]/2 done, [012] running$", text, re.M), text
    assert re.search(r"^  \[[12]/2\] .* seed=0: step \d+/40", text, re.M), text
    # issue 27: the whole grid's cost and ETA as it starts and in every heartbeat
    assert re.search(r"^whole grid: \S+ training FLOPs \(cost model\), ETA ", text, re.MULTILINE), text
    assert re.search(r"^  whole grid: ETA ", text, re.MULTILINE), text
    assert not re.search(r"^\s*cells \d", text, re.M)  # no bar in a log file

    r = subprocess.run([sys.executable, "-m", "abl.cli", "run", str(grid), "--db", str(db)], cwd=ROOT,
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 already completed, skipped; 0 to run" in r.stdout
    assert "cells 0/0" not in r.stdout and "heartbeat" not in r.stdout
