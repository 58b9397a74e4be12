"""``abl report``: a self-contained report of one experiment from the store.

Markdown with PNG plots beside it, or one HTML file with the plots embedded
(the same Markdown, rendered by markdown-it-py), plus ``report.json`` with
every number at full precision. The sections are listed in
abl.present.report.sections, one function each.

A section, panel or axis appears only when it means something for these cells
(``abl.analysis.sections``): no scaling fit over one model size, no FLOPs (or other
cost) axis where every cell costs the same, CI bars only with enough seeds
(seed points and lines otherwise); a section left out says why in one
sentence. Predicted against measured is a summary per figure with only the
disagreements listed (the full table is folded away in HTML). Cells are named
by ``abl.grid.labels`` (the settings that differ between them), drawn in colours
(and line styles past 20 cells) that tell them apart, with legends outside the
data. Runs whose machine was contended (``abl.analysis.sections.is_contended``) are
marked wherever a speed figure is shown. Metrics are named, and their final
values taken, as the metric catalogue (abl.analysis.metrics) says.

Modules: runs (the store's runs, cells and statistics), conditions, costs,
plots, document (Markdown and HTML), sections. The store is opened
read-only. Nothing here names a variant.
"""

from __future__ import annotations

from ..figures import LINE_STYLES, MARKERS, cell_styles  # noqa: F401 - re-exported for callers
from .conditions import (  # noqa: F401 - the names callers import from abl.present.report
    condition_groups,
    conditions_line,
    measured_runs,
    report_environment,
    run_conditions,
    varied_and_fixed,
)
from .costs import (  # noqa: F401
    CONTENDED_MARK,
    attach_predictions,
    contended_runs,
    contention_note,
    cost_rows,
    cost_source,
    cost_summary,
    measured,
    measured_note,
    model_flops_utilization,
    scaling_points,
)
from .document import Doc  # noqa: F401
from .plots import (  # noqa: F401
    PLOTTED_CHECKS,
    loss_curve_panels,
    loss_curves_figure,
    plot_loss_curves,
    plot_predicted_vs_measured,
    plot_quality_vs_cost,
    plot_scaling,
    predicted_vs_measured_figure,
    predicted_vs_measured_panels,
    quality_vs_cost_figure,
    scaling_figure,
)
from .runs import (  # noqa: F401
    MIN_SIZES_FOR_FIT,
    Cell,
    ReportError,
    cell_statistics,
    comparison_metric,
    experiments,
    final_val_losses,
    group_cells,
    label_cells,
    load_runs,
    pick_baseline,
    statistics_for_runs,
)
from .sections import Report, build_report, write_report  # noqa: F401
