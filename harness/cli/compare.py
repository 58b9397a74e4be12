"""``abl compare``: compare the stored runs of an experiment or grid, nothing trained (options: abl.cli)."""

from __future__ import annotations

from .common import DEFAULT_DB, fail, load_registry, user_errors


def compare(source, db_path, metrics, baseline, pairs, by, bootstrap, correction, detect, as_json, fmt, wide,
            overrides):
    """The body of ``abl compare``: its options and help are declared in abl.cli."""
    from ..analysis.verdicts import VerdictError
    from ..present.report import ReportError
    from ..present.summary import run_compare

    if as_json and fmt not in ("table", "json"):
        fail(f"give --json or --format {fmt}, not both (--json is --format json)")
    try:
        run_compare(source, db_path=db_path, default_db=DEFAULT_DB, registry=load_registry, metrics=metrics,
                    baseline=baseline, pairs=pairs, by=by, bootstrap=bootstrap, correction=correction,
                    detect=detect, as_json=as_json, overrides=overrides, fmt=fmt,
                    layout="wide" if wide else "auto", compared=_phase2)
    except user_errors() + (ReportError, VerdictError) as exc:
        fail(str(exc))


def _phase2(grid, db):
    """An lr-sweep grid file compares its phase 2 as the store's tuning runs choose it (abl.run.lr_sweep)."""
    from ..run.lr_sweep import compared_grid

    return compared_grid(grid, load_registry(), db)
