"""``abl dashboard``: serve the Streamlit app, or save a screenshot of every page."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from ..store.workspace import DEFAULT_DB, Workspace
from .common import fail, plugins_dir_option


@click.command("dashboard")
@click.option("--db", "db_path", default=DEFAULT_DB, show_default=True, help="DuckDB file to read.")
@click.option("--runs-dir", default=None,
              help="Run folders, read for the live metrics of running cells (default: runs/ beside the database).")
@click.option("--port", default=8501, show_default=True, type=click.IntRange(1, 65535))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; the default serves this machine only.")
@click.option("--snapshot", "snapshot_dir", default=None, type=click.Path(file_okay=False),
              help="Instead of serving: save a full-page PNG of every page into this folder and exit "
                   "(headless Chromium; a plain `chromium --screenshot` captures the page before it has drawn).")
@click.option("--width", "widths", multiple=True, type=click.IntRange(320, 4000),
              help="Window width in pixels for --snapshot (repeatable; default 1400).")
@plugins_dir_option
def command(db_path, runs_dir, port, host, snapshot_dir, widths):
    """Serve the Streamlit comparison dashboard (needs the 'dashboard' extra).

    It only reads the store, with short read-only connections, so it can stay
    open while abl run writes to the same database. With --snapshot it saves a
    screenshot of every page instead.
    """
    import importlib.util
    import subprocess

    if importlib.util.find_spec("streamlit") is None:
        fail("the dashboard needs Streamlit: pip install 'abl[dashboard]'")
    from ..store.database import StoreError, verify_store

    try:
        verify_store(db_path)  # a damaged store: one clear message, no server started
    except StoreError as exc:
        fail(str(exc))
    ws = Workspace.at(Path(db_path).resolve(), Path(runs_dir).resolve() if runs_dir else None)
    db = ws.db
    if snapshot_dir is not None:
        _dashboard_snapshot(db, ws.runs, Path(snapshot_dir), list(widths) or [1400])
        return
    if widths:
        fail("--width applies to --snapshot only")
    if not db.exists():
        click.echo(f"note: no database at {db} yet; the dashboard shows it once abl run creates it", err=True)
    import abl.dashboard

    app = Path(abl.dashboard.__file__).resolve().parent / "app.py"
    from ..pyexec import child_env, python

    env = child_env(dict(os.environ, ABL_DB=str(db), ABL_RUNS_DIR=str(ws.runs)))
    click.echo(f"abl dashboard: http://{host}:{port}  (store {db})", err=True)
    argv = [*python("-m", "streamlit"), "run", str(app), "--server.address", host,
            "--server.port", str(port), "--server.headless", "true",
            "--browser.gatherUsageStats", "false", "--global.developmentMode", "false",
            "--client.toolbarMode", "minimal"]
    if os.name == "posix":  # become the server, so signals (Ctrl-C, kill) reach it directly
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, argv, env)
    sys.exit(subprocess.call(argv, env=env))


def _dashboard_snapshot(db: Path, runs_dir: Path, out_dir: Path, widths: list[int]) -> None:
    """abl dashboard --snapshot: every page as a PNG, or exit 2 with why not."""
    import importlib.util

    if not db.is_file():
        fail(f"no database at {db}: nothing to take a snapshot of (pass --db)")
    if importlib.util.find_spec("playwright") is None:
        fail("--snapshot needs Playwright: pip install 'abl[snapshot]'")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".abl_write_test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        fail(f"cannot write into {out_dir}: {exc.strerror or exc}")
    from abl.dashboard import snapshot

    try:
        snapshot.chromium()
        shots = snapshot.snapshot(db, runs_dir, out_dir, widths, out_dir / "server.log")
    except snapshot.SnapshotError as exc:
        fail(f"{exc} (server log: {out_dir / 'server.log'})")
    except Exception as exc:  # noqa: BLE001 - a browser that cannot start or a page that never settles
        fail(f"the snapshot failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    broken = [s for s in shots if s.exceptions]
    if not broken:  # the server's log is kept only to explain a failure
        (out_dir / "server.log").unlink(missing_ok=True)
    for s in shots:
        click.echo(f"{s.path}  ({s.width} px wide, {s.content_height} px tall"
                   + (f", {s.exceptions} exception(s) shown" if s.exceptions else "") + ")")
    if broken:
        click.echo(f"{len(broken)} page(s) show an exception: " + ", ".join(sorted({s.page for s in broken})),
                   err=True)
        sys.exit(1)
