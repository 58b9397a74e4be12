"""Where and how the runs ran (the conditions every number carries), and what the grid varies.

Conditions are read from each run's info.json and meta.json as stored; only
the completed runs are conditions of a number (``measured_runs``).
"""

from __future__ import annotations

import json
import platform
from typing import Any

from ...analysis.tables import settings_of
from ...contracts.status import COMPLETED
from ...store.reader import StoredRun
from .runs import Cell

# the sections a grid description compares (its evaluations are listed apart)
SECTIONS = ("model", "train", "data")

# ---------------------------------------------------------------- conditions


def run_conditions(r: StoredRun) -> dict[str, str]:
    v = r.versions or {}
    env = r.env or {}
    precision = str(env.get("precision", r.config.get("train", {}).get("precision", "?")))
    if env.get("emulated"):
        precision += " (emulated)"
    return {
        "device": r.device,
        "torch": str(v.get("torch", "?")),
        "python": str(v.get("python", "?")),
        "abl commit": r.git_commit,
        "data": f"{r.data_fingerprint[:12]}" + (f" ({env['data_description']})" if env.get("data_description")
                                                  else ""),
        "precision": precision,
        "kernels": str(env.get("kernels", "?")),
    }


def condition_groups(runs: list[StoredRun]) -> list[tuple[dict[str, str], list[StoredRun]]]:
    groups: dict[str, tuple[dict[str, str], list[StoredRun]]] = {}
    for r in runs:
        cond = run_conditions(r)
        groups.setdefault(json.dumps(cond, sort_keys=True), (cond, []))[1].append(r)
    return list(groups.values())


def measured_runs(runs: list[StoredRun]) -> list[StoredRun]:
    """The runs whose numbers are shown: the completed ones (all, when none is). A run still going, or
    one that failed or was killed, may not have recorded its environment yet: it is no condition of
    any number in the report."""
    return [r for r in runs if r.status == COMPLETED] or list(runs)


def conditions_line(runs: list[StoredRun]) -> str:
    """One line that says where every number came from (the completed runs)."""
    runs = measured_runs(runs)
    groups = condition_groups(runs)
    seeds = sorted({r.seed for r in runs})
    seed_txt = f"seeds {','.join(map(str, seeds))}"
    if len(groups) == 1:
        c = groups[0][0]
        return (f"{c['device']}; torch {c['torch']}, python {c['python']}; abl {c['abl commit'][:12]}; "
                f"data {c['data']}; precision {c['precision']}; kernels {c['kernels']}; {seed_txt}")
    return f"{len(groups)} different run conditions (see the Conditions table); {seed_txt}"


def report_environment() -> dict[str, str]:
    """Where the report itself was made (predictions are computed here)."""
    from ...store.provenance import git_commit, package_versions

    out = {"platform": platform.platform(), "abl commit": git_commit(),
           **package_versions(("abl", "torch", "numpy", "scipy", "duckdb", "matplotlib"))}
    return out


# ---------------------------------------------------------------- grid description


def varied_and_fixed(cells: list[Cell]) -> tuple[list[str], dict[str, Any]]:
    """Config paths that differ between cells, and the settings all cells share."""
    flats = [settings_of(c.config, SECTIONS) for c in cells]
    # parameters of a component only some cells select are implied by the selector column
    keys = [k for k in flats[0] if all(k in f for f in flats)]
    varied = [k for k in keys if len({json.dumps(f[k], default=str) for f in flats}) > 1]
    fixed = {k: flats[0][k] for k in keys if k not in varied}
    return varied, fixed


def setting_value(config: dict, key: str) -> Any:
    """One setting of a cell's config (``model.d_model``, ``norm.rmsnorm.eps``), as ``varied_and_fixed`` names it."""
    return settings_of(config, SECTIONS).get(key)
