"""Statistics over finished runs: paired comparisons, verdicts, health marks, scaling fits.

Pure functions over numbers and records (no store, no model, no terminal): the
paired tests and intervals (stats), the one verdict vocabulary (verdicts), the
health marks such as "did not learn" (health), scaling-law fits (scaling), the
shared thresholds (sections), table helpers (tables), the metric catalogue
(metrics) and whether a metric compares between two cells (comparable). May
import ``abl.contracts`` and ``abl.kernels``; nothing above.
"""
