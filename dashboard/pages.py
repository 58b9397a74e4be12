"""The dashboard's pages: script, title, icon, in the order of the sidebar (the first is the default).

app.py builds its navigation from this list and ``abl dashboard --snapshot``
opens every page in it; a page's URL path is its script's file name
(``views/curves.py`` -> ``/curves``), the default page's is ``/``.
"""

from __future__ import annotations

from pathlib import PurePosixPath

PAGES: tuple[tuple[str, str, str], ...] = (
    ("views/experiments.py", "Experiments & runs", ":material/table_rows:"),
    ("views/curves.py", "Curves", ":material/show_chart:"),
    ("views/compare.py", "Compare", ":material/compare_arrows:"),
    ("views/tradeoffs.py", "Trade-offs", ":material/scatter_plot:"),
    ("views/costs.py", "Costs & scaling", ":material/calculate:"),
    ("views/probes.py", "Probes", ":material/psychology:"),
    ("views/kernels.py", "Kernels", ":material/memory:"),
    ("views/run_detail.py", "Run detail", ":material/description:"),
)


def name(script: str) -> str:
    """``views/curves.py`` -> ``curves``."""
    return PurePosixPath(script).stem


def url_path(script: str) -> str:
    """The page's path under the server's root ("" for the default page)."""
    return "" if script == PAGES[0][0] else name(script)
