"""``abl plugins``' listing of what is pluggable beyond components: executors, post-training evaluations and
metrics (hooks register_executors, register_evaluations, register_metrics), each with where it came from."""

from __future__ import annotations

from typing import Callable


def extension_rows(origin: Callable[[str, str, str], str]) -> list[dict]:
    """One row per executor, evaluation and metric: ``axis`` (executor, evaluation, metric), ``name``, ``doc``,
    ``plugin``, ``origin`` and, for a metric, its unit, kind, final aggregate, better direction and ``shown``."""
    from ..analysis import metrics
    from ..contracts.plugin_manager import provenance
    from ..run import executors
    from ..train import evaluations
    from .common import fail, user_errors

    try:
        found = executors.registered(), evaluations.registered()
    except user_errors() as exc:
        fail(str(exc))
    if metrics.problem():
        fail(metrics.problem())
    rows: list[dict] = []
    for e in found[0].values():
        rows.append({"axis": "executor", "name": e.name, "doc": e.doc, "plugin": e.plugin, "package": e.package,
                     "version": e.version, "origin": origin(e.package, e.version, e.plugin)})
    for ev in found[1].values():
        rows.append({"axis": "evaluation", "name": ev.name, "doc": ev.doc, "metrics": list(ev.metrics),
                     "plugin": ev.plugin, "package": ev.package, "version": ev.version,
                     "origin": origin(ev.package, ev.version, ev.plugin)})
    for m in metrics.entries().values():
        package, version = provenance(m.plugin) if m.plugin else ("-", "-")
        rows.append({"axis": "metric", "name": m.name, "doc": m.description, "label": m.label, "unit": m.unit,
                     "kind": m.kind, "final": m.final, "better": m.better, "shown": m.shown, "plugin": m.plugin,
                     "package": package, "version": version, "origin": origin(package, version, m.plugin)})
    return rows


def extension_lines(rows: list[dict], wrap: Callable[..., list[str]]) -> list[str]:
    """The text listing of ``extension_rows``: every executor and evaluation, and the metrics that a plugin other
    than abl's own declares (abl's are counted: ``abl plugins --json`` lists them all)."""
    from ..contracts.plugin_manager import SELF_DIST

    lines: list[str] = []
    for axis, title in (("executor", "executor  (selected by abl run --executor)"),
                        ("evaluation", "evaluation  (post-training, switched by eval.<name>)")):
        lines += ["", *wrap(title, 0, 4)]
        for r in (r for r in rows if r["axis"] == axis):
            lines += wrap(f"{r['name']}  {r['origin']}", 2, 4)
            if r["doc"]:
                lines += wrap(r["doc"], 6)
    metric_rows = [r for r in rows if r["axis"] == "metric"]
    own = [r for r in metric_rows if r["package"] == SELF_DIST]
    lines += ["", *wrap(f"metric  (the metric catalogue: {len(own)} of abl's own, abl plugins --json lists them)",
                        0, 4)]
    for r in (r for r in metric_rows if r["package"] != SELF_DIST):
        shown = ", shown by default" if r["shown"] else ""
        lines += wrap(f"{r['name']} [{r['unit'] or 'no unit'}]  {r['origin']}", 2, 4)
        lines += wrap(f"{r['label']}: {r['kind']}, final value {r['final']}, {r['better']} is better{shown}"
                      + (f"; {r['doc']}" if r["doc"] else ""), 6)
    return lines
