"""Cell labels: every label abl shows or stores is computed here.

A run's stored label is its grid's (``grid_label``: ``norm=rmsnorm, block=pre``,
set on the cell at expansion): it names the grid axes only, so two runs of one experiment that differ in something the grid
did not sweep (a ``--set`` of a component parameter, a second grid file) carry
the same stored label. Every table and chart that shows several cells labels
them with ``cell_labels`` instead: the values that differ between exactly those
cells, component parameters included, under the shortest name that is not
ambiguous, and never two cells with one label.

A component parameter (``position.sinusoidal.embed_scale``) exists only in the
cells that selected that component; it enters a label only where its value
differs between the cells that have it (otherwise the component's name already
says it).
"""

from __future__ import annotations

import json
import math
from typing import Any, Hashable, Mapping, Sequence

from ..analysis.tables import settings_of
from ..contracts.config import solved_paths

SEP = ", "
# never a label part: the seed (a cell is every seed of one config), the experiment's name and
# display keys, and the settings a run records about itself
IGNORED_PREFIXES = ("seed", "experiment.", "matched.", "lr_tuned.")


def show(value: Any) -> str:
    """A value as a grid file writes it: true/false, 0.003, 1e-06, plain strings."""
    if isinstance(value, str):
        try:  # settings from abl.analysis.verdicts.settings are JSON text
            value = json.loads(value)
        except (json.JSONDecodeError, ValueError):
            return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
            return f"{value:.1f}"
        return repr(value)
    if value is None:
        return "none"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def grid_label(varied: Mapping[str, Any]) -> str:
    """A cell's label in its grid: each swept path's last segment and value (``norm=rmsnorm, lr=0.001``),
    ``base`` for a grid that sweeps nothing; values as a grid file writes them (``show``)."""
    return SEP.join(f"{path.split('.')[-1]}={show(value)}" for path, value in varied.items()) or "base"


def settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a run's config (either stored shape; abl.analysis.tables.settings_of) that can
    enter a label: not the seed, the experiment or what the run records about itself."""
    flat = settings_of(dict(config))
    solved = solved_paths(dict(config))  # train.match's output: the budget is the choice, not these
    return {k: v for k, v in flat.items() if not k.startswith(IGNORED_PREFIXES) and k not in solved}


def _is_component_param(path: str, configs: Sequence[Mapping[str, Any]]) -> bool:
    axis = path.split(".", 1)[0]
    return any(axis in (c.get("components") or {}) for c in configs) and path.count(".") >= 2


def differing(configs: Sequence[Mapping[str, Any]], order: Sequence[str] = ()) -> list[str]:
    """The setting paths whose values differ between ``configs``, ``order``'s paths first."""
    flats = [settings(c) for c in configs]
    keys = list(dict.fromkeys(k for f in flats for k in f))
    out = []
    for k in keys:
        present = [json.dumps(f[k], sort_keys=True, default=str) for f in flats if k in f]
        if len(set(present)) > 1:
            out.append(k)
        elif len(present) < len(flats) and not _is_component_param(k, configs):
            out.append(k)  # a section key some runs lack (a config from an older version)
    rank = {p: i for i, p in enumerate(order)}
    return sorted(out, key=lambda k: (rank.get(k, len(rank)), keys.index(k)))


def short_names(paths: Sequence[str]) -> dict[str, str]:
    """Each path's shortest dotted suffix that no other path in ``paths`` ends with."""
    out = {}
    for p in paths:
        parts = p.split(".")
        for n in range(1, len(parts) + 1):
            suffix = ".".join(parts[-n:])
            if not any(q != p and (q == suffix or q.endswith("." + suffix)) for q in paths):
                break
        out[p] = suffix
    return out


def _parts(flat: Mapping[str, Any], paths: Sequence[str], names: Mapping[str, str]) -> list[str]:
    return [f"{names[p]}={show(flat[p])}" for p in paths if p in flat]


def _value(flat: Mapping[str, Any], path: str) -> str:
    return json.dumps(flat.get(path, "\0absent"), sort_keys=True, default=str)


def cell_labels(configs: Mapping[Hashable, Mapping[str, Any]], order: Sequence[str] = (),
                fallback: Mapping[Hashable, str] | None = None) -> dict[Hashable, str]:
    """``{key: label}``, distinct for distinct keys, as ``name=value`` pairs joined by ", ".

    ``configs``: one config per cell (any seed's). ``order``: the axes the cells
    were chosen by (the grid's paths, which each run records: ``recorded_paths``);
    every one of them that differs is in every label. Cells those axes leave alike get, beside them,
    the first settings that tell them apart (a ``--set`` of a component
    parameter, say), and only they do: a setting derived from an axis (a head
    width from d_model) never lengthens a label that is already distinct.
    ``fallback``: the label of a cell when nothing differs (a one-cell view).
    """
    keys = list(configs)
    cfgs = [configs[k] for k in keys]
    flats = [settings(c) for c in cfgs]
    paths = differing(cfgs, order)
    axes = [p for p in paths if p in set(order)]
    rest = sorted((p for p in paths if p not in axes), key=lambda p: (not _is_component_param(p, cfgs),))
    names = short_names(paths)
    chosen: list[list[str]] = [list(axes) for _ in keys]
    for _ in range(len(rest)):  # split every group of alike labels by the first setting that differs in it
        groups: dict[str, list[int]] = {}
        for i, f in enumerate(flats):
            groups.setdefault("\0".join(_value(f, p) for p in chosen[i]), []).append(i)
        split = False
        for members in (m for m in groups.values() if len(m) > 1):
            for p in rest:
                if len({_value(flats[i], p) for i in members}) > 1:
                    for i in members:
                        chosen[i].append(p)
                    split = True
                    break
        if not split:
            break
    labels = []
    for k, f, ch in zip(keys, flats, chosen):
        labels.append(SEP.join(_parts(f, [p for p in paths if p in ch], names))
                      or (fallback or {}).get(k) or "base")
    seen: dict[str, int] = {}
    for lbl in labels:
        seen[lbl] = seen.get(lbl, 0) + 1
    # distinct configs alike in every setting shown (a difference outside the settings): the key decides
    return {k: (lbl if seen[lbl] == 1 else f"{lbl} [{str(k)[:8]}]") for k, lbl in zip(keys, labels)}


def recorded_paths(runs: Sequence[Any]) -> list[str]:
    """The grid paths ``runs`` (objects with ``grid_paths``: abl.store's stored runs) recorded, each once, in
    the order their grids listed them: the axes their labels name first. A run from before runs recorded
    their grid has none."""
    return list(dict.fromkeys(p for r in runs for p in (getattr(r, "grid_paths", None) or ()) if isinstance(p, str)))


def run_labels(runs: Sequence[Any], order: Sequence[str] = ()) -> dict[str, str]:
    """``{cell_key: label}`` for runs with ``cell_key``, ``config`` and ``label`` attributes; ``order``: the
    axes to name first, else the grid paths the runs recorded (``recorded_paths``)."""
    order = list(order) or recorded_paths(runs)
    configs: dict[Hashable, Mapping[str, Any]] = {}
    stored: dict[Hashable, str] = {}
    for r in runs:
        configs.setdefault(r.cell_key, r.config if isinstance(r.config, dict) else {})
        stored.setdefault(r.cell_key, r.label or "")
    return {str(k): v for k, v in cell_labels(configs, order, stored).items()}
