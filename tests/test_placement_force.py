"""A cell of more devices than there are GPUs (issue 37): ``--force`` overrides the memory check, not arithmetic.

Such a cell was let through by ``--force`` and then never placed: the executor's loop waited for it for ever,
and nothing after it started. It is now refused before anything starts (exit 2, the cell, its devices and
the GPUs named, no lock nor store left), and one that reaches the executor anyway (``run_grid`` called
without the admission) is stored failed with that reason while the other cells go on.

There is no GPU here: the GPUs are ``CUDA_VISIBLE_DEVICES``' (abl.run.admission.visible_gpus) or given to
the executor, the free memory query is stood in for, and the workers are fake processes. A loop that spins
is stopped by a ``time.sleep`` that gives up after many calls, so the test fails instead of hanging.
"""

from __future__ import annotations

import subprocess
import time
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from conftest import tiny_grid_text

from abl.cli import cli
from abl.contracts.status import FAILED
from abl.run import admission
from abl.run.executors import Job, LocalExecutor

GiB = 1024**3


class Spinning(Exception):
    pass


@pytest.fixture
def no_spinning(monkeypatch):
    """``time.sleep`` that returns at once and raises ``Spinning`` after 2000 calls (a loop waiting for ever)."""
    calls = []

    def sleep(s):
        calls.append(s)
        if len(calls) > 2000:
            raise Spinning("the run loop waited for ever")

    monkeypatch.setattr(time, "sleep", sleep)
    return calls


@pytest.mark.parametrize("free", [{0: 80 * GiB, 1: 80 * GiB}, None])
def test_force_does_not_start_a_grid_with_a_cell_of_more_devices_than_gpus(tmp_path, monkeypatch, no_spinning, free):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("ABL_ZYGOTE", "0")
    monkeypatch.setattr(admission, "gpu_free_bytes", lambda idx: free)
    launched = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: launched.append(a) or pytest.fail("a worker started"))
    grid = tmp_path / "g.toml"
    grid.write_text(tiny_grid_text(experiment={"name": "wide", "seeds": [0]}, train={"batch_size": 4},
                                   grid={"train.devices": [1, 4]}))
    db = tmp_path / "store" / "x.duckdb"
    r = CliRunner().invoke(cli, ["run", str(grid), "--db", str(db), "--force"])
    assert r.exit_code == 2, (r.output, r.exception)
    assert "train.devices = 4" in r.output and "2 GPU(s) (GPU 0, GPU 1)" in r.output
    assert "--force" in r.output and "traceback" not in r.output.lower()
    assert "train.devices = 1" not in r.output  # the cell that fits is not named
    assert not launched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.toml"]  # no store, no lock, no run folder


def _job(tmp_path, name: str, devices: int, index: int, device: str = "auto") -> Job:
    d = tmp_path / name
    d.mkdir()
    cell = SimpleNamespace(train=SimpleNamespace(devices=devices, threads=0, timeout_s=0, device=device),
                           run_id=name, label=name, seed=0)
    return Job(cell=cell, run_dir=d, index=index)  # type: ignore[arg-type]


class _FakePopen:
    def __init__(self, argv, env=None, **kw):
        self.pid, self.env = 0, env

    def poll(self):
        return 0


def test_a_cell_of_more_devices_than_gpus_mid_grid_is_stored_failed_and_the_others_go_on(
        tmp_path, monkeypatch, no_spinning):
    monkeypatch.setenv("ABL_ZYGOTE", "0")
    monkeypatch.setattr(subprocess, "Popen", _FakePopen)
    ex = LocalExecutor(gpus=[0, 1])
    wide, after = _job(tmp_path, "wide", 4, 0), _job(tmp_path, "after", 1, 1)
    launched, done = [], []
    ex.run([wide, after], on_progress=lambda j: None, on_done=done.append, poll_s=0,
           on_launch=lambda j: launched.append(j.cell.run_id))
    assert [j.cell.run_id for j in done] == ["wide", "after"]
    assert launched == ["wide", "after"]  # on_launch sets up its folder, so the runner can store it
    assert wide.handle is None and wide.end is not None and after.handle is not None
    status, why = wide.end.status()
    assert status == FAILED
    assert "train.devices = 4" in why and "2 GPU(s) (GPU 0, GPU 1)" in why
    assert ex.placement.on == {0: {}, 1: {}}  # nothing was taken for it, and the other cell released its GPU


def test_check_run_refuses_only_the_cells_that_run_again(tmp_path, monkeypatch):
    monkeypatch.setattr(admission, "admit", lambda *a, **k: [])  # the memory check is not what refuses it
    ex = LocalExecutor(gpus=[0])
    wide = SimpleNamespace(train=SimpleNamespace(devices=2, device="auto"), run_id="w", label="w", seed=0)
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "status.json").write_text('{"status": "completed"}')
    assert admission.check_run([wide], None, tmp_path, ex, retry_failed=False) == []  # type: ignore[list-item]
    (tmp_path / "w" / "status.json").write_text('{"status": "failed"}')
    with pytest.raises(admission.AdmissionError, match="train.devices = 2"):
        admission.check_run([wide], None, tmp_path, ex, retry_failed=True)  # type: ignore[list-item]
    assert admission.check_run([wide], None, tmp_path, LocalExecutor(gpus=[]), retry_failed=True) == []  # type: ignore[list-item]


def test_run_grid_without_the_admission_stores_the_wide_cell_failed_and_trains_the_other(
        tmp_path, registry, monkeypatch):
    """Through the runner (``run_grid`` called directly: no memory check ran): the cell that can never be
    placed is stored failed with the reason, in its folder and the store; the other one trains (on the CPU
    here: its worker finds no CUDA behind ``CUDA_VISIBLE_DEVICES``)."""
    import io

    from rich.console import Console

    from abl.contracts.status import COMPLETED
    from abl.grid.gridfile import load_grid
    from abl.run.runner import run_grid
    from abl.store import database as store
    from abl.store import rundir

    monkeypatch.setenv("ABL_ZYGOTE", "0")
    grid = tmp_path / "g.toml"
    grid.write_text(tiny_grid_text(experiment={"name": "wide", "seeds": [0]}, train={"batch_size": 4},
                                   grid={"train.devices": [4, 1]}))
    g = load_grid(str(grid), registry, [])
    db, runs = tmp_path / "store" / "x.duckdb", tmp_path / "runs"
    out = io.StringIO()
    failures = run_grid(g, registry, db, runs, executor=LocalExecutor(gpus=[0, 1], speed_pass="never"),
                        console=Console(file=out, width=300), summary=False)
    wide, narrow = sorted(g.cells, key=lambda c: -c.train.devices)
    assert failures == 1, out.getvalue()
    st = rundir.read_status(runs / wide.run_id) or {}
    assert st.get("status") == FAILED and "train.devices = 4" in st.get("error", "")
    assert (rundir.read_status(runs / narrow.run_id) or {}).get("status") == COMPLETED
    assert dict(store.statuses(db, [wide.run_id, narrow.run_id])) == {wide.run_id: FAILED, narrow.run_id: COMPLETED}
    assert "2 GPU(s) (GPU 0, GPU 1)" in out.getvalue()


def test_a_cell_that_asks_for_the_cpu_takes_no_gpu(tmp_path, monkeypatch, no_spinning):
    """``train.device = "cpu"`` on a GPU machine: its processes are not GPUs, so a 4-process CPU cell on two
    GPUs is neither refused nor placed on one, and it leaves the GPUs to the cells that use them."""
    monkeypatch.setenv("ABL_ZYGOTE", "0")
    monkeypatch.setattr(subprocess, "Popen", _FakePopen)
    ex = LocalExecutor(gpus=[0, 1])
    cpu, gpu = _job(tmp_path, "cpu", 4, 0, device="cpu"), _job(tmp_path, "gpu", 1, 1)
    assert ex.never_fits(cpu.cell) is None and ex.never_fits(_job(tmp_path, "wide", 4, 2).cell)
    ex.slots = 2
    assert ex.can_launch(cpu)
    ex.launch(cpu)
    ex.running.append(cpu)
    assert cpu.gpus == [] and ex.placement.on == {0: {}, 1: {}}
    assert ex.can_launch(gpu)
    ex.launch(gpu)
    assert gpu.gpus == [0] and list(ex.placement.on[0]) == ["gpu"]
    ex.release(cpu)  # nothing of its own to free, and the GPU cell keeps its GPU
    assert list(ex.placement.on[0]) == ["gpu"]
