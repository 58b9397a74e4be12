"""What a researcher reads: the run summary, the report, figures, terminal layout.

The end-of-run summary (summary), the HTML/Markdown report (report), task
accuracy tables (taskreport), shared matplotlib helpers (figures) and the
terminal layout helpers (termlayout). May import ``abl.store`` and the layers
below it; never the run orchestration.
"""
