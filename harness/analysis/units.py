"""The units of the metric catalogue that code compares against (abl.analysis.metrics declares each
metric's unit; abl.analysis.formats, the tables and the dashboard pick a format by it). Part of the
catalogue: spelled here once, imported everywhere else."""

TOKENS_PER_S = "tokens/s"
FLOP_PER_S = "FLOP/s"
