"""Kernels: the ``bench`` table (abl bench kernels) as charts.

Per op: providers side by side for each shape (median time, whiskers p20 to
p80, in milliseconds), the speed-up over a reference provider, and the
fraction of the device's peak that abl bench recorded with each row (its
basis: a datasheet figure on known GPUs, a start-up measurement on CPU).
"""

import numpy as np
import pandas as pd
import streamlit as st

from abl.dashboard import charts, common
from abl.dashboard import queries as q

st.title("Kernels")
cols = common.load(q.bench_columns)
if cols is None:
    st.info("No kernel benchmarks in this store yet. Run `abl bench kernels --db <this database>`; "
            "its timings then appear here by op, shape and provider.", icon=":material/memory:")
    st.stop()
missing = [c for c in q.BENCH_REQUIRED if c not in cols]
if missing:
    st.error(f"The bench table lacks the column(s) {', '.join(missing)}; this dashboard cannot chart it.")
    st.stop()

sessions = common.load(q.bench_sessions, tuple(cols))
if sessions.empty:
    st.info("The bench table is empty: run `abl bench kernels` to fill it.", icon=":material/memory:")
    st.stop()

filters: dict[str, list[str]] = {}
top = st.columns([3, 2, 2, 2])
if "bench_id" in sessions:
    labels = {b: f"{str(c)[:19] if pd.notna(c) else '?'} · {d} · {n} rows"
              for b, c, d, n in zip(sessions["bench_id"], sessions["created"], sessions["device"], sessions["rows"])}
    bench_id = top[0].selectbox("Benchmark run", list(labels), format_func=lambda b: labels.get(b, str(b)), key="k_session",
                                help="Latest first. Each `abl bench kernels` invocation is one run.")
    filters["bench_id"] = [str(bench_id)]
elif "device" in sessions:
    filters["device"] = [top[0].selectbox("Device", list(sessions["device"]), key="k_device")]

facets = common.load(q.bench_facets, tuple(cols), tuple((k, tuple(v)) for k, v in filters.items()))
op = top[1].selectbox("Op", facets.get("op", []), key="k_op")
filters["op"] = [op]
if facets.get("dtype"):
    filters["dtype"] = top[2].multiselect("dtype", facets["dtype"], key="k_dtype", placeholder="all")
if facets.get("pass"):
    filters["pass"] = top[3].multiselect("pass", facets["pass"], key="k_pass", placeholder="all")
df = common.load(q.bench_rows, tuple(cols), tuple((k, tuple(v)) for k, v in filters.items()))
if df.empty:
    st.info("No benchmark rows match.")
    st.stop()
if "shape" not in df:
    df["shape"] = "-"
df["shape"] = df["shape"].fillna("-")
# one bar group per case on the x axis: the shape, with the dtype and pass when several are shown
df["case"] = df["shape"]
for c in ("dtype", "pass"):
    if c in df and df[c].nunique() > 1:
        df["case"] = df["case"] + " · " + df[c].fillna("?")
device = df["device"].iloc[0] if "device" in df else None
if device:
    st.caption(f"Device: **{device}**" + (f" · timing: {df['timing'].iloc[0]}" if "timing" in df
                                           and pd.notna(df["timing"].iloc[0]) else ""))

units = {"p50": "time, median [ms]"}
if "gbps" in df and df["gbps"].notna().any():
    units["gbps"] = "bandwidth [GB/s]"
if "tflops" in df and df["tflops"].notna().any():
    units["tflops"] = "compute [TFLOP/s]"
value = st.radio("Show", list(units), format_func=units.get, horizontal=True, key="k_value")
lo, hi = ("p20", "p80") if value == "p50" and {"p20", "p80"} <= set(df) else (None, None)
st.subheader(f"{op}: providers side by side")
charts.show(charts.bench_chart(df, value, units[value], lo, hi), df, f"bench_{op}_{value}",
            key="bench_main", caption="bars: median; whiskers: p20–p80" if lo else None)

providers = sorted(df["provider"].unique())
if len(providers) > 1:
    if st.session_state.get("k_ref") not in providers:
        st.session_state["k_ref"] = "torch" if "torch" in providers else providers[0]
    ref = st.selectbox("Speed-up relative to", providers, key="k_ref")
    keys = [c for c in ("case", "shape", "dtype", "pass") if c in df]
    base = df[df["provider"] == ref].groupby(keys)["p50"].median().rename("ref_p50")
    sp = df.join(base, on=keys)
    sp["speedup"] = sp["ref_p50"] / sp["p50"]
    sp = sp.dropna(subset=["speedup"])
    st.subheader(f"Speed-up over {ref}")
    charts.show(charts.bench_chart(sp, "speedup", f"speed-up over {ref} (p50 ratio)", rule=1.0),
                sp, f"speedup_{op}", key="bench_speedup", caption="above the red line: faster than the reference")

st.subheader("Fraction of peak")
stored = "peak_fraction" in df and df["peak_fraction"].notna().any()
own = st.toggle("use my own peak figures", value=not stored, key="k_own_peak",
                help="By default the fraction abl bench recorded with each row.")
frac = df.copy()
if own:
    pc = st.columns([2, 2, 4])
    peak_bw = pc[0].number_input("peak bandwidth [GB/s]", min_value=0.0, value=0.0, key="k_bw")
    peak_tf = pc[1].number_input("peak compute [TFLOP/s]", min_value=0.0, value=0.0, key="k_tf")
    pc[2].caption("Compute-bound rows (with TFLOP/s) are divided by the compute peak, the others by the "
                  "bandwidth peak.")
    by_compute = frac["tflops"] / peak_tf if "tflops" in frac and peak_tf > 0 else np.nan
    by_memory = frac["gbps"] / peak_bw if "gbps" in frac and peak_bw > 0 else np.nan
    has_flops = frac["tflops"].notna() if "tflops" in frac else pd.Series(False, index=frac.index)
    frac["peak_fraction"] = np.where(has_flops, by_compute, by_memory)
    basis = "your figures"
else:
    bases = sorted(set(frac["peak_basis"].dropna())) if "peak_basis" in frac else []
    basis = "; ".join(bases) or "as recorded by abl bench"
frac = frac.dropna(subset=["peak_fraction"])
if frac.empty:
    st.info("No fraction of peak for these rows: enter the device's peak figures above." if own else
            "abl bench recorded no peak for this device; switch on 'use my own peak figures'.")
else:
    charts.show(charts.bench_chart(frac, "peak_fraction", "fraction of peak", rule=1.0),
                frac, f"fraction_of_peak_{op}", key="bench_peak",
                caption=f"achieved / peak (TFLOP/s for compute-bound ops, GB/s otherwise); peak: {basis}")

with st.expander("Rows"):
    st.dataframe(df, hide_index=True, width="stretch")
