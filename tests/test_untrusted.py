"""Untrusted files are data, never code (issue 39): checkpoints, run folders, stores, names, the import path.

abl trusts the plugins the user loads and the grid files as configuration; it never executes
what a run folder, a store, a checkpoint or a cache holds (docs/robustness.md).
"""

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

TINY = {"experiment": {"name": "tiny", "seeds": [0]},
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "context": 32},
        "train": {"steps": 4, "batch_size": 4, "eval_every": 4, "eval_batches": 1, "checkpoint_every": 2},
        "eval": {"decode": False, "extrapolation": False},
        "dataset": {"pystdlib": {"max_bytes": 300000}}}


class Payload:
    """What an attacker puts in a checkpoint: unpickling it writes a marker file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def crafted(path: Path, marker: Path, how: str) -> None:
    import torch

    if how == "torch.save":
        torch.save({"step": 2, "model": Payload(marker)}, path)
    else:  # a bare pickle: torch's legacy loader unpickles it to look for its magic number
        path.write_bytes(pickle.dumps(Payload(marker)))


# ---------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("how", ["torch.save", "pickle"])
def test_a_crafted_checkpoint_is_refused_not_executed(tmp_path, how):
    from abl.run.checkpoint import CheckpointRefused, checkpoint_step, read_checkpoint

    marker, ckpt = tmp_path / "marker", tmp_path / "checkpoint.pt"
    crafted(ckpt, marker, how)
    assert checkpoint_step(ckpt) is None
    with pytest.raises(CheckpointRefused):
        read_checkpoint(ckpt)
    assert not marker.exists()


def test_a_checkpoint_of_the_old_format_is_refused(tmp_path):
    """The old format kept numpy's state as an array, which needs code to rebuild: refused, the cell starts over."""
    import random

    import numpy as np
    import torch

    from abl.run.checkpoint import CheckpointRefused, checkpoint_step, read_checkpoint

    ckpt = tmp_path / "checkpoint.pt"
    torch.save({"step": 3, "model": {}, "numpy_rng": np.random.get_state(), "python_rng": random.getstate()}, ckpt)
    assert checkpoint_step(ckpt) is None
    with pytest.raises(CheckpointRefused, match="format|plain data"):
        read_checkpoint(ckpt)


def test_a_fifo_checkpoint_is_refused_without_blocking(tmp_path):
    from abl.run.checkpoint import checkpoint_step

    ckpt = tmp_path / "checkpoint.pt"
    os.mkfifo(ckpt)
    assert checkpoint_step(ckpt) is None


def test_a_worker_resuming_from_a_crafted_checkpoint_runs_the_cell_from_the_start(tmp_path, registry):
    from abl.grid.gridfile import expand
    from abl.store import rundir

    cell = expand(json.loads(json.dumps(TINY)), registry).cells[0]
    d = tmp_path / "run"
    rundir.prepare(d, cell.config, {"attempts": 2})
    marker = tmp_path / "marker"
    crafted(d / "checkpoint.pt", marker, "torch.save")
    with open(d / "worker.log", "ab") as log:
        rc = subprocess.run([sys.executable, "-m", "abl.run.worker", str(d)], cwd=ROOT, stdout=log, stderr=log,
                            timeout=600).returncode
    log_text = (d / "worker.log").read_text()
    assert not marker.exists(), log_text
    assert rc == 0, log_text
    status = json.loads((d / "status.json").read_text())
    assert status["status"] == "completed" and "resumed_from_step" not in status
    assert "checkpoint.pt holds more than plain data" in log_text
    steps = [json.loads(x)["step"] for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert 1 in steps and max(steps) == 4


def test_the_safe_checkpoint_restores_every_rng_exactly(tmp_path):
    """The RNG states are plain data now; restoring them gives the same draws bit for bit."""
    import random

    import numpy as np
    import torch

    from abl.contracts.precision import Precision
    from abl.run.checkpoint import load_checkpoint, save_checkpoint

    class Batches:
        gen = torch.Generator().manual_seed(5)

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    random.seed(1), np.random.seed(2), torch.manual_seed(3), np.random.standard_normal()  # a cached gaussian
    random.gauss(0, 1)
    ckpt = tmp_path / "checkpoint.pt"
    save_checkpoint(ckpt, 7, model, opt, Precision(), [Batches.gen.get_state()])
    draws = lambda: (random.random(), random.gauss(0, 1), np.random.standard_normal(3).tolist(),  # noqa: E731
                     torch.rand(3).tolist(), torch.rand(2, generator=Batches.gen).tolist())
    first = draws()
    assert load_checkpoint(ckpt, model, opt, Precision(), Batches) == 7
    assert draws() == first


# ---------------------------------------------------------------- the import path

RUN_GRID = """
[experiment]
name = "shadow"
seeds = [0]
[model]
d_model = 32
n_layers = 2
n_heads = 4
context = 32
[train]
steps = 2
batch_size = 4
eval_every = 2
eval_batches = 1
[eval]
decode = false
extrapolation = false
[dataset.pystdlib]
max_bytes = 300000
"""


def abl_script() -> str:
    """The installed ``abl`` command (its own folder first on the import path, not the working directory)."""
    return str(Path(sys.executable).parent / "abl")


def test_abl_run_from_a_folder_holding_an_abl_folder_trains_normally(tmp_path):
    """A plain ``abl/`` folder in the working directory (the parent of a clone named abl) must not shadow
    the installed package in the workers: they start with ``python -P``."""
    (tmp_path / "abl").mkdir()
    (tmp_path / "abl" / "__init__.py").write_text("raise ImportError('the wrong abl: a folder in the working directory')\n")
    (tmp_path / "grid.toml").write_text(RUN_GRID)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    r = subprocess.run([abl_script(), "run", "grid.toml", "--db", "store/abl.duckdb"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    status = json.loads(next((tmp_path / "store" / "runs").glob("*/status.json")).read_text())
    assert status["status"] == "completed", status


# ---------------------------------------------------------------- damaged stores

BLOCK = 262144  # DuckDB's block size; block b starts after the 3 x 4096-byte headers


def real_store(path: Path) -> None:
    """A store with abl's schema and enough metric rows to span several blocks."""
    from abl.store.database import open_store

    con = open_store(path)
    try:
        con.execute("INSERT INTO runs (run_id, experiment, status, seed) "
                    "SELECT 'r' || i, 'tiny', 'completed', i FROM range(20) t(i)")
        con.execute("INSERT INTO metrics SELECT 'r' || (i % 20), i, 'train_loss', random() FROM range(300000) t(i)")
    finally:
        con.close()


def damage(path: Path, how: str) -> None:
    import duckdb

    if how == "truncated":
        os.truncate(path, path.stat().st_size // 2)
        return
    con = duckdb.connect(str(path), read_only=True)
    try:  # the first block the metrics table's values fill from its start
        block = con.execute("SELECT min(block_id) FROM pragma_storage_info('metrics') "
                            "WHERE column_name = 'value' AND block_id >= 0 AND block_offset = 0").fetchone()[0]
    finally:
        con.close()
    with open(path, "r+b") as f:  # a few bytes inside it, past its checksum
        f.seek(3 * 4096 + block * BLOCK + 4096)
        f.write(b"\xab" * 256)


COMMANDS = {
    "run": ["run", "grid.toml", "--db", "store/abl.duckdb"],
    "ingest": ["ingest", "--db", "store/abl.duckdb"],
    "report": ["report", "tiny", "--db", "store/abl.duckdb"],
    "compare": ["compare", "tiny", "--db", "store/abl.duckdb"],
    "dashboard": ["dashboard", "--db", "store/abl.duckdb", "--port", "1"],
}


@pytest.mark.parametrize("how", ["block", "truncated"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_damaged_store_is_refused_before_any_work(tmp_path, how, command):
    store = tmp_path / "store" / "abl.duckdb"
    store.parent.mkdir()
    real_store(store)
    damage(store, how)
    before = store.read_bytes()
    (tmp_path / "grid.toml").write_text(RUN_GRID)
    r = subprocess.run([abl_script(), *COMMANDS[command]], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr
    assert "store/abl.duckdb is damaged" in r.stderr and "abl ingest" in r.stderr and "--db" in r.stderr, r.stderr
    assert sorted(p.name for p in store.parent.iterdir()) == ["abl.duckdb"]  # no runs/, no lock, no reports/
    assert store.read_bytes() == before
