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
from conftest import ROOT, tiny_grid_text

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
    from abl.train.checkpoint import CheckpointRefused, checkpoint_step, read_checkpoint

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

    from abl.train.checkpoint import CheckpointRefused, checkpoint_step, read_checkpoint

    ckpt = tmp_path / "checkpoint.pt"
    torch.save({"step": 3, "model": {}, "numpy_rng": np.random.get_state(), "python_rng": random.getstate()}, ckpt)
    assert checkpoint_step(ckpt) is None
    with pytest.raises(CheckpointRefused, match="format|plain data"):
        read_checkpoint(ckpt)


def test_a_fifo_checkpoint_is_refused_without_blocking(tmp_path):
    from abl.train.checkpoint import checkpoint_step

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
    from abl.train.checkpoint import load_checkpoint, save_checkpoint

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

RUN_GRID = tiny_grid_text(experiment={"name": "shadow"}, model={"n_layers": 2, "context": 32},
                          train={"batch_size": 4, "threads": None}, grid=None)


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


# ---------------------------------------------------------------- names that become paths


def escaping_names(tmp_path):
    return {"climbs": "../../escaped", "absolute": str(tmp_path / "elsewhere" / "escaped"), "long": "x" * 300}


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("case", ["climbs", "absolute", "long"])
@pytest.mark.parametrize("command", ["run", "report"])
def test_an_experiment_name_that_would_leave_its_folder_is_refused(tmp_path, case, command):
    """experiment.name becomes reports/<name>/ beside the store: a name that climbs out, an absolute one or
    one longer than a file name may be is refused (exit 2) before anything is read or written."""
    work = tmp_path / "a" / "b" / "work"
    work.mkdir(parents=True)
    name = escaping_names(tmp_path)[case]
    (work / "grid.toml").write_text(RUN_GRID.replace('name = "shadow"', f"name = {json.dumps(name)}"))
    before = tree(tmp_path)
    args = ["run", "grid.toml"] if command == "run" else ["report", "grid.toml"]
    r = subprocess.run([abl_script(), *args, "--db", "store/abl.duckdb"], cwd=work, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "experiment.name" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert tree(tmp_path) == before


def store_with_experiment(db: Path, name: str) -> None:
    """A store holding one completed run of experiment ``name`` (as if a grid of that name had run)."""
    from abl.store.database import open_store

    con = open_store(db)
    try:
        con.execute("INSERT INTO runs (run_id, experiment, cell_key, label, seed, status, config) "
                    "VALUES ('r0', ?, 'k', 'base', 0, 'completed', ?)",
                    [name, json.dumps({"experiment": {"name": name}, "seed": 0})])
        con.execute("INSERT INTO metrics VALUES ('r0', 1, 'train_loss', 3.0), ('r0', 1, 'val_loss', 3.1)")
    finally:
        con.close()


@pytest.mark.parametrize("name", ["..", "x" * 300])
def test_abl_report_of_a_stored_experiment_keeps_its_report_inside_reports(tmp_path, name):
    """The experiment name typed on the command line (a store may hold any name) is confined the same way."""
    store = tmp_path / "store" / "abl.duckdb"
    store.parent.mkdir()
    store_with_experiment(store, name)
    before = tree(tmp_path)
    r = subprocess.run([abl_script(), "report", name, "--db", "store/abl.duckdb"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "experiment name" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert tree(tmp_path) == before


@pytest.mark.parametrize("args", [["report", "tiny", "--out", "y" * 300], ["run", "grid.toml", "--db", "z" * 300],
                                  ["run", "grid.toml", "--runs-dir", "r" * 300], ["ingest", "--db", "z" * 300]])
def test_an_over_long_path_on_the_command_line_is_a_clear_error(tmp_path, args):
    (tmp_path / "grid.toml").write_text(RUN_GRID)
    store = tmp_path / "store" / "abl.duckdb"
    store.parent.mkdir()
    store_with_experiment(store, "tiny")
    args = args if "--db" in args else [*args, "--db", "store/abl.duckdb"]
    before = tree(tmp_path)
    r = subprocess.run([abl_script(), *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "more than a file name may be" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert tree(tmp_path) == before


# ---------------------------------------------------------------- reading run folders


def run_folders(tmp_path, registry, n=3) -> list[Path]:
    """``n`` run folders of completed-looking runs (a config, a status, a few metric rows)."""
    from abl.grid.gridfile import expand
    from abl.store import rundir

    raw = json.loads(json.dumps(TINY))
    raw["experiment"]["seeds"] = list(range(n))
    out = []
    for cell in expand(raw, registry).cells:
        d = rundir.prepare(tmp_path / "runs" / cell.run_id, cell.config, {"attempts": 1})
        rundir.write_status(d, {"status": "killed", "error": "stopped"})
        (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "train_loss": 3.0}) + "\n")
        out.append(d)
    return out


def ingest(tmp_path, *extra):
    return subprocess.run([abl_script(), "ingest", "--db", "store/abl.duckdb", *extra], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def stored(tmp_path) -> dict[str, str]:
    import duckdb

    con = duckdb.connect(str(tmp_path / "store" / "abl.duckdb"), read_only=True)
    try:
        return dict(con.execute("SELECT run_id, status FROM runs").fetchall())
    finally:
        con.close()


@pytest.mark.parametrize("damage_kind", ["status-not-utf8", "status-folder", "status-fifo", "config-not-utf8",
                                         "config-folder", "config-fifo", "metrics-fifo", "metrics-folder",
                                         "meta-fifo", "info-not-utf8"])
def test_ingest_reads_every_damaged_run_folder_file_with_a_message_and_goes_on(tmp_path, registry, damage_kind):
    bad, *good = run_folders(tmp_path, registry)
    which, how = damage_kind.split("-", 1)
    target = bad / {"status": "status.json", "config": "config.json", "metrics": "metrics.jsonl",
                    "meta": "meta.json", "info": "info.json"}[which]
    target.unlink(missing_ok=True)
    if how == "not-utf8":
        target.write_bytes(b'{"status": "\xff\xfe\xc3(", "x": 1}')
    elif how == "folder":
        target.mkdir()
    else:
        os.mkfifo(target)
    r = ingest(tmp_path, "--runs-dir", "runs")
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode in (0, 1), r.stdout + r.stderr
    runs = stored(tmp_path)
    assert all(runs.get(d.name) == "killed" for d in good), runs  # the rest of the work went on
    if which == "config":
        assert bad.name not in runs and f"skipped: runs/{bad.name}: no readable config.json" in r.stderr
        assert r.returncode == 1
    elif which == "status":
        assert runs[bad.name] == "incomplete" and "status" in r.stderr, r.stderr
    elif which == "metrics":
        assert "metrics.jsonl cannot be read" in r.stderr, r.stderr
    else:
        assert runs[bad.name] == "killed"


@pytest.mark.parametrize("command", ["run", "ingest"])
def test_runs_dir_naming_a_regular_file_is_a_clear_error(tmp_path, command):
    (tmp_path / "grid.toml").write_text(RUN_GRID)
    (tmp_path / "runs.txt").write_text("not a folder\n")
    args = ["run", "grid.toml"] if command == "run" else ["ingest"]
    before = tree(tmp_path)
    r = subprocess.run([abl_script(), *args, "--db", "store/abl.duckdb", "--runs-dir", "runs.txt"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "--runs-dir runs.txt: is a file, not a folder" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert tree(tmp_path) == before
