"""Configs as flat tables, ``{dotted path: leaf value}``: the report's grid tables, the dashboard's config diffs."""

from __future__ import annotations

import json
from typing import Any

ABSENT = "(absent)"


def flatten(obj: Any, prefix: str = "", *, index_lists: bool = False) -> dict[str, Any]:
    """A nested config as ``{"model.d_model": 64, ...}``; an empty dict leaves no path.

    A list of objects is one leaf, its JSON text (a readable table cell); with
    ``index_lists`` every list holding objects or lists gets one path per
    element instead (``layers[0].kind``), so a diff names the element that
    differs.
    """
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k), index_lists=index_lists))
        return out
    if isinstance(obj, list) and obj:
        if index_lists and any(isinstance(v, (dict, list)) for v in obj):
            out = {}
            for i, v in enumerate(obj):
                out.update(flatten(v, f"{prefix}[{i}]", index_lists=True))
            return out
        if not index_lists and all(isinstance(v, dict) for v in obj):
            return {prefix: json.dumps(obj, sort_keys=True)}
    return {prefix: obj}


SETTING_SECTIONS = ("model", "train", "data", "eval")


def settings_of(config: dict[str, Any], sections: tuple[str, ...] = SETTING_SECTIONS) -> dict[str, Any]:
    """A run's settings, ``{dotted path: value}``: the one flattening of a config (either stored shape) that
    the store's ``run_settings`` table, the labels and the analysis share. ``sections`` flattened as they
    are (``model.d_model``), and each component's parameters under its axis and name
    (``position.sinusoidal.embed_scale``)."""
    from ..contracts.config import CONFIG_FORMAT, canonical_config

    if config.get("format") == CONFIG_FORMAT:
        config = canonical_config(dict(config))
    flat = flatten({k: config.get(k) for k in sections if config.get(k) is not None})
    for axis, spec in (config.get("components") or {}).items():
        if isinstance(spec, dict) and isinstance(spec.get("params"), dict):
            for k, v in spec["params"].items():
                flat[f"{axis}.{spec.get('name')}.{k}"] = v
    return flat


def config_diff(a: Any, b: Any, ignore: tuple[str, ...] = ("seed",)):
    """A DataFrame of the paths where two configs (dicts or their JSON text) differ, one-sided keys included.

    Columns: path, this run (``a``), baseline (``b``); a missing key shows as ``ABSENT``.
    """
    import pandas as pd

    fa, fb = (flatten(_parsed(c), index_lists=True) for c in (a, b))
    rows = []
    for path in sorted(set(fa) | set(fb)):
        if path in ignore:
            continue
        va, vb = fa.get(path, ABSENT), fb.get(path, ABSENT)
        if va != vb:
            rows.append({"path": path, "this run": _show(va), "baseline": _show(vb)})
    return pd.DataFrame(rows, columns=["path", "this run", "baseline"])


def _parsed(config: Any) -> Any:
    """A config as the store returns it (JSON text) or as a dict."""
    if isinstance(config, str):
        try:
            return json.loads(config)
        except json.JSONDecodeError:
            return config
    return config


def _show(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)
