"""What a researcher reads: the run summary, the report, figures, terminal layout.

The end-of-run summary and ``abl compare`` (summary), the HTML/Markdown report
(the package report: its data, conditions, costs, plots, document and one
function per section), task accuracy tables (taskreport), shared matplotlib
helpers (figures) and the terminal layout helpers (termlayout). Metric names,
units and final values come from abl.analysis.metrics. May import
``abl.store`` and the layers below it; never the run orchestration.
"""
