"""``abl ingest``: copy run folders into the database."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..store.workspace import DEFAULT_DB, Workspace
from .common import fail, note_new_store, plugins_dir_option, storage_fault, take_store_lock, user_errors


@click.command("ingest")
@click.argument("run_dirs", nargs=-1, type=click.Path(exists=True, file_okay=False))
@click.option("--db", "db_path", default=DEFAULT_DB, show_default=True)
@click.option("--runs-dir", default=None, help="Ingest every run folder in here (default: runs/ beside the database).")
@click.option("--wait", is_flag=True, help="If another abl run or ingest writes this database, queue behind it.")
@plugins_dir_option
def command(run_dirs, db_path, runs_dir, wait):
    """Copy run folders into the database (rebuilds it from the folders if needed).

    A run whose worker completed but whose folder is not whole (a cut or
    garbled metrics.jsonl, a missing last step) is stored as incomplete, with
    what is missing; ingesting it again after a repair restores it. A folder
    whose config.json does not hash to its name (edited after it ran, or
    copied under another name) is skipped and named; the store keeps its row.
    """
    from ..contracts.status import INCOMPLETE, QUEUED
    from ..run import preflight
    from ..store import database as store
    from ..store import rundir

    ws = Workspace.at(db_path, runs_dir)  # --db has a default: no rule to apply
    db = ws.db
    problems = preflight.db_problems(db) + (preflight.runs_dir_problems(ws.runs) if runs_dir else [])
    if problems:
        fail("\n".join(problems))
    note_new_store(db)
    lock = take_store_lock(db, wait)
    try:
        # listed only now that the lock is held: with --wait, the folders the holder wrote meanwhile count
        dirs = [Path(d) for d in run_dirs]
        if not dirs:
            dirs = sorted(p for p in ws.runs.glob("*") if _has_config(p))
        skipped: list[tuple[Path, str]] = []  # folders that cannot be ingested: named, the rest go on
        result = store.ingest_dirs(db, dirs, skipped)
    except user_errors() as exc:
        fail(str(exc))
    except OSError as exc:  # a full disk: the run folders keep the truth; ingest again later
        lock.release()
        storage_fault(exc, "free some space and run abl ingest again")
    finally:
        lock.release()
    counts: dict[str, int] = {}
    for state in result.values():
        counts[state] = counts.get(state, 0) + 1
    by_status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    click.echo(f"ingested {len(result)} run folder(s) into {db}" + (f" ({by_status})" if by_status else ""))
    for d, why in skipped:
        click.echo(f"skipped: {d}: {why}", err=True)
    for d in dirs:
        problem = rundir.scan_metrics(d / rundir.METRICS).problem if d.name in result else None
        if problem:
            click.echo(f"note: {d}: {problem}", err=True)
        if rundir.read_status(d) is None and result.get(d.name) == QUEUED:
            click.echo(f"queued: {d}: no readable status.json; its worker never started", err=True)
    damaged = [d for d in dirs if result.get(d.name) == INCOMPLETE]
    for d in damaged:
        steps = (rundir.read_json(d / rundir.CONFIG, {}).get("train") or {}).get("steps", 0)
        scan = rundir.scan_metrics(d / rundir.METRICS)
        why = "; ".join(rundir.check_complete(scan, steps)) if rundir.read_status(d) is not None else \
            store.no_status(d, scan)[1]
        click.echo(f"incomplete: {d}: {why}", err=True)
    if damaged or skipped:
        sys.exit(1)


def _has_config(folder: Path) -> bool:
    """Does ``folder`` look like a run folder (it holds a config.json)? True when it cannot be looked into."""
    from ..store import rundir

    try:
        return (folder / rundir.CONFIG).exists()
    except OSError:  # no permission to look in: ingest names it among the skipped
        return True
