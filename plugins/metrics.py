"""abl's own metrics, declared to the metric catalogue (abl.analysis.metrics) through the hook
``register_metrics`` like any plugin's: each with its label, unit, kind, final aggregate, better
direction and whether it is shown by default. Their declarations are abl.analysis.metrics' CATALOGUE
and FAMILIES (``abl.BUILT_IN_METRICS``, ``abl.BUILT_IN_FAMILIES``); this module imports no torch, so a
command that only reads the store loads it."""

from __future__ import annotations

from abl import BUILT_IN_FAMILIES, BUILT_IN_METRICS, hookimpl


@hookimpl
def register_metrics(register):
    for entry in BUILT_IN_METRICS:
        register(entry)
    for family in BUILT_IN_FAMILIES:
        register(family)
