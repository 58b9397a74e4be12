import contextlib
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# machine-wide caches (abl.store.cpupeak's measured peaks) go to a folder of this test session:
# a test never reads figures a developer's earlier runs left behind
if "ABL_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["ABL_CACHE_DIR"] = tempfile.mkdtemp(prefix="abl-test-cache-")


@pytest.fixture(scope="session")
def registry():
    from abl.contracts.plugin_manager import get_registry

    return get_registry()


@pytest.fixture
def tiny_model_config():
    from abl.contracts.config import ModelConfig

    return ModelConfig(d_model=32, n_layers=2, n_heads=4, context=16, vocab_size=64)


def run_abl(args, cwd=None, env=None, timeout=600):
    """Run the real CLI in a subprocess (what a user types)."""
    import subprocess

    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "abl.cli", *args], cwd=cwd or ROOT,
                          capture_output=True, text=True, env=full_env, timeout=timeout)


# ---------------------------------------------------------------- shared fixtures: a tiny grid, a sink, a cell

# The smallest grid that trains on CPU in about a second per cell: one layer, two cells (the norm axis),
# no decode or extrapolation evaluation, a small slice of the Python standard library as corpus.
TINY_GRID: dict = {
    "experiment": {"name": "tiny", "seeds": [0]},
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 4, "context": 16},
    "train": {"steps": 2, "batch_size": 2, "eval_every": 2, "eval_batches": 1, "threads": 1},
    "eval": {"decode": False, "extrapolation": False},
    "dataset": {"pystdlib": {"max_bytes": 300000}},
    "grid": {"model.norm": ["rmsnorm", "layernorm"]},
}


def tiny_grid_raw(**sections) -> dict:
    """``TINY_GRID`` with sections replaced: ``section={...}`` replaces that section's keys one by one
    (a key set to None is left out), ``section=None`` leaves the whole section out; ``grid`` and
    ``dataset`` are replaced whole (their keys are the axes and the corpus, not settings)."""
    import copy

    raw = copy.deepcopy(TINY_GRID)
    for name, keys in sections.items():
        if keys is None:
            raw.pop(name, None)
            continue
        merged = dict(keys) if name in ("grid", "dataset") else {**raw.get(name, {}), **keys}
        raw[name] = {k: v for k, v in merged.items() if v is not None}
    return raw


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML for {v!r}")


def _toml_key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else _toml_value(k)


def toml_text(raw: dict) -> str:
    """A grid's dict as TOML text (tables of scalars, lists and inline tables; one level of sub-tables)."""
    lines: list[str] = []
    for name, section in raw.items():
        subs = {k: v for k, v in section.items() if isinstance(v, dict) and name != "grid"}
        lines.append(f"[{name}]")
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in section.items() if k not in subs]
        for sub, keys in subs.items():
            lines.append(f"[{name}.{_toml_key(sub)}]")
            lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in keys.items()]
    return "\n".join(lines) + "\n"


def tiny_grid_text(**sections) -> str:
    """The tiny grid as TOML text, sections replaced as ``tiny_grid_raw`` does."""
    return toml_text(tiny_grid_raw(**sections))


@pytest.fixture
def norm_grid_jobs(registry, tmp_path):
    """Jobs of a three-cell grid (model.norm over rmsnorm, layernorm, none; 100 steps, no evaluations), each
    with its run folder under tmp_path (not created): what the ETA and thread tests hand an executor."""
    from abl.grid.gridfile import expand
    from abl.grid.parsing import parse_toml_text
    from abl.run.executors import Job

    grid = tiny_grid_text(experiment={"name": "eta"}, model={"n_layers": 2, "context": 32},
                          train={"steps": 100, "batch_size": 4, "eval_every": None, "eval_batches": None,
                                 "threads": None},
                          eval=None, dataset=None, grid={"model.norm": ["rmsnorm", "layernorm", "none"]})
    cells = expand(parse_toml_text(grid, "g"), registry).cells
    return [Job(cell=c, run_dir=tmp_path / c.run_id, index=i) for i, c in enumerate(cells)]


@pytest.fixture
def tiny_grid(tmp_path):
    """Write the tiny grid (sections replaced as ``tiny_grid_raw`` does) to a file; returns its path."""
    def write(name: str = "g.toml", **sections) -> Path:
        path = tmp_path / name
        path.write_text(tiny_grid_text(**sections))
        return path

    return write


class ListSink:
    """A metric sink that keeps every logged row: what the training loop writes, for a test to read."""

    def __init__(self):
        self.rows: list = []

    def log(self, step, metrics):
        self.rows.append((step, dict(metrics)))

    def series(self, name):
        """(step, value) of every row that logged ``name``."""
        return [(s, m[name]) for s, m in self.rows if name in m]


@pytest.fixture
def metric_sink():
    return ListSink()


@pytest.fixture
def tiny_cell(registry):
    """A cell of the tiny grid built from a dict, no TOML (sections replaced as ``tiny_grid_raw`` does;
    ``index`` picks the cell)."""
    from abl.grid.gridfile import expand

    def make(index: int = 0, **sections):
        return expand(tiny_grid_raw(**sections), registry, source="tiny.toml").cells[index]

    return make


def write_completed_runs(cells, runs_dir, grid_file: str, value_of, extra=lambda cell: {}) -> None:
    """Run folders of completed runs for ``cells`` without training: config, meta (with the grid record),
    status, and whole metrics (every step's train loss, then ``val_loss`` = ``value_of(cell)`` and
    ``extra(cell)`` at the last step), as a worker leaves them; ``abl.store.database.ingest_dirs`` takes them."""
    import json
    import time

    now = time.time()
    for i, cell in enumerate(cells):
        d = Path(runs_dir) / cell.run_id
        d.mkdir(parents=True, exist_ok=True)
        final = value_of(cell)
        (d / "config.json").write_text(json.dumps(cell.config))
        (d / "meta.json").write_text(json.dumps({"cell_key": cell.cell_key, "label": cell.label,
                                                 "git_commit": "abc123", "grid_file": grid_file,
                                                 "grid": cell.grid_record(grid_file)}))
        (d / "info.json").write_text(json.dumps({"device": "cpu (test)", "data_fingerprint": "f" * 64}))
        (d / "status.json").write_text(json.dumps({"status": "completed", "started": now + i,
                                                   "finished": now + i + 1}))
        lines = [{"step": 0, "n_params": 1000.0}]
        lines += [{"step": s, "train_loss": final + 1.0 / s} for s in range(1, cell.train.steps + 1)]
        lines += [{"step": cell.train.steps, "val_loss": final, "wall_s": 1.0, "peak_mem_bytes": 1e6,
                   **extra(cell)}]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def completed_store(grid_path, registry, value_of, extra=lambda cell: {}, results=None):
    """The grid file at ``grid_path`` loaded, its cells written as completed runs without training
    (``write_completed_runs``: ``val_loss`` = ``value_of(cell)``, ``extra(cell)`` beside it) under
    ``results``/runs (default: a results folder beside the grid file) and ingested into ``results``/abl.duckdb.
    Returns (the grid, the store's path)."""
    from abl.grid.gridfile import load_grid
    from abl.store import database as store

    grid = load_grid(grid_path, registry)
    results = Path(results) if results is not None else Path(grid_path).parent / "results"
    write_completed_runs(grid.cells, results / "runs", str(grid_path), value_of, extra=extra)
    db = results / "abl.duckdb"
    store.ingest_dirs(db, sorted((results / "runs").iterdir()))
    return grid, db


# ---------------------------------------------------------------- shared fixtures: plugins folders, stored runs

# a norm without cost=: Dynamic Tanh (Zhu et al. 2025, arXiv:2503.10622, eq. 1) without its shift
NO_COST_NORM_PLUGIN = '''
import torch
import torch.nn as nn

from abl import Param, hookimpl


class DyT(nn.Module):
    def __init__(self, dim, alpha_init=0.5):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(alpha_init))
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return torch.tanh(self.alpha * x) * self.weight


@hookimpl
def register_components(register):
    register("norm", "dyt_nocost", DyT, params={"alpha_init": Param(0.5, min=0.0)})
'''


def write_plugins(folder, files: dict) -> Path:
    """A plugins folder (``abl --plugins-dir``) made at ``folder`` holding ``files`` (file name -> text)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


@pytest.fixture
def no_cost_plugin_dir(tmp_path):
    """A plugins folder with one norm, ``dyt_nocost``, that declares no cost function."""
    return write_plugins(tmp_path / "plug", {"dyt_nocost.py": NO_COST_NORM_PLUGIN})


def stored_run(cell_key: str, seed: int, final: dict, config: dict | None = None, **fields):
    """A completed abl.store.reader.StoredRun of cell ``cell_key`` without a store: run id ``<cell_key><seed>``,
    experiment "e", labelled by its cell key; ``fields`` set any other field (label, data_fingerprint, ...)."""
    from abl.contracts.status import COMPLETED
    from abl.store.reader import StoredRun

    values = {"run_id": f"{cell_key}{seed}", "experiment": "e", "label": cell_key, "status": COMPLETED,
              "config": config or {}, "data_fingerprint": "f", **fields}
    return StoredRun(cell_key=cell_key, seed=seed, final=final, **values)


def default_signals():
    """In the child, before exec: SIGINT and SIGTERM back to their defaults. A test suite started in the
    background (``nohup pytest &``) inherits SIGINT ignored, and Python then never turns SIGINT into
    KeyboardInterrupt; the signal tests must not depend on how the suite was started (issue 27)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def stopping(proc):
    """``with stopping(proc) as stop:``: ``stop(sig)`` sends a started process a signal and waits for it to end
    (its stdout and stderr); on leaving the block (a failed assertion too) a process still running is killed."""
    def stop(sig, timeout=60):
        proc.send_signal(sig)
        return proc.communicate(timeout=timeout)

    try:
        yield stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------- the dashboard (streamlit's AppTest)


def dashboard_app(db: Path, monkeypatch, page: str, timeout: float = 90, **state):
    """The dashboard (dashboard/app.py) on the store ``db``, run once on ``page`` with ``state`` in its session
    state; it raised nothing and showed no error."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("ABL_DB", str(db))
    monkeypatch.setenv("ABL_RUNS_DIR", str(db.parent / "runs"))
    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=timeout)
    for k, v in state.items():
        at.session_state[k] = v
    at.switch_page(f"views/{page}.py")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def chart_specs(at) -> list[dict]:
    """The Vega-Lite specs of the charts an AppTest drew, each with its datasets as DataFrames under ``_data``."""
    import json

    from streamlit import dataframe_util

    out = []
    for el in at.get("vega_lite_chart"):
        spec = json.loads(el.proto.spec)
        spec["_data"] = {d.name: dataframe_util.convert_arrow_bytes_to_pandas_df(d.data.data)
                         for d in el.proto.datasets}
        out.append(spec)
    return out
