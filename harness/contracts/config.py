"""Grid files: TOML -> typed configs -> validated cells with stable run ids.

A grid file has the tables

- ``[experiment]``: name, seeds, description;
- ``[model]``, ``[train]``, ``[data]``, ``[eval]``: the flat fields of the
  dataclasses below. The component on each axis is chosen by name
  (``model.norm``, ``model.mixer``, ``train.precision``, ``data.dataset`` ...);
  ``[eval]`` switches the post-training evaluations (abl.train.evaluations) on or off;
- one table per axis holding parameters per component name, e.g.
  ``[norm.rmsnorm] eps = 1e-6`` or ``[mixer.mha] n_kv_heads = 2``; they apply
  only when that component is selected;
- ``[grid]``: dotted config paths mapped to lists of values; the cells are
  the cartesian product of those lists x seeds. ``exclude`` is an optional
  list of tables; a cell matching every entry of one of them is dropped.

Every problem found is collected and reported together, before any training
(abl.grid). A validated cell's resolved config is what a run folder stores
(``config.json``); ``cell_from_config`` turns it back into a Cell in the worker,
and its run id is the hash of its canonical shape (see "the resolved config's
two shapes" below).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from .registry import AXES, Param, Registry, RegistryError


class ConfigError(Exception):
    """A user error in a grid file or override; ``messages`` lists them all."""

    def __init__(self, messages: list[str] | str):
        self.messages = [messages] if isinstance(messages, str) else list(messages)
        super().__init__("\n".join(self.messages))


# Upper bounds of the sizes: far beyond any model this harness trains, yet small enough that a typo
# (n_layers = 100000, batch_size = 2**63-1) is refused here, by a range check, instead of reaching the
# memory check, the cost model or the allocator (issue 27). Raise one when a real grid needs it.
MAX_WIDTH = 2**16  # d_model, head_dim
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_CONTEXT = 2**20  # tokens per sequence
MAX_VOCAB = 2**24
MAX_BATCH = 2**16  # sequences per step, validation batches
MAX_DEVICES = 1024
MAX_THREADS = 1024


def _f(default, doc, **kw):
    return field(default=default, metadata={"doc": doc, **kw})


@dataclass
class ExperimentConfig:
    name: str = _f("default", "experiment name; runs are grouped by it in the store")
    seeds: list = field(default_factory=lambda: [0],
                        metadata={"doc": "list of integer seeds; every cell runs once per seed"})
    description: str = _f("", "free text shown in reports")
    db: str = _f("", "database for this grid, relative to the working directory and inside it "
                 "(abl run --db overrides; default results/abl.duckdb)")
    # display choices (never part of a run's config or hash; abl.analysis.verdicts):
    summary: list = field(default_factory=lambda: ["val_loss"],
                          metadata={"doc": "metrics the abl run summary shows, e.g. [\"val_loss\", \"val_loss_x2\"]; "
                                           "loss metrics get a verdict table each, the first ranks the cells"})
    baseline: str = _f("", "the summary's baseline cell: label, 1-based index or cell-key prefix "
                       "(default: the grid's first cell); a display choice, nothing retrains")


# model.logit_scale: the factor on the LM head's logits, as a function of d_model
LOGIT_SCALES = ("none", "inv_sqrt_d_model")


def logit_factor(scale: str, d_model: int) -> float:
    """The factor ``model.logit_scale`` puts on the logits: 1, or 1/sqrt(d_model)."""
    return d_model ** -0.5 if scale == "inv_sqrt_d_model" else 1.0


# model.embed_scale: the factor on the token embeddings, as a function of d_model
EMBED_SCALES = ("none", "sqrt_d_model")


def embed_factor(scale: str, d_model: int) -> float:
    """The factor ``model.embed_scale`` puts on the token embeddings: 1, or sqrt(d_model)."""
    return d_model ** 0.5 if scale == "sqrt_d_model" else 1.0


@dataclass
class ModelConfig:
    d_model: int = _f(128, "residual stream width", min=1, max=MAX_WIDTH)
    n_layers: int = _f(4, "number of blocks", min=1, max=MAX_LAYERS)
    n_heads: int = _f(4, "attention heads (query heads)", min=1, max=MAX_HEADS)
    head_dim: int = _f(0, "width of each attention head's q, k and v; 0 = d_model // n_heads. The attention "
                       "mixers project d_model to n_heads * head_dim and back", min=0, max=MAX_WIDTH)
    context: int = _f(128, "training context length in tokens", min=2, max=MAX_CONTEXT)
    vocab_size: int = _f(0, "0 = take it from the dataset", min=0, max=MAX_VOCAB)
    # variant=True: a variant of the shared skeleton that is a config key, not a component
    # (abl plugins lists these beside the components)
    tie_embeddings: bool = _f(True, "share the token embedding with the LM head (Press & Wolf 2017, "
                              "arXiv:1608.05859, sec. 3)", variant=True)
    init_std: float = _f(0.0, "std of the normal init of linear and embedding weights; 0 = 1/sqrt(d_model) "
                         "(fan-in; see docs/findings.md 'Default initialisation')", min=0.0)
    dropout: float = _f(0.0, "dropout on sublayer outputs", min=0.0, max=1.0)
    norm: str = _f("rmsnorm", "norm component")
    block: str = _f("pre", "block layout component")
    position: str = _f("rope", "position component")
    mixer: str = _f("mha", "mixer component (attention or SSM)")
    ffn: str = _f("gelu", "feed-forward component")
    scale: str = _f("", "a model-size preset that sets d_model, n_layers and n_heads: "
                    "xs, s, m, l, xl (see SCALES); empty = use those fields as given")
    layer_pattern: str = _f("", "hybrid stacks: comma-separated mixer names tiled over the layers, "
                            "e.g. 'mamba2,mamba2,mha'; empty = model.mixer in every layer")
    recipe: str = _f("", "an architecture recipe (abl plugins lists them, docs/recipes.md): sets every component "
                     "and parameter as that family defines it, scaled to this size; keys the grid sets win")
    logit_scale: str = _f("none", "scale the LM head's logits: none, or inv_sqrt_d_model (divide them by "
                          "sqrt(d_model) as Mesh-TensorFlow's Transformer does with a tied embedding: Shazeer et al. 2018, "
                          "arXiv:1811.02084; T5, Raffel et al. 2020, arXiv:1910.10683)",
                          choices=LOGIT_SCALES, variant=True)
    z_loss: float = _f(0.0, "output z-loss coefficient: adds z_loss * mean(log^2 Z), Z the softmax normaliser "
                       "of the logits at the scored positions, to the training loss (PaLM, Chowdhery et al. "
                       "2022, arXiv:2204.02311, sec. 5: 1e-4); 0 = off. val_loss stays the cross-entropy", min=0.0,
                       variant=True)
    embed_scale: str = _f("none", "scale the token embeddings before the position encoding: none, or sqrt_d_model "
                          "(multiply them by sqrt(d_model): Vaswani et al. 2017, arXiv:1706.03762, sec. 3.4; Gemma 2, "
                          "Gemma Team 2024, arXiv:2408.00118, with tied embeddings)", choices=EMBED_SCALES, variant=True)
    logit_softcap: float = _f(0.0, "final-logit soft-capping: the LM head's logits (after model.logit_scale) become "
                              "c * tanh(logits / c), in training, evaluation and decoding (Gemma 2, Gemma Team 2024, "
                              "arXiv:2408.00118, sec. 2: c = 30.0); 0 = off", min=0.0, variant=True)

    def layer_mixer_names(self) -> list[str]:
        """The mixer name of each layer (``layer_pattern`` tiled, or ``mixer`` everywhere)."""
        names = [n.strip() for n in self.layer_pattern.split(",") if n.strip()]
        if not names:
            return [self.mixer] * self.n_layers
        return [names[i % len(names)] for i in range(self.n_layers)]

    def __post_init__(self) -> None:
        self.derive_defaults()

    def derive_defaults(self, rederive: Any = ()) -> None:
        """Fill the fields whose 0 means "derived from the width" (``head_dim``, ``init_std``);
        those named in ``rederive`` are recomputed even when set (a preset changed the width)."""
        if not self.head_dim or "head_dim" in rederive:
            self.head_dim = self.d_model // self.n_heads if self.n_heads > 0 else 0
        if not self.init_std or "init_std" in rederive:
            self.init_std = 1.0 / math.sqrt(self.d_model) if self.d_model > 0 else 0.0


@dataclass
class TrainConfig:
    steps: int = _f(200, "optimizer steps", min=1)
    tokens: int = _f(0, "token budget instead of steps: steps = ceil(tokens / (batch_size * context))",
                     min=0)
    batch_size: int = _f(16, "sequences per step", min=1, max=MAX_BATCH)
    lr: float = _f(3e-3, "peak learning rate", min=0.0)
    min_lr_ratio: float = _f(0.1, "cosine decays to lr * min_lr_ratio", min=0.0, max=1.0)
    warmup_steps: int = _f(20, "linear warm-up steps", min=0)
    weight_decay: float = _f(0.1, "AdamW decoupled weight decay (matrices only)", min=0.0)
    beta1: float = _f(0.9, "AdamW beta1", min=0.0, max=1.0)
    beta2: float = _f(0.95, "AdamW beta2", min=0.0, max=1.0)
    adam_eps: float = _f(1e-8, "AdamW epsilon", min=0.0)
    grad_clip: float = _f(1.0, "global grad-norm clip; 0 disables", min=0.0)
    eval_every: int = _f(50, "evaluate on the validation split every N steps (and at the end)", min=1)
    eval_batches: int = _f(8, "validation batches per evaluation", min=1, max=MAX_BATCH)
    precision: str = _f("fp32", "precision component")
    device: str = _f("auto", "auto, cpu, cuda or cuda:N", choices=None)
    kernels: str = _f("auto", "auto (torch off CUDA; on CUDA each op's faster verified path, measured once "
                              "per device and shapes), triton or torch",
                      choices=("auto", "triton", "torch"))
    threads: int = _f(0, "torch CPU threads per cell: 0 = chosen as the cell starts from the cores, the cells "
                      "run at once and the load (docs/robustness.md); -1 = torch's default (all cores); "
                      "N = exactly N", min=-1, max=MAX_THREADS)
    diverge_loss: float = _f(1e3, "a train loss above this (or non-finite) stops the cell as diverged", min=0.0)
    checkpoint_every: int = _f(0, "save a checkpoint every N steps (0 = never); a killed cell resumes "
                               "from its last checkpoint", min=0)
    match: str = _f("none", "fair budgets: resize cells so non-embedding params ('params') or training "
                    "FLOPs per token ('flops') match the grid's first cell within 1%",
                    choices=("none", "params", "flops"))
    match_by: str = _f("ffn", "what train.match adjusts: the FFN width ('ffn') or the depth ('n_layers')",
                       choices=("ffn", "n_layers"))
    devices: int = _f(1, "processes per cell: > 1 trains one cell with DDP under torchrun "
                      "(one GPU each on CUDA, gloo on CPU); batch_size is the global batch", min=1, max=MAX_DEVICES)
    deterministic: bool = _f(False, "torch.use_deterministic_algorithms (slower; recorded with the run)")
    lr_sweep: list = field(default_factory=list, metadata={
        "doc": "fair learning rates (abl.run.lr_sweep): train every cell at each of these peak LRs on the first "
               "seed, then each variant at its own best LR on the other seeds; empty = train.lr"})
    lr_tuning_seeds: int = _f(1, "with train.lr_sweep: how many of the first seeds tune the learning rates; each "
                              "variant gets the lr with the lowest mean final val_loss over them that learned on "
                              "every one (2 or more catch an lr that is stable on one seed only); the rest compare",
                              min=1, max=16)
    compile: bool = _f(False, "torch.compile the model and its loss for the training steps (compile time "
                       "is recorded apart as compile_s, never in tokens/s; evaluation stays eager)")
    timeout_s: float = _f(0.0, "stop a cell that runs longer than this many seconds (start-up included) and "
                          "store it failed with the reason; the grid goes on (0 = no limit; not part of the "
                          "run id: --retry failed re-runs a timed-out cell under a longer limit)", min=0.0)
    stall_warning_s: float = _f(600.0, "warn once when a running cell has reported no step for this many seconds "
                                "(it keeps running; 0 = never; not part of the run id)", min=0.0)


# model.scale presets for size ladders (d_model, n_layers, n_heads); head dim 32 where it fits.
SCALES: dict[str, tuple[int, int, int]] = {
    "xs": (64, 2, 2),
    "s": (128, 4, 4),
    "m": (256, 6, 8),
    "l": (512, 8, 16),
    "xl": (768, 12, 24),
}


@dataclass
class DataConfig:
    dataset: str = _f("pystdlib", "dataset component")
    tokenizer: str = _f("byte", "tokenizer component (turns the dataset's text into tokens; "
                        "the model's vocabulary follows it)")
    accept_lossy_tokenizer: bool = _f(False, "train with a tokenizer that does not give back the validation text "
                                      "it encodes (decode(encode(s)) != s); refused by default, and its runs "
                                      "carry a note (their bits per byte are not over the text's bytes)")


@dataclass
class EvalConfig:
    """One switch per post-training evaluation (abl.train.evaluations); off records none of its metrics."""

    decode: bool = _f(True, "after training: cached greedy decoding speed (prefill/decode tokens per second), "
                      "KV-cache bytes per token and decode agreement")
    extrapolation: bool = _f(False, "after training: val_loss_x1/x2/x4, the same validation targets scored "
                             "with 1, 2 and 4 times the training context before them (text data only); off by "
                             "default (its longer windows cost more than the regular evaluation): "
                             "ablations/position.toml turns it on")
    probes: list = field(default_factory=list, metadata={
        "doc": "after training: accuracy on these synthetic tasks (dataset names, e.g. [\"mqar\"]; parameters "
               "from [dataset.<name>]; abl.data.tasks), recorded as probe_<name>_accuracy, ..."})


SECTIONS: dict[str, type] = {
    "experiment": ExperimentConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "data": DataConfig,
    "eval": EvalConfig,
}


def section_params(cls) -> dict[str, Param]:
    out = {}
    for f in dataclasses.fields(cls):
        md = f.metadata
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc,operator]
        typ = {"int": int, "float": float, "str": str, "bool": bool, "list": list}.get(
            f.type if isinstance(f.type, str) else f.type.__name__, None
        )
        out[f.name] = Param(default=default, type=typ, doc=md.get("doc", ""),
                            choices=md.get("choices"), min=md.get("min"), max=md.get("max"))
    return out


@dataclass
class Cell:
    """One fully resolved training run."""

    config: dict[str, Any]
    run_id: str
    experiment: ExperimentConfig
    model: ModelConfig
    train: TrainConfig
    data: DataConfig
    seed: int
    # axis -> {"name": ..., "params": {...}}; plus "layer_mixers": one such spec per
    # layer when model.layer_pattern is set
    components: dict[str, Any]
    varied: dict[str, Any]  # grid path -> value for this cell
    eval: EvalConfig = field(default_factory=EvalConfig)
    # the grid's label of the cell (abl.grid.labels.grid_label of ``varied``), set where the cell is made
    label: str = "base"
    # what the grid knew, recorded with the run so no reader re-reads the grid file: the swept paths in the
    # file's order, and the cell's 0-based position among the file's points in the order ``abl run``
    # expands them (itertools.product over the axes, the last fastest; excluded points keep their place)
    grid_paths: list[str] = field(default_factory=list)
    grid_index: int | None = None

    def grid_record(self, grid_file: str) -> dict[str, Any]:
        """What the grid knew about this cell, as meta.json's ``grid`` object (abl.store ingests it)."""
        return {"file": grid_file, "paths": list(self.grid_paths), "index": self.grid_index,
                "varied": dict(self.varied)}

    @property
    def cell_key(self) -> str:
        """Identifies the cell across seeds (the run_id without the seed)."""
        cfg = canonical_config(self.config)
        cfg.pop("seed", None)
        return config_hash(cfg)

    def resize(self, model: ModelConfig, components: dict[str, Any], matched: dict[str, Any]) -> None:
        """Take a budget-matched model (``train.match``); the config and run id follow."""
        self.model, self.components = model, components
        self.config["model"] = stored_model(model)
        self.config["components"] = stored_components(components)
        self.config["matched"] = matched
        self.run_id = run_id_of(self.config)


@dataclass
class Grid:
    path: str
    raw: dict[str, Any]
    cells: list[Cell]
    grid_paths: list[str]
    notes: list[str] = field(default_factory=list)  # what loading changed, for the commands to say


# [model] keys added after runs were stored: left out of the hashed config at their defaults
MODEL_KEYS_LEFT_OUT_AT_DEFAULT = ("recipe", "logit_scale", "z_loss", "logit_softcap", "embed_scale")


def stored_model(model: ModelConfig) -> dict[str, Any]:
    """``[model]`` as stored and hashed; the keys of ``MODEL_KEYS_LEFT_OUT_AT_DEFAULT`` left out at their
    defaults, so the run ids of cells from before they existed stay the same."""
    out = {f.name: getattr(model, f.name) for f in dataclasses.fields(model)}  # asdict, without its recursion:
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}  # every field is a plain scalar
    for key in MODEL_KEYS_LEFT_OUT_AT_DEFAULT:
        if out[key] == defaults[key]:
            del out[key]
    return out


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def config_hash(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- the resolved config's two shapes
#
# A resolved config (Cell.config, a run folder's config.json) names each component once, where the
# grid file names it: ``model.norm = "rmsnorm"``; ``components.norm`` holds only its resolved
# ``params``, and ``"format": CONFIG_FORMAT`` marks the shape. Configs written before format 2
# named the component twice (``components.norm = {"name": "rmsnorm", "params": ...}``).
#
# Run ids hash the canonical shape, which is that older one: a store finds its completed cells by
# run id, so the same cell must hash the same as before (tests/test_run_ids_stable.py pins every
# shipped grid). The store's ``runs.config`` keeps the canonical shape too, so a database holds one
# shape whichever version wrote its rows, and its JSON paths ($.components.norm.name) stay valid.

CONFIG_FORMAT = 2


def selector(axis: str) -> tuple[str, str]:
    """The (section, key) that names the component of ``axis``: ("model", "norm")."""
    section, key = AXES[axis][0].split(".")
    return section, key


def stored_components(components: dict[str, Any]) -> dict[str, Any]:
    """A cell's ``components`` (axis -> {"name", "params"}) as the resolved config stores them:
    the axes' names left out (their sections say them); per-layer mixers kept whole."""
    return {axis: ({"params": spec["params"]} if axis in AXES else spec) for axis, spec in components.items()}


def config_format(config: dict[str, Any]) -> int:
    """1: every component named twice (before format 2); 2: named once. Raises ConfigError otherwise."""
    fmt = config.get("format", 1)
    if fmt not in (1, CONFIG_FORMAT):
        raise ConfigError(f"config format {fmt!r} is not one this abl reads (1 or {CONFIG_FORMAT}); "
                          "it was written by another version of abl")
    return fmt


def compact_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (either shape) in the stored shape: each component named once. Raises ConfigError
    where an old config's two names for a component disagree."""
    if config_format(config) == CONFIG_FORMAT:
        return config
    out = {k: v for k, v in config.items() if k != "components"}
    components: dict[str, Any] = {}
    for axis, spec in (config.get("components") or {}).items():
        if axis in AXES:
            section, key = selector(axis)
            named = (config.get(section) or {}).get(key)
            if spec.get("name") != named:
                raise ConfigError(f"config names {axis} {spec.get('name')!r} in components but "
                                  f"{section}.{key} = {named!r}")
            spec = {"params": spec.get("params", {})}
        components[axis] = spec
    out["components"] = components
    out["format"] = CONFIG_FORMAT
    return out


# [train] keys that say how long abl waits on a cell, not what it trains: never hashed, never stored
TRAIN_KEYS_NOT_HASHED = ("timeout_s", "stall_warning_s")


def canonical_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (either shape) in the shape run ids hash and the store keeps (see above); the keys of
    ``TRAIN_KEYS_NOT_HASHED`` left out."""
    if config_format(config) == 1:
        return config
    out = {k: v for k, v in config.items() if k not in ("format", "components")}
    if isinstance(out.get("train"), dict) and any(k in out["train"] for k in TRAIN_KEYS_NOT_HASHED):
        out["train"] = {k: v for k, v in out["train"].items() if k not in TRAIN_KEYS_NOT_HASHED}
    components: dict[str, Any] = {}
    for axis, spec in (config.get("components") or {}).items():
        if axis in AXES:
            section, key = selector(axis)
            spec = {"name": (config.get(section) or {}).get(key), "params": spec.get("params", {})}
        components[axis] = spec
    out["components"] = components
    return out


def run_id_of(config: dict[str, Any]) -> str:
    """A resolved config's run id: the hash of its canonical shape (either shape gives the same)."""
    return config_hash(canonical_config(config))



def cell_from_config(config: dict[str, Any], registry: Registry) -> Cell:
    """The Cell of a stored resolved config (a run folder's config.json, either shape; a store's
    ``runs.config``), built from it as it stands: it was validated when its grid expanded, so it is
    not validated again. Checks only that it is a format this abl reads and that every component it
    names is registered (a plugin missing where the worker runs). Raises ConfigError."""
    config = compact_config(config)
    # a config stored before [eval] existed ran every evaluation
    every_eval = {f.name: True for f in dataclasses.fields(EvalConfig) if isinstance(f.default, bool)}
    try:
        sections: dict[str, Any] = {
            "experiment": ExperimentConfig(name=config["experiment"], seeds=[config["seed"]]),
            "model": ModelConfig(**config["model"]),
            "train": TrainConfig(**config["train"]),
            "data": DataConfig(**config["data"]),
            "eval": EvalConfig(**config.get("eval", every_eval)),
        }
    except (KeyError, TypeError) as exc:  # a missing table, or a key this version's schema lacks
        raise ConfigError(f"not a resolved cell config of this abl version: {type(exc).__name__}: {exc}") from None
    stored = config.get("components") or {}
    components: dict[str, Any] = {}
    errs: list[str] = []
    for axis in AXES:
        section, key = selector(axis)
        name = getattr(sections[section], key)
        try:
            comp = registry.get(axis, name)
        except RegistryError as exc:
            errs.append(f"{section}.{key}: {exc}")
            continue
        spec = stored.get(axis)
        if spec is None:  # an axis newer than the config: its component's defaults, as a fresh grid resolves it
            params, e = comp.resolve_params({}, f"{axis}.{name}")
            errs += e
        else:
            params = dict(spec.get("params") or {})
        components[axis] = {"name": name, "params": params}
    if stored.get("layer_mixers"):
        for spec in stored["layer_mixers"]:
            try:
                registry.get("mixer", spec["name"])
            except RegistryError as exc:
                errs.append(f"model.layer_pattern: {exc}")
        components["layer_mixers"] = [dict(spec) for spec in stored["layer_mixers"]]
    if errs:
        raise ConfigError(list(dict.fromkeys(errs)))
    return Cell(config=config, run_id=run_id_of(config), experiment=sections["experiment"],
                model=sections["model"], train=sections["train"], data=sections["data"], seed=config["seed"],
                components=components, varied={}, eval=sections["eval"])


def solved_paths(config: dict[str, Any], registry: Registry | None = None) -> set[str]:
    """The setting paths ``train.match`` solved in this resolved config (not chosen by anyone):
    ``model.n_layers``, or the FFN's width knob and its ``multiple_of``, as ``ffn.<name>.<param>``.

    The knob is what the FFN declared in ``registry`` (default: the plugins' registry). One rule for
    every layer: labels (abl.grid.labels) leave these out, and the analysis (abl.analysis.verdicts)
    counts them as part of the level whose budget they were solved for.
    """
    config = canonical_config(config)  # either stored shape: the FFN's name is read beside its params
    matched = config.get("matched") or {}
    if matched.get("by") == "n_layers":
        return {"model.n_layers"}
    ffn = (config.get("components") or {}).get("ffn") or {}
    params = ffn.get("params") or {}
    if not matched or not params:
        return set()
    if registry is None:
        from .plugin_manager import get_registry

        registry = get_registry()
    knob = width_param(registry, ffn.get("name"))
    return {f"ffn.{ffn.get('name')}.{p}" for p in (knob, "multiple_of") if p and p in params}


def width_param(registry: Registry, ffn: Any) -> str | None:
    """The width knob the FFN ``ffn`` declared when it registered (``register(..., width=...)``),
    or None: an unknown FFN, or one without a knob."""
    comp = registry.components.get(("ffn", ffn)) if isinstance(ffn, str) else None
    return comp.width if comp is not None else None
