"""Multi-seed statistics: is a cell's difference from the baseline real?

One implementation for the CLI, the report and the dashboard, and this
package is its public face: ``from abl.analysis import stats`` and
``stats.analyse``; the modules below are its rooms. A ``from ... import``
of one name takes it from the room that defines it (one path per name:
``from abl.analysis.stats.engine import TOO_FEW``).

For each cell: the mean, the sample standard deviation and the 95% confidence
interval (Student t, n - 1 degrees of freedom) of its final value over
seeds. For each cell against a baseline cell: the difference of means, its 95%
CI and a two-sided p-value,

- paired by seed (t-test on the per-seed differences) when both cells ran the
  same seeds and see the same data order. In abl the order of training
  batches depends only on the seed (given the dataset, context and batch
  size), so cells of one grid with the same seed set are paired: pairing
  removes the seed-to-seed variance both cells share;
- otherwise Welch's unequal-variance t-test (Welch-Satterthwaite degrees of
  freedom).

``analyse`` (engine) is the one verdict engine: the ``abl run`` summary,
``abl compare``, ``abl report`` and the dashboard's Compare page all call it
(through abl.analysis.verdicts), with the same defaults: paired by seed when
the cells share seeds and data order, else Welch; Holm over the comparisons
shown, intervals adjusted alike; "too few seeds to decide" below MIN_SEEDS
seeds (no minimum detectable difference from so few); ranks as tie groups;
cells that did not learn are not ranked. ``main_effects`` (effects) gives
each swept axis's answer, pooled over the other axes. ``compare``
and ``compare_cells`` are thin wrappers over it. The dashboard's other pages
use ``summarize_groups``, ``t_halfwidth``, ``ema``, ``pareto_mask`` and
``downsample`` (frames).

The rooms: ttest (t-intervals, the paired and Welch tests, per-cell
summaries), corrections (Holm), effects (main effects per axis, a linear
model with blocks, statsmodels), power (power, minimum detectable difference,
seeds needed), bootstrap (percentile bootstrap), engine (the verdict tables
and which comparisons), frames (dashboard frames and curves), formats
(significance stars, rows by seed; the number formats ``fmt`` and ``fmt_p``
are abl.analysis.formats's, listed here too). numpy + scipy.stats; the frame helpers take pandas
objects but do not import pandas; nothing here knows torch. May import
``abl.contracts`` and ``abl.kernels``, like the rest of ``abl.analysis``.
"""

from __future__ import annotations

from .bootstrap import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, bootstrap_diff
from .corrections import HOLM, NO_CORRECTION, holm, verdict_level
from .effects import (
    AxisEffect,
    DesignPower,
    Interaction,
    LevelRow,
    detectable_by_design,
    main_effects,
    seeds_for_axis,
)
from .engine import (
    BASELINE,
    BETTER,
    DIAGNOSTIC,
    DIAGNOSTIC_ROLE,
    DID_NOT_LEARN,
    NOT_COMPARABLE,
    SAME,
    TOO_FEW,
    UNTESTED,
    VERDICT,
    VERDICT_WORDS,
    WORSE,
    Analysis,
    CellInput,
    CellResult,
    CellRow,
    Comparison,
    ComparisonRow,
    Health,
    against_baseline,
    analyse,
    by_axis,
    compare,
    compare_cells,
    letters,
    verdict_word,
)
from ..formats import fmt, fmt_p
from .formats import seeds_of, stars
from .frames import downsample, ema, ema_by_group, pareto_mask, summarize_groups
from .power import MIN_SEEDS, POWER, min_detectable, power_t, seeds_needed
from .ttest import ALPHA, CONFIDENCE, Summary, paired, paired_test, summarize, t_halfwidth, welch, welch_test

__all__ = [
    "ALPHA", "CONFIDENCE", "BETTER", "WORSE", "SAME", "BASELINE", "TOO_FEW", "DID_NOT_LEARN", "NOT_COMPARABLE", "HOLM",
    "DIAGNOSTIC", "DIAGNOSTIC_ROLE", "VERDICT", "UNTESTED", "verdict_level",
    "NO_CORRECTION", "MIN_SEEDS", "POWER", "BOOTSTRAP_RESAMPLES", "BOOTSTRAP_SEED",
    # t-intervals and tests
    "t_halfwidth", "welch", "paired", "paired_test", "welch_test", "Summary", "summarize",
    # corrections, power, bootstrap
    "holm", "power_t", "min_detectable", "seeds_needed", "bootstrap_diff",
    # the verdict engine
    "Health", "CellInput", "CellRow", "ComparisonRow", "Analysis", "analyse", "against_baseline", "by_axis",
    "Comparison", "compare", "CellResult", "compare_cells", "VERDICT_WORDS", "verdict_word",
    "letters",
    # main effects per axis of a product grid (statsmodels)
    "AxisEffect", "LevelRow", "Interaction", "main_effects", "seeds_for_axis", "detectable_by_design", "DesignPower",
    # tables and frames
    "fmt", "fmt_p", "stars", "seeds_of", "summarize_groups", "ema", "ema_by_group", "pareto_mask", "downsample",
]
