"""Every query the dashboard runs: named functions of abl.store, importable from here, the module the pages use.

The SQL lives in store/ (issue 38: no SQL outside it): the connection rules
(one writer, read-only readers that never hold the lock for long, running
cells' rows read from their run folders) in abl.store.readonly, which runs a
page looks at (``Selection``) in abl.store.selection, the frames the pages draw
in abl.store.queries and abl.store.benchqueries, and stored runs as records
(the verdicts, the Costs page) from the one reader, abl.store.reader.

A metric's label, unit, better direction, whether it is a speed, and which
aggregate of its rows is a run's final value come from the metric catalogue
(abl.analysis.metrics): ``metric_info`` and ``is_speed`` are its entries.

Nothing here imports Streamlit; the app caches these functions.
"""

from __future__ import annotations

from typing import Sequence

from abl.analysis import oneanswer
from abl.analysis.oneanswer import Answer
from abl.analysis.health import HEALTH_METRICS
from abl.analysis.metrics import Metric, is_speed  # noqa: F401 - the pages read the catalogue through here
from abl.analysis.metrics import metric as metric_info  # noqa: F401
from abl.analysis.stats.corrections import HOLM
from abl.analysis.stats.engine import Analysis, CellInput
from abl.analysis.verdicts import analyse_runs
from abl.store import reader
from abl.store.benchqueries import (  # noqa: F401 - the pages use them as queries.*
    BENCH_OPTIONAL,
    BENCH_REQUIRED,
    IDENT_RE,
    bench_columns,
    bench_facets,
    bench_rows,
    bench_sessions,
)
from abl.store.database import StoreError
from abl.store.queries import (  # noqa: F401
    cell_config,
    cell_configs,
    cell_values,
    config_axes,
    curves,
    experiments,
    final_sql,
    finals,
    grid_paths,
    grid_rows,
    is_curve,
    metric_catalogue,
    metric_names,
    run_metric_summary,
    run_metrics,
    run_row,
    runs,
    selected_run_ids,
    sort_values,
    status_values,
)
from abl.store.readonly import (  # noqa: F401
    MAX_HOLD_S,
    Live,
    Store,
    StoreBusy,
    StoreUnavailable,
    live_key,
    live_snapshot,
    running_ids,
)
from abl.store.selection import PATH_RE, Selection, axis_label, check_path  # noqa: F401


def grid_cell_order(store: Store, sel: Selection) -> list[str]:
    """The cell keys of the selected runs in their grid's order (abl.present.palette.grid_order, which
    ``abl report`` uses too): the position each cell recorded in its grid file when it ran; a cell that
    recorded none (an older run folder) after them, in the order its first run started."""
    from abl.present.palette import grid_order

    return grid_order(grid_rows(store, sel))


def verdict_runs(store: Store, sel: Selection, metric: str) -> list[reader.StoredRun]:
    """The selected runs as stored-run records (abl.store.reader, the one reader): each with its final
    ``metric`` and health figures."""
    ids = selected_run_ids(store, sel)
    if not ids:
        return []
    try:
        return reader.read_runs(store.db, run_ids=ids, metrics=[metric, *HEALTH_METRICS])
    except StoreError as exc:  # the writer held the lock past the reader's retries, or no readable store
        raise (StoreBusy if "lock" in str(exc).lower() else StoreUnavailable)(str(exc)) from None


def within_cell(store: Store, sel: Selection) -> list:
    """The selected runs' within-cell answers (abl.analysis.contrasts: length x_k vs x1, accuracy vs the
    no-recall baseline), as the summary and the report give them. Reads only the metrics those contrasts
    compare (abl.analysis.contrasts.contrasts_of the selection's metric names), not every stored metric."""
    from abl.analysis.contrasts import contrasts_of
    from abl.analysis.contrasts import within_cell as answers

    ids = selected_run_ids(store, sel)
    if not ids:
        return []
    needed = sorted({n for c in contrasts_of(metric_names(store, sel)) for n in (c.metric, c.reference)})
    if not needed:
        return []
    try:
        return answers(reader.read_runs(store.db, run_ids=ids, metrics=needed),
                       order=grid_cell_order(store, sel))
    except StoreError as exc:
        raise (StoreBusy if "lock" in str(exc).lower() else StoreUnavailable)(str(exc)) from None


def verdicts(store: Store, sel: Selection, metric: str = "val_loss", *, baseline: str | None = None,
             pairs: Sequence[str] = (), by: str | None = None, bootstrap: bool = False,
             correction: str = HOLM) -> tuple[list[CellInput], Analysis, str]:
    """The verdict table of the selected runs: abl.analysis.verdicts.analyse_runs, as the CLI and the report do.

    Cells in the order their first run started (the grid's order when one
    grid ran them); the baseline, pairs or axis as in ``abl compare``.
    """
    return analyse_runs(verdict_runs(store, sel, metric), metric=metric, baseline=baseline, pairs=pairs, by=by,
                        bootstrap=bootstrap, correction=correction)


def answered(store: Store, sel: Selection, metric: str = "val_loss", *, baseline: str | None = None,
             pairs: Sequence[str] = (), by: str | None = None, bootstrap: bool = False,
             correction: str = HOLM) -> Answer:
    """The one answer of the selected runs (abl.analysis.oneanswer.answered, as the summary and ``abl compare`` give
    it): the verdict table made to agree with the per-axis answers, which lead. A design the per-axis model
    cannot fit leaves the cell tables, with the reason (``effects_problem``)."""
    return oneanswer.answered(verdict_runs(store, sel, metric), metric=metric, baseline=baseline, pairs=pairs, by=by,
                              bootstrap=bootstrap, correction=correction, tolerate=True)


def grid_channels(store: Store, sel: Selection):
    """How the selected runs' cells are drawn (abl.present.palette.grid_styles, as ``abl report`` draws them):
    one visual channel per axis of a factorial grid, from what the runs recorded (grid_varied, grid_paths,
    grid_index), else one look per cell by grid position."""
    from abl.present.palette import grid_styles

    ids = selected_run_ids(store, sel)
    if not ids:
        return grid_styles([])
    try:
        runs = reader.read_runs(store.db, run_ids=ids, metrics=())
    except StoreError as exc:  # the writer held the lock past the reader's retries, or no readable store
        raise (StoreBusy if "lock" in str(exc).lower() else StoreUnavailable)(str(exc)) from None
    return grid_styles(runs)
