"""Run detail: one run's config (and how it differs from the baseline), environment, metrics, notes."""

import json
import math

import pandas as pd
import streamlit as st

from abl.analysis import sections
from abl.analysis.tables import config_diff
from abl.contracts.status import RUNNING
from abl.dashboard import charts, common
from abl.dashboard import queries as q
from abl.store import rundir

sel: q.Selection = st.session_state["selection"]
ctx = common.ctx()
st.title("Run detail")

runs = common.runs_table(sel)
labels = {r: f"{c} · seed {s} · {st_} · {r[:8]}" for r, c, s, st_ in
          zip(runs["run_id"], runs["cell"], runs["seed"], runs["status"])}
ids = list(runs["run_id"])
wanted = st.query_params.get("run") or st.session_state.get("detail_run")
if wanted and wanted not in labels:  # a link to a run outside the sidebar's filters
    other = common.load(q.run_row, wanted)
    if other is not None:
        ids.insert(0, wanted)
        labels[wanted] = f"{other['label']} · seed {other['seed']} · {other['status']} · {wanted[:8]} " \
                         f"(outside the filters)"
if not ids:
    common.no_runs(sel)
    st.stop()
if st.session_state.get("detail_run_w") not in ids:
    st.session_state["detail_run_w"] = wanted if wanted in ids else ids[0]


def _remember() -> None:
    st.session_state["detail_run"] = st.session_state["detail_run_w"]
    st.query_params["run"] = st.session_state["detail_run_w"]


run_id = st.selectbox("Run", ids, key="detail_run_w", format_func=lambda r: labels.get(r, r), on_change=_remember)
row = common.load(q.run_row, run_id)
if row is None:
    st.warning(f"Run {run_id} is no longer in the store.")
    st.stop()
config = json.loads(row["config"]) if isinstance(row["config"], str) else row["config"]

status = row["status"]
badge = {"completed": "green", "running": "blue", "queued": "gray"}.get(status, "red")
st.markdown(f"### {row['label'] or run_id}\n"
            f":{badge}-badge[{status}] :gray-badge[seed {row['seed']}] :gray-badge[experiment {row['experiment']}] "
            f":gray-badge[run {run_id}] :gray-badge[cell {row['cell_key']}]")

summary = common.load(q.run_metric_summary, run_id)
last = dict(zip(summary["name"], summary["last"]))
speed = common.load(q.finals, q.Selection(cells=(row["cell_key"],)), ("tokens_per_s", sections.CONTENDED))
speed = speed.set_index("run_id")
tps = speed["tokens_per_s"].get(run_id)
this_contended = sections.is_contended({sections.CONTENDED: speed[sections.CONTENDED].get(run_id)}) \
    if pd.notna(speed[sections.CONTENDED].get(run_id)) else False
cell_tps = speed["tokens_per_s"].dropna()


def _wall(v) -> str:
    return "–" if v is None or pd.isna(v) else f"{v:.1f} s"


# key figures as a table, not metric tiles: a tile cuts a long value ("573.8 …") at a laptop width
tps_text = common.fmt_metric("tokens_per_s", tps)
if this_contended:
    tps_text += " ⚠ contended"
if len(cell_tps) > 1:
    tps_text += (f" (cell: {common.fmt_metric('tokens_per_s', cell_tps.min())} – "
                 f"{common.fmt_metric('tokens_per_s', cell_tps.max())} over {len(cell_tps)} seeds)")
figures = pd.DataFrame({
    "final val_loss": [common.fmt_metric("val_loss", last.get("val_loss"))],
    "final train_loss": [common.fmt_metric("train_loss", last.get("train_loss"))],
    "tokens/s (median)": [tps_text],
    q.metric_info("peak_mem_bytes").label: [common.fmt_metric("peak_mem_bytes", last.get("peak_mem_bytes"))],
    q.metric_info("n_params").label: [common.fmt_metric("n_params", last.get("n_params"))],
    "wall time": [_wall(last.get("wall_s"))],
})
st.table(figures.T.set_axis(["value"], axis=1))  # a figure a row: two columns fit any width
if this_contended:
    st.caption(f"⚠ This run was {common.CONTENDED_NOTE}"
               + (f" (CPU share {last['cpu_util']:.2f}" if last.get("cpu_util") is not None else "")
               + (f", load per core {last['load_per_core']:.2f})" if last.get("load_per_core") is not None
                  else ")" if last.get("cpu_util") is not None else "") + ".")

if status == RUNNING:
    p = ctx.live.progress.get(run_id, {})
    steps = config.get("train", {}).get("steps")
    st.info(f"In progress: step {p.get('step') or 0} of {steps}"
            + (f", metrics file updated {p['age_s']:.0f} s ago" if p.get("age_s") is not None else "")
            + ". Numbers so far come from the run folder.", icon=":material/sync:")
if row.get("notes"):
    st.warning(f"**Notes:** {row['notes']}", icon=":material/sticky_note_2:")
if row.get("error"):
    err = str(row["error"]).strip()
    st.error(f"**{status}:** {err.splitlines()[-1]}", icon=":material/error:")
    if len(err.splitlines()) > 1:
        with st.expander("Full error"):
            st.code(err, language=None)

tab_metrics, tab_config, tab_diff, tab_env, tab_files = st.tabs(
    ["Metrics", "Config", "Diff vs baseline", "Environment", "Run folder"])

with tab_metrics:
    if summary.empty:
        st.info("No metrics recorded yet.")
    else:
        per_step = [n for n, r in zip(summary["name"], summary["rows"]) if q.is_curve(n, r)]
        if per_step:
            c1, c2 = st.columns([3, 1])
            default = "train_loss" if "train_loss" in per_step else per_step[0]
            name = c1.selectbox("Metric", per_step, index=per_step.index(default), key="detail_metric")
            log_y = c2.toggle("log y", key="detail_logy")
            data = common.load(q.run_metrics, run_id)
            series = data[data["name"] == name][["step", "value"]]
            charts.show(charts.line_chart(series, "step", "value", "step", name, log_y=log_y),
                        series.rename(columns={"value": name}), f"{run_id[:8]}_{name}", key="detail_metric")
        common.text_table(common.metric_summary_text(summary), key="detail_summary",
                          caption="Each figure in its metric's unit (abl.analysis.metrics).")
        everything = common.load(q.run_metrics, run_id)
        st.download_button("All metrics of this run (CSV, long format)",
                           data=lambda: everything.to_csv(index=False),
                           file_name=f"metrics_{run_id}.csv", mime="text/csv", on_click="ignore",
                           icon=":material/download:")

with tab_config:
    st.json(config, expanded=2)

with tab_diff:
    cells = common.cell_table(sel)
    options = list(cells["cell_key"])
    cell_labels = dict(zip(cells["cell_key"], cells["cell"]))
    base = st.session_state.get("baseline")
    if base and base not in options:
        options.insert(0, base)
        cell_labels[base] = f"{base} (the baseline picked on Compare)"
    if not options:
        st.info("No cells to compare with.")
    else:
        if st.session_state.get("detail_baseline") not in options:
            st.session_state["detail_baseline"] = base if base in options else options[0]
        chosen = st.selectbox("Baseline cell", options, key="detail_baseline",
                              format_func=lambda k: cell_labels.get(k, k),
                              help="Defaults to the baseline picked on the Compare page.")
        other = common.load(q.cell_config, chosen)
        if other is None:
            st.info("That cell is no longer in the store.")
        else:
            diff = config_diff(config, other)
            if chosen == row["cell_key"]:
                st.success("This run belongs to the baseline cell: the configs differ only in the seed.")
            elif diff.empty:
                st.info("No difference apart from the seed.")
            else:
                common.text_table(diff, key="detail_diff")
                st.caption(f"{len(diff)} setting(s) differ (the seed is ignored).")

with tab_env:
    def _ts(v) -> str:
        return "–" if v is None or (isinstance(v, float) and math.isnan(v)) or pd.isna(v) else str(v)[:19]

    duration = "–"
    if row.get("started") is not None and row.get("finished") is not None and not pd.isna(row["finished"]):
        duration = f"{(pd.Timestamp(row['finished']) - pd.Timestamp(row['started'])).total_seconds():.1f} s"
    facts = {
        "device": row.get("device"), "git commit": row.get("git_commit"),
        "started (UTC)": _ts(row.get("started")), "finished (UTC)": _ts(row.get("finished")),
        "duration": duration, "data fingerprint": row.get("data_fingerprint"), "grid file": row.get("grid_file"),
    }
    for extra in ("attempts", "executor", "code_changed"):
        if extra in row and row[extra] is not None and not (isinstance(row[extra], float) and math.isnan(row[extra])):
            facts[extra.replace("_", " ")] = row[extra]
    common.text_table(pd.DataFrame({"": list(facts), "value": [str(v) if v is not None else "–"
                                                               for v in facts.values()]}), key="detail_env")
    if str(row.get("git_commit") or "").endswith("-dirty"):
        st.caption("`-dirty`: the source tree had uncommitted changes when this run started.")
    c1, c2 = st.columns(2)
    with c1:
        st.markdown("**Environment** (precision, kernels, emulation, data)")
        st.json(json.loads(row["env"]) if isinstance(row.get("env"), str) else (row.get("env") or {}))
    with c2:
        st.markdown("**Versions** (packages and components)")
        st.json(json.loads(row["versions"]) if isinstance(row.get("versions"), str) else (row.get("versions") or {}))
    plugins = json.loads(row["plugins"]) if isinstance(row.get("plugins"), str) else {}
    if plugins:  # which plugin provided each component when it ran (abl.store.provenance.plugin_records)
        from abl.store.provenance import describe_plugin

        st.markdown("**Plugins** (which plugin provided each component when the run ran)")
        common.text_table(pd.DataFrame({"component": list(plugins),
                                        "from": [describe_plugin(o) for o in plugins.values()]}), key="detail_plugins")

with tab_files:
    folder = ctx.store.run_dir(run_id)
    if not folder.exists():
        st.info(f"No run folder at {folder} (the store can outlive its run folders).")
    else:
        st.caption(f"`{folder}`")
        status_file = folder / rundir.STATUS
        if status_file.exists():
            st.markdown(f"**{rundir.STATUS}**")
            try:
                st.json(json.loads(status_file.read_text()))
            except (OSError, json.JSONDecodeError) as exc:
                st.caption(f"unreadable: {exc}")
        log = folder / rundir.LOG
        if log.exists() and log.stat().st_size:
            st.markdown(f"**{rundir.LOG}** (last 60 lines)")
            lines = log.read_text(errors="replace").splitlines()[-60:]
            st.code("\n".join(lines), language=None)
