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
by ``abl.grid.labels`` (the settings that differ between them), drawn as the
dashboard draws them (``abl.present.palette.grid_styles``): a factorial grid
with colour for one axis, marker and line style for a second and a row of panels
per level of any axis beyond, its legend a column per axis; any other grid in a
look per cell. Legends sit outside the data. Runs whose machine was contended (``abl.analysis.sections.is_contended``) are
marked wherever a speed figure is shown. Metrics are named, and their final
values taken, as the metric catalogue (abl.analysis.metrics) says.

Modules: runs (the store's runs, cells and statistics: ``load_runs``,
``group_cells``, ``ReportError``), conditions, costs, plots, within (length
extrapolation and the within-cell answers), document (Markdown and HTML),
sections (``build_report``, ``write_report``). Import a
name from the module that defines it (``from abl.present.report.sections
import build_report``): this package hands nothing on. The store is opened
read-only. Nothing here names a variant.
"""
