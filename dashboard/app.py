"""abl dashboard: browse and compare the runs of the DuckDB store, read-only.

Started by ``abl dashboard [--db PATH] [--port N] [--host H]``, which sets
$ABL_DB (and $ABL_RUNS_DIR) and runs ``streamlit run`` on this file. Each page
is a script in views/ (its URL path is its file name: /curves, /compare, ...,
/run_detail?run=RUN_ID); the sidebar filters (experiment, status, config axes,
cells) apply to every page.
"""

import streamlit as st

from abl.dashboard import common
from abl.dashboard.queries import StoreBusy, StoreUnavailable

st.set_page_config(page_title="abl dashboard", page_icon=":material/science:", layout="wide")

PAGES = [
    st.Page("views/experiments.py", title="Experiments & runs", icon=":material/table_rows:", default=True),
    st.Page("views/curves.py", title="Curves", icon=":material/show_chart:"),
    st.Page("views/compare.py", title="Compare", icon=":material/compare_arrows:"),
    st.Page("views/tradeoffs.py", title="Trade-offs", icon=":material/scatter_plot:"),
    st.Page("views/costs.py", title="Costs & scaling", icon=":material/calculate:"),
    st.Page("views/probes.py", title="Probes", icon=":material/psychology:"),
    st.Page("views/kernels.py", title="Kernels", icon=":material/memory:"),
    st.Page("views/run_detail.py", title="Run detail", icon=":material/description:"),
]

page = st.navigation(PAGES)
st.sidebar.markdown("### abl")
try:
    with common.session():  # the page's queries share read-only connections, all closed at the end
        common.init()
        st.session_state["selection"] = common.sidebar()
        page.run()
except StoreBusy as exc:
    st.warning(str(exc), icon=":material/hourglass_top:")
    st.button("Try again", icon=":material/refresh:")
except StoreUnavailable as exc:
    st.error(str(exc), icon=":material/database:")
