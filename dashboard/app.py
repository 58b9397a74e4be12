"""abl dashboard: browse and compare the runs of the DuckDB store, read-only.

Started by ``abl dashboard [--db PATH] [--port N] [--host H]``, which sets
$ABL_DB (and $ABL_RUNS_DIR) and runs ``streamlit run`` on this file. Each page
is a script in views/ (its URL path is its file name: /curves, /compare, ...,
/run_detail?run=RUN_ID); the sidebar filters (experiment, status, config axes,
cells) apply to every page. The pages are listed in pages.py; ``abl dashboard
--snapshot OUT_DIR`` (snapshot.py) saves a screenshot of each.
"""

import streamlit as st

from abl.dashboard import common, pages
from abl.store.readonly import StoreBusy, StoreUnavailable

st.set_page_config(page_title="abl dashboard", page_icon=":material/science:", layout="wide")

PAGES = [st.Page(script, title=title, icon=icon, default=i == 0) for i, (script, title, icon) in enumerate(pages.PAGES)]

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
