"""abl dashboard (minimal): runs of the store and their final losses.

Started by ``abl dashboard``; reads the database named by $ABL_DB read-only.
The full comparison app (curves, confidence intervals, trade-offs, kernels)
grows here.
"""

import os

import duckdb
import streamlit as st

DB = os.environ.get("ABL_DB", "results/abl.duckdb")

st.set_page_config(page_title="abl", layout="wide")
st.title("abl: runs")

try:
    con = duckdb.connect(DB, read_only=True)
except duckdb.Error as exc:  # missing file or held by a writer
    st.error(f"cannot open {DB}: {exc}")
    st.stop()

experiments = [r[0] for r in con.execute("SELECT DISTINCT experiment FROM runs ORDER BY 1").fetchall()]
if not experiments:
    st.info("no runs yet: abl run ablations/norms.toml")
    st.stop()
experiment = st.selectbox("experiment", experiments)
table = con.execute(
    """
    SELECT r.label, r.seed, r.status, v.val_loss, r.run_id
    FROM runs r LEFT JOIN (
        SELECT run_id, arg_max(value, step) AS val_loss FROM metrics
        WHERE name = 'val_loss' GROUP BY run_id) v USING (run_id)
    WHERE r.experiment = ? ORDER BY v.val_loss NULLS LAST
    """,
    [experiment],
).df()
st.dataframe(table, use_container_width=True)
con.close()
