"""The abl dashboard: a read-only Streamlit app over the DuckDB store.

``app.py`` is the entry point (``abl dashboard`` starts it); ``views/`` holds
one script per page; ``queries`` is every SQL statement the pages run over
runs and metrics (with the connection rules in ``connection``, the run
selection in ``selection`` and the Kernels page's queries in
``benchqueries``) and ``charts`` the Altair charts. The statistics are
``abl.analysis.stats`` and the metrics' names, units and final values
``abl.analysis.metrics``, shared with the CLI and the report.
"""
