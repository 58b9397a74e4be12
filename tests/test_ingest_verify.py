"""Ingest verifies (issue 39, finding 8): a run folder's config.json must hash to its folder's name.

The run id is the hash of the resolved config (abl.contracts.config.run_id_of). A folder whose
config was edited after it ran, or that was copied under another name, is refused: the store keeps
what it had, the other folders go on, and ``abl ingest`` names it and exits non-zero.
"""

import json

import duckdb
from click.testing import CliRunner

from abl.cli import cli
from abl.contracts.config import run_id_of
from abl.store import database as store
from abl.store import rundir

WHOLE = [{"step": 0, "n_params": 10}, {"step": 1, "train_loss": 3.1, "val_loss": 3.0},
         {"step": 1, "wall_s": 1.0, "peak_mem_bytes": 1e6}]


def folder(runs, config, name=None):
    """A completed one-step run folder as a worker leaves it: named by its config's run id."""
    d = runs / (name or run_id_of(config))
    d.mkdir(parents=True)
    rundir.write_json(d / rundir.CONFIG, config)
    rundir.write_json(d / rundir.META, {"label": "a"})
    (d / rundir.METRICS).write_text("".join(json.dumps(r) + "\n" for r in WHOLE))
    rundir.write_status(d, {"status": "completed"})
    return d


def runs_in(db):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {r[0]: (r[1], json.loads(r[2])) for r in con.execute("SELECT run_id, status, config FROM runs").fetchall()}
    finally:
        con.close()


def config(seed=0, width=64):
    return {"experiment": "e", "seed": seed, "model": {"d_model": width}, "train": {"steps": 1}}


def test_an_edited_config_is_refused_and_the_store_keeps_the_genuine_run(tmp_path):
    runs, db = tmp_path / "runs", tmp_path / "abl.duckdb"
    tampered, other = folder(runs, config(0)), folder(runs, config(1))
    assert store.ingest_dirs(db, [tampered, other]) == {tampered.name: "completed", other.name: "completed"}
    before = runs_in(db)
    rundir.write_json(tampered / rundir.CONFIG, config(0, width=1024))  # edited after it ran
    skipped: list = []
    assert store.ingest_dirs(db, [tampered, other], skipped) == {other.name: "completed"}
    (d, why), = skipped
    assert d == tampered
    assert why == (f"config.json does not hash to its folder's name (run id {tampered.name}, config hashes to "
                   f"{run_id_of(config(0, width=1024))}): edited after it ran, or copied under another name; not stored")
    assert runs_in(db) == before  # the genuine row stays, with its own config


def test_a_folder_copied_under_another_name_is_refused(tmp_path):
    runs, db = tmp_path / "runs", tmp_path / "abl.duckdb"
    copied = folder(runs, config(0), name="0123456789abcdef")
    skipped: list = []
    assert store.ingest_dirs(db, [copied], skipped) == {}
    assert skipped and "config.json does not hash to its folder's name" in skipped[0][1]
    assert runs_in(db) == {}


def test_abl_ingest_names_the_tampered_folder_and_exits_non_zero(tmp_path):
    runs, db = tmp_path / "runs", tmp_path / "abl.duckdb"
    good = folder(runs, config(0))
    bad = folder(runs, config(1))
    rundir.write_json(bad / rundir.CONFIG, config(1, width=7))
    r = CliRunner().invoke(cli, ["ingest", "--db", str(db), "--runs-dir", str(runs)])
    assert r.exit_code == 1, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert f"skipped: {bad}: config.json does not hash to its folder's name" in r.output
    assert set(runs_in(db)) == {good.name}


def test_a_genuine_cell_folder_hashes_to_its_name(tmp_path, tiny_cell):
    """The runner's own ingest of a finished cell: the worker's folder is named by the cell's run id and
    holds its config as JSON, which hashes back to that id."""
    for index in (0, 1):
        cell = tiny_cell(index)
        d = rundir.prepare(tmp_path / "runs" / cell.run_id, cell.config, {"label": cell.label})
        assert run_id_of(rundir.read_json(d / rundir.CONFIG)) == cell.run_id
        (d / rundir.METRICS).write_text("")
        rundir.write_status(d, {"status": "failed", "error": "x"})
        con = store.open_store(tmp_path / "abl.duckdb")
        try:
            assert store.ingest_run(con, d) == "failed"
        finally:
            con.close()


def test_every_shipped_cell_hashes_back_to_its_run_id_from_its_folder():
    """Every cell of every shipped grid: config.json as the runner writes it hashes to the folder's name,
    so the runner's own ingest of a finished cell is never refused."""
    from pathlib import Path

    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid

    registry = get_registry()
    for grid in sorted((Path(__file__).resolve().parent.parent / "ablations").glob("*.toml")):
        for cell in load_grid(grid, registry).cells:
            assert run_id_of(json.loads(json.dumps(cell.config))) == cell.run_id, (grid.name, cell.label)
