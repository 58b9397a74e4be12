"""The abl dashboard: a read-only Streamlit app over the DuckDB store.

``app.py`` is the entry point (``abl dashboard`` starts it); ``views/`` holds
one script per page; ``queries.py`` is every SQL statement the app runs and
``charts.py`` the Altair charts. The statistics are ``abl.analysis.stats``, shared with
the CLI and the report.
"""
