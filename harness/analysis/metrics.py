"""The metric catalogue: every metric the harness records, declared once.

Each entry says what a metric is called in a table (``label``), in what unit,
what kind of figure it is (loss, speed, memory, cost, accuracy, health), which
aggregate of its logged rows is the run's final value, which direction is
better, and whether it compares across tokenizers (nats per token do not: a
token of one tokenizer is not a token of another; bits per byte do).

The run summary and ``abl compare`` (abl.present.summary), ``abl report``, the
dashboard and the store's final-values query (abl.store.database) all read it,
so a metric cannot be the peak in one place and the last value in another.
``tests/test_metric_catalogue.py`` fails when a module spells a catalogue
label or picks a metric's aggregate by hand.

abl's own entries (``CATALOGUE``, ``FAMILIES``) are registered by the built-in plugin abl.plugins.metrics
through the hook ``register_metrics``, like a third-party plugin's metrics; ``metric`` and
``shown_by_default`` read every declared one.

Families of metrics share a pattern entry (``val_loss_x<k>``,
``<task>_accuracy``, ``probe_<task>_accuracy``, ``..._per_s``); a name that
no entry matches gets ``UNKNOWN``'s defaults with its own name as label.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache


# kinds of figure
LOSS, SPEED, MEMORY, COST, ACCURACY, HEALTH, OTHER = "loss", "speed", "memory", "cost", "accuracy", "health", "other"
KINDS = (LOSS, SPEED, MEMORY, COST, ACCURACY, HEALTH, OTHER)
# the aggregate of a run's rows that is its final value
LAST = "last"  # the value logged at the highest step
MEDIAN = "median"  # per-step throughput is noisy: the median step
MAX = "max"  # a peak (or a once-per-run figure logged again by a resumed run: the largest)
AGGREGATES = (LAST, MEDIAN, MAX)
# which direction is better
LOWER, HIGHER, NEITHER = "lower", "higher", "none"


@dataclass(frozen=True)
class Metric:
    """One metric (or, for a pattern entry, one member of a family, with its name filled in)."""

    name: str
    label: str  # a table's column header
    unit: str = ""
    kind: str = OTHER
    final: str = LAST
    better: str = LOWER
    across_tokenizers: bool = True
    description: str = ""  # one sentence for a tooltip
    shown: bool = False  # shown by default (``shown_by_default``): the dashboard's first columns and choices
    plugin: str = ""  # the plugin that declared it (hook register_metrics)

    @property
    def lower_is_better(self) -> bool:
        return self.better != HIGHER

    @property
    def is_speed(self) -> bool:
        """Speed figures: their spread over seeds is shown, and a contended machine falsifies them."""
        return self.kind == SPEED

    @property
    def is_loss(self) -> bool:
        """Learning health (did not learn, spikes) applies to loss metrics."""
        return self.kind == LOSS

    @property
    def title(self) -> str:
        """An axis title: the label with its unit."""
        return f"{self.label} [{self.unit}]" if self.unit else self.label


def _m(name: str, label: str, unit: str, kind: str, final: str, better: str, across: bool = True,
       description: str = "", shown: bool = False) -> Metric:
    return Metric(name, label, unit, kind, final, better, across, description, shown)


# a figure per token (or in nats per token) is not comparable across tokenizers: a token of one is
# not a token of another
_PER_TOKEN = False

CATALOGUE: dict[str, Metric] = {m.name: m for m in (
    # loss
    _m("val_loss", "val loss", "nats/token", LOSS, LAST, LOWER, _PER_TOKEN,
       "mean cross-entropy on the fixed validation batches at the last step", shown=True),
    _m("train_loss", "train loss", "nats/token", LOSS, LAST, LOWER, _PER_TOKEN, "training cross-entropy", shown=True),
    _m("val_bpb", "val bits/byte", "bits/byte", LOSS, LAST, LOWER, True,
       "validation loss in bits per byte of the text its tokens cover"),
    # speed
    _m("tokens_per_s", "tokens/s (median step)", "tokens/s", SPEED, MEDIAN, HIGHER, _PER_TOKEN,
       "tokens per second of the median training step", shown=True),
    _m("train_tokens_per_s", "tokens/s (loop)", "tokens/s", SPEED, LAST, HIGHER, _PER_TOKEN,
       "the true rate: every token over the training loop's wall time", shown=True),
    _m("decode_tokens_per_s", "tokens/s (decode)", "tokens/s", SPEED, MEDIAN, HIGHER, _PER_TOKEN,
       "tokens per second of cached decoding", shown=True),
    _m("prefill_tokens_per_s", "tokens/s (prefill)", "tokens/s", SPEED, MEDIAN, HIGHER, _PER_TOKEN,
       "tokens per second of the prefill"),
    _m("mfu", "MFU", "fraction", SPEED, LAST, HIGHER, True,
       "model FLOPs utilisation: useful FLOPs per second over the device peak", shown=True),
    _m("hfu", "HFU", "fraction", SPEED, LAST, HIGHER, True,
       "hardware FLOPs utilisation: executed FLOPs per second over the device peak"),
    # the speed pass (abl.run.speedpass): the shape timed alone after a grid that packed it; never contended
    _m("alone_tokens_per_s", "tokens/s (alone)", "tokens/s", SPEED, LAST, HIGHER, _PER_TOKEN,
       "tokens per second of the median step when the cell's shape was timed alone on its device by the speed "
       "pass after the grid (a few steps after warm-up), not while it shared the device"),
    _m("alone_mfu", "MFU (alone)", "fraction", SPEED, LAST, HIGHER, True,
       "MFU of the speed pass: the shape timed alone on its device after the grid"),
    # memory
    _m("peak_mem_bytes", "peak memory", "bytes", MEMORY, MAX, LOWER, True,
       "the device's peak: CUDA allocation, or CPU peak RSS", shown=True),
    _m("peak_tensor_bytes", "peak tensor memory", "bytes", MEMORY, MAX, LOWER, True,
       "the largest total of live tensor storages during one training step"),
    _m("baseline_rss_bytes", "baseline RSS", "bytes", MEMORY, MAX, LOWER, True,
       "the process's resident memory before training"),
    _m("kv_bytes_per_token", "KV cache/token", "bytes", MEMORY, LAST, LOWER, _PER_TOKEN,
       "decode cache bytes per token", shown=True),
    _m("decode_cache_bytes_per_sequence", "KV cache/sequence", "bytes", MEMORY, LAST, LOWER, True,
       "decode cache bytes per sequence"),
    # cost
    _m("n_params", "parameters", "", COST, MAX, NEITHER, shown=True),
    _m("n_params_non_embedding", "parameters (non-embedding)", "", COST, MAX, NEITHER),
    _m("wall_s", "wall time (s)", "s", COST, MAX, LOWER, shown=True),
    _m("elapsed_s", "elapsed (s)", "s", COST, MAX, LOWER),
    _m("compile_s", "compile time (s)", "s", COST, MAX, LOWER, True, "torch.compile time before the first step"),
    _m("eval_s", "evaluation time (s)", "s", COST, LAST, LOWER, True,
       "wall time of one in-loop evaluation (val_loss, val_bpb and the task's metrics)"),
    _m("post_eval_s", "post-training evaluation time (s)", "s", COST, LAST, LOWER, True,
       "wall time of the post-training evaluations ([eval]: decode, extrapolation)"),
    _m("tokens", "training tokens", "tokens", COST, MAX, NEITHER, _PER_TOKEN),
    _m("flops", "training FLOPs", "FLOP", COST, MAX, NEITHER),
    _m("flops_per_token", "forward FLOPs/token", "FLOP", COST, LAST, NEITHER, _PER_TOKEN),
    _m("train_flops_per_token", "training FLOPs/token", "FLOP", COST, LAST, NEITHER, _PER_TOKEN),
    _m("flops_per_step_measured", "FLOPs/step (measured)", "FLOP", COST, LAST, NEITHER),
    _m("flops_per_step_predicted", "FLOPs/step (predicted)", "FLOP", COST, LAST, NEITHER),
    _m("useful_flops_per_step", "useful FLOPs/step (for MFU)", "FLOP", COST, LAST, NEITHER),
    _m("device_peak_flops", "device peak FLOP/s", "FLOP/s", COST, LAST, NEITHER),
    # accuracy
    _m("decode_agreement", "decode agreement", "fraction", ACCURACY, LAST, HIGHER),
    # health
    _m("grad_norm", "grad norm", "", HEALTH, LAST, NEITHER),
    _m("lr", "learning rate", "", HEALTH, LAST, NEITHER),
    _m("unigram_floor", "unigram floor", "nats/token", HEALTH, LAST, NEITHER, _PER_TOKEN),
    _m("did_not_learn", "did not learn (1 = yes)", "", HEALTH, LAST, LOWER),
    _m("loss_spikes", "loss spikes", "", HEALTH, LAST, LOWER),
    _m("max_loss_spike", "largest loss spike", "nats/token", HEALTH, LAST, LOWER, _PER_TOKEN),
    _m("contended", "contended (1 = yes)", "", HEALTH, LAST, NEITHER, True,
       "the speed was measured on a contended machine"),
    _m("cpu_util", "CPU share", "fraction", HEALTH, LAST, NEITHER, True, "the CPU share the run got"),
    _m("load_per_core", "load per core", "", HEALTH, LAST, NEITHER, True,
       "load average per core during the loop"),
)}


@dataclass(frozen=True)
class Family:
    """A pattern entry: ``pattern`` (a regular expression, matched whole) names its members; ``label`` is a
    format string over the pattern's named groups (and ``{base}``, the catalogue label of a ``base`` group)."""

    pattern: str
    label: str
    unit: str = ""
    kind: str = OTHER
    final: str = LAST
    better: str = LOWER
    across_tokenizers: bool = True

    def member(self, name: str) -> Metric | None:
        m = re.fullmatch(self.pattern, name)
        if m is None:
            return None
        groups = {k: (v or "").replace("_", " ") for k, v in m.groupdict().items()}
        if m.groupdict().get("base") in CATALOGUE:
            base = CATALOGUE[m.group("base")]
            groups["base"] = base.label
            return replace(base, name=name, label=self.label.format(**groups))
        return Metric(name, self.label.format(**groups), self.unit, self.kind, self.final, self.better,
                      self.across_tokenizers)


# first match wins: the specific families before the general ones
FAMILIES: tuple[Family, ...] = (
    # the long-context evaluation (abl.train.evaluations): the loss at k times the training context
    Family(r"(?P<base>val_loss|val_bpb)_x(?P<k>\d+)", "{base} ({k}x context)"),
    # abl.data.tasks: probes after training, and a task trained on
    Family(r"probe_(?P<task>.+)_no_recall_baseline(?:_(?P<part>.+))?", "probe {task} no-recall baseline {part}",
           "fraction", HEALTH, LAST, NEITHER),
    Family(r"(?P<task>.+)_no_recall_baseline(?:_(?P<part>.+))?", "{task} no-recall baseline {part}", "fraction",
           HEALTH, LAST, NEITHER),
    Family(r"probe_(?P<task>.+)_loss", "probe {task} loss", "nats/token", LOSS, LAST, LOWER, False),
    Family(r"probe_(?P<task>.+)_accuracy(?:_(?P<part>.+))?", "probe {task} accuracy {part}", "fraction",
           ACCURACY, LAST, HIGHER),
    Family(r"(?P<task>.+)_accuracy(?:_(?P<part>.+))?", "{task} accuracy {part}", "fraction", ACCURACY, LAST,
           HIGHER),
    Family(r"(?P<what>.+)_tokens_per_s", "tokens/s ({what})", "tokens/s", SPEED, MEDIAN, HIGHER, False),
    Family(r"(?P<what>.+)_per_s", "{what} per s", "1/s", SPEED, MEDIAN, HIGHER),
    Family(r"(?P<what>.+)_bytes_per_(?P<per>.+)", "{what} bytes per {per}", "bytes", MEMORY, LAST, LOWER),
    Family(r"(?P<what>.+)_bytes", "{what} bytes", "bytes", MEMORY, MAX, LOWER),
    Family(r"(?P<what>.+)_bytes_(?P<how>measured|predicted)", "{what} bytes ({how})", "bytes", MEMORY, LAST,
           LOWER),
    Family(r"(?P<what>.*loss.*)", "{what}", "", LOSS, LAST, LOWER, False),
)


# abl's own declarations, as abl.plugins.metrics registers them (hook register_metrics)
BUILT_IN_METRICS: tuple[Metric, ...] = tuple(CATALOGUE.values())
BUILT_IN_FAMILIES: tuple[Family, ...] = FAMILIES

# ---------------------------------------------------------------- the registered catalogue (hook register_metrics)

_BETTER = (LOWER, HIGHER, NEITHER)


def _declared(name: str, plugin: str, fields: dict) -> Metric:
    """A plugin's ``register(name, unit=..., ...)`` as a ``Metric``; a ValueError says what is wrong."""
    allowed = {"label", "unit", "kind", "final", "better", "across_tokenizers", "description", "shown"}
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}; a metric declares {', '.join(sorted(allowed))}")
    m = Metric(name, str(fields.get("label") or name.replace("_", " ")), str(fields.get("unit", "")),
               fields.get("kind", OTHER), fields.get("final", LAST), fields.get("better", LOWER),
               bool(fields.get("across_tokenizers", True)), str(fields.get("description", "")),
               bool(fields.get("shown", False)), plugin)
    for what, value, choices in (("kind", m.kind, KINDS), ("final", m.final, AGGREGATES), ("better", m.better, _BETTER)):
        if value not in choices:
            raise ValueError(f"{what} {value!r} is not one of {', '.join(choices)}")
    return m


@lru_cache(maxsize=1)
def _registered() -> tuple[dict[str, Metric], tuple[Family, ...], str]:
    """Every metric and family the plugins declare (hook ``register_metrics``; abl's own, ``CATALOGUE`` and
    ``FAMILIES``, by abl.plugins.metrics), read once per process without the torch-importing built-ins.
    Where a plugin cannot load or declares a metric wrongly: the built-ins alone, and why (``problem``)."""
    from ..contracts.plugin_manager import PluginLoadError, call_register_hook
    from ..contracts.registry import RegistryError

    entries: dict[str, Metric] = {}
    families: list[Family] = []

    def make_register(plugin: str, package: str, version: str):
        def register(entry, **fields) -> None:
            if isinstance(entry, Family):
                families.append(entry)
                return
            if isinstance(entry, Metric):
                m = entry if entry.plugin else replace(entry, plugin=plugin)
            elif isinstance(entry, str) and entry:
                try:
                    m = _declared(entry, plugin, fields)
                except ValueError as exc:
                    raise PluginLoadError(f"plugin {plugin!r} ({package}) declares metric {entry!r}: {exc}") from None
            else:
                raise PluginLoadError(f"plugin {plugin!r} ({package}) declares a metric without a name")
            if m.name in entries:
                raise PluginLoadError(f"metric {m.name!r} is declared twice: by plugin {entries[m.name].plugin!r} "
                                      f"and by plugin {plugin!r} ({package})")
            entries[m.name] = m
        return register

    try:
        call_register_hook("register_metrics", "metrics", make_register, light=True)
    except (PluginLoadError, RegistryError) as exc:
        return dict(CATALOGUE), FAMILIES, str(exc)
    if not entries:  # abl's own plugin did not load (an abl.plugins package without it): the built-ins
        return dict(CATALOGUE), FAMILIES, ""
    return entries, tuple(families), ""


def entries() -> dict[str, Metric]:
    """Every declared metric by name: abl's own and the plugins', in load order."""
    return _registered()[0]


def families() -> tuple[Family, ...]:
    """Every declared family (pattern entry), first match wins: abl's own, then the plugins'."""
    return _registered()[1]


def problem() -> str:
    """Why the plugins' metrics could not be read ("" when they were): a reader shows the built-ins alone,
    ``abl plugins`` says why."""
    return _registered()[2]


def is_own(name: str) -> bool:
    """Whether abl declares ``name`` (or a family of abl's covers it), not a third-party plugin."""
    from ..contracts.plugin_manager import SELF_DIST, provenance

    m = metric(name)
    return not m.plugin or provenance(m.plugin)[0] == SELF_DIST


def header(name: str) -> str:
    """A table's column header for ``name``, whose cells carry no unit: abl's own labels name their unit where
    one is needed (``wall time (s)``); a plugin's metric gets its unit in parentheses, as they do
    (``parameter RMS (rms)``; square brackets would be markup to rich's tables)."""
    m = metric(name)
    return m.label if is_own(name) or not m.unit else f"{m.label} ({m.unit})"


def refresh() -> None:
    """Read the declarations again (after a plugin was registered in-process)."""
    _registered.cache_clear()
    metric.cache_clear()


def shown_by_default(own: bool = True) -> tuple[str, ...]:
    """The metrics every display shows first when its user chose none, in catalogue order: those declared
    ``shown`` (abl's: the losses, the speeds, peak memory, the KV cache, parameters and wall time).
    ``own=False``: only those of plugins other than abl's own (the terminal summary adds them to its columns)."""
    return tuple(n for n, m in entries().items() if m.shown and (own or not is_own(n)))


@lru_cache(maxsize=4096)
def metric(name: str) -> Metric:
    """The catalogue entry of ``name``: its own, its family's, or the defaults with its name as label."""
    declared = entries()
    if name in declared:
        return declared[name]
    for fam in families():
        m = fam.member(name)
        if m is not None:
            return replace(m, label=" ".join(m.label.split()))
    return Metric(name, name.replace("_", " "))


def label(name: str) -> str:
    return metric(name).label


def is_speed(name: str) -> bool:
    return metric(name).is_speed


# speed figures the speed pass measured with the device to itself (abl.run.speedpass): a packed or busy
# cell's contended mark never applies to them
MEASURED_ALONE = ("alone_tokens_per_s", "alone_mfu")


def is_loss(name: str) -> bool:
    return metric(name).is_loss


def lower_is_better(name: str) -> bool:
    return metric(name).lower_is_better


def final_aggregate(name: str) -> str:
    """``last``, ``median`` or ``max``: which aggregate of a run's rows of ``name`` is its final value."""
    return metric(name).final


def across_tokenizers(name: str) -> bool:
    return metric(name).across_tokenizers


def comparison_metric(loss: str, tokenizers_differ: bool) -> str:
    """The metric cells are ranked on: ``loss``, or when the cells' data or tokenizers differ and ``loss`` is
    in a per-token unit, the validation loss in bits per byte (``val_bpb``), which compares across them."""
    if tokenizers_differ and not across_tokenizers(loss):
        return "val_bpb"
    return loss


def final_value(name: str, rows) -> float | None:
    """A run's final value of ``name`` from its ``(step, value)`` rows, by the catalogue's aggregate
    (the same as the store's query, for callers that hold the rows)."""
    pts = [(s, float(v)) for s, v in rows if v is not None and math.isfinite(float(v))]
    if not pts:
        return None
    agg = final_aggregate(name)
    if agg == MAX:
        return max(v for _, v in pts)
    if agg == MEDIAN:
        vs = sorted(v for _, v in pts)
        mid = len(vs) // 2
        return vs[mid] if len(vs) % 2 else (vs[mid - 1] + vs[mid]) / 2
    return max(pts, key=lambda p: p[0])[1]


def display(name: str, value, missing: str = "-") -> str:
    """``value`` of the metric ``name`` as every table shows it: in the catalogue's unit through
    abl.analysis.formats (``peak_mem_bytes`` 3.5e8 -> ``333.8 MiB``, ``tokens_per_s`` 91503.8 ->
    ``91,504 tokens/s``); a loss at four decimals."""
    from .formats import fmt_unit

    return fmt_unit(value, metric(name).unit if metric(name).unit != "nats/token" else "", missing=missing)
