"""abl.store.workspace: the rule that picks a command's store, applied once, and the folders derived from it."""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from abl.store import rundir
from abl.store.workspace import DEFAULT_DB, Workspace

ROOT = Path(__file__).resolve().parent.parent


def _grid(db: str) -> SimpleNamespace:
    return SimpleNamespace(cells=[SimpleNamespace(experiment=SimpleNamespace(db=db))])


def test_the_db_option_wins_then_the_grid_then_the_default():
    assert Workspace.resolve("x/a.duckdb", _grid("y/b.duckdb")).db == Path("x/a.duckdb")
    assert Workspace.resolve(None, _grid("y/b.duckdb")).db == Path("y/b.duckdb")
    assert Workspace.resolve("", _grid("")).db == Path(DEFAULT_DB)
    assert Workspace.resolve(None).db == Path(DEFAULT_DB)
    assert Workspace.resolve(None, SimpleNamespace(cells=[])).db == Path(DEFAULT_DB)


def test_every_folder_sits_beside_the_database_and_runs_dir_moves_only_the_run_folders():
    ws = Workspace.resolve("s/abl.duckdb")
    assert (ws.runs, ws.tokens, ws.shapes, ws.reports, ws.selftest) == (
        Path("s/runs"), Path("s/tokens"), Path("s/shapes"), Path("s/reports"), Path("s/selftest"))
    moved = Workspace.resolve("s/abl.duckdb", runs_option="elsewhere")
    assert moved.runs == Path("elsewhere")
    assert (moved.tokens, moved.shapes, moved.reports) == (ws.tokens, ws.shapes, ws.reports)


def test_a_worker_finds_its_workspace_through_its_run_folder(tmp_path):
    ws = Workspace.at(tmp_path / "store" / "abl.duckdb", tmp_path / "folders")
    run_dir = ws.runs / "r1"
    rundir.prepare(run_dir, {"x": 1}, {"label": "a", **ws.record(run_dir)})
    meta = rundir.read_json(run_dir / rundir.META, {})
    assert not Path(meta["store"]).is_absolute()  # no machine path travels in meta.json
    found = Workspace.of_run_dir(run_dir)
    assert found is not None
    assert found.db == ws.db.resolve() and found.shapes == ws.shapes.resolve()
    assert found.runs == ws.runs.resolve()


def test_a_store_moved_whole_keeps_its_workers_finding_it(tmp_path):
    ws = Workspace.at(tmp_path / "a" / "abl.duckdb")
    run_dir = ws.runs / "r1"
    rundir.prepare(run_dir, {"x": 1}, ws.record(run_dir))
    (tmp_path / "a").rename(tmp_path / "b")
    found = Workspace.of_run_dir(tmp_path / "b" / "runs" / "r1")
    assert found is not None and found.shapes == (tmp_path / "b" / "shapes").resolve()


def test_an_old_run_folder_keeps_its_absolute_shape_cache_and_a_bare_one_has_none(tmp_path):
    old = tmp_path / "runs" / "r1"
    rundir.prepare(old, {"x": 1}, {"shape_cache": str(tmp_path / "elsewhere" / "shapes")})
    found = Workspace.of_run_dir(old)
    assert found is not None and found.shapes == tmp_path / "elsewhere" / "shapes"
    bare = tmp_path / "runs" / "r2"
    rundir.prepare(bare, {"x": 1}, {"label": "a"})
    assert Workspace.of_run_dir(bare) is None
    (bare / rundir.META).write_text("[1, 2")  # damaged: read as no record, never a traceback
    assert Workspace.of_run_dir(bare) is None
    assert Workspace.of_run_dir(tmp_path / "runs" / "missing") is None
    assert Workspace.of_run_dir(bare, meta=["not", "a", "dict"]) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("pattern, what", [
    (r"^\s*DEFAULT_DB\s*=", "DEFAULT_DB is defined"),
    (r"""/\s*["']runs["']""", "a store's runs folder is joined by hand"),
    (r"""\.parent\s*/\s*(SHAPES_DIR|rundir\.SHAPES_DIR|TOKENS_DIR|tokenstore\.TOKENS_DIR|["'](reports|selftest)["'])""",
     "a store's folder is derived by hand"),
    (r"experiment\.db\s+or\b|\.db\s+or\s+DEFAULT_DB|db_path\s+or\s+DEFAULT_DB", "the store rule is written out"),
])
def test_only_the_workspace_derives_a_stores_folders(pattern, what):
    offenders = []
    for path in [*(ROOT / "harness").rglob("*.py"), *(ROOT / "dashboard").rglob("*.py")]:
        if path.name == "workspace.py" and path.parent.name == "store":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(pattern, line.split("#")[0]):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, f"{what} outside abl.store.workspace:\n" + "\n".join(offenders)


def test_the_token_folder_is_the_token_stores_and_the_workspace_stays_light():
    import subprocess
    import sys

    from abl.data import tokenstore
    from abl.store import workspace

    assert workspace.TOKENS_DIR == tokenstore.TOKENS_DIR
    code = "import sys, abl.store.workspace; print('numpy' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
