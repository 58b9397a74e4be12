"""Grid files: TOML -> typed configs -> validated cells with stable run ids.

A grid file has the tables

- ``[experiment]``: name, seeds, description;
- ``[model]``, ``[train]``, ``[data]``, ``[eval]``: the flat fields of the
  dataclasses below. The component on each axis is chosen by name
  (``model.norm``, ``model.mixer``, ``train.precision``, ``data.dataset`` ...);
  ``[eval]`` switches the post-training evaluations (abl.run.evaluations) on or off;
- one table per axis holding parameters per component name, e.g.
  ``[norm.rmsnorm] eps = 1e-6`` or ``[mixer.mha] n_kv_heads = 2``; they apply
  only when that component is selected;
- ``[grid]``: dotted config paths mapped to lists of values; the cells are
  the cartesian product of those lists x seeds. ``exclude`` is an optional
  list of tables; a cell matching every entry of one of them is dropped.

Every problem found is collected and reported together, before any training.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from .registry import AXES, Param, Registry, RegistryError


class ConfigError(Exception):
    """A user error in a grid file or override; ``messages`` lists them all."""

    def __init__(self, messages: list[str] | str):
        self.messages = [messages] if isinstance(messages, str) else list(messages)
        super().__init__("\n".join(self.messages))


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


@dataclass
class ModelConfig:
    d_model: int = _f(128, "residual stream width", min=1)
    n_layers: int = _f(4, "number of blocks", min=1)
    n_heads: int = _f(4, "attention heads (query heads)", min=1)
    head_dim: int = _f(0, "width of each attention head's q, k and v; 0 = d_model // n_heads. The attention "
                       "mixers project d_model to n_heads * head_dim and back", min=0)
    context: int = _f(128, "training context length in tokens", min=2)
    vocab_size: int = _f(0, "0 = take it from the dataset", min=0)
    tie_embeddings: bool = _f(True, "share the token embedding with the LM head")
    init_std: float = _f(0.0, "std of the normal init of linear and embedding weights; 0 = 1/sqrt(d_model) "
                         "(fan-in; see README 'Default initialisation')", min=0.0)
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
    batch_size: int = _f(16, "sequences per step", min=1)
    lr: float = _f(3e-3, "peak learning rate", min=0.0)
    min_lr_ratio: float = _f(0.1, "cosine decays to lr * min_lr_ratio", min=0.0, max=1.0)
    warmup_steps: int = _f(20, "linear warm-up steps", min=0)
    weight_decay: float = _f(0.1, "AdamW decoupled weight decay (matrices only)", min=0.0)
    beta1: float = _f(0.9, "AdamW beta1", min=0.0, max=1.0)
    beta2: float = _f(0.95, "AdamW beta2", min=0.0, max=1.0)
    adam_eps: float = _f(1e-8, "AdamW epsilon", min=0.0)
    grad_clip: float = _f(1.0, "global grad-norm clip; 0 disables", min=0.0)
    eval_every: int = _f(50, "evaluate on the validation split every N steps (and at the end)", min=1)
    eval_batches: int = _f(8, "validation batches per evaluation", min=1)
    precision: str = _f("fp32", "precision component")
    device: str = _f("auto", "auto, cpu, cuda or cuda:N", choices=None)
    kernels: str = _f("auto", "auto (triton on CUDA, torch elsewhere), triton or torch",
                      choices=("auto", "triton", "torch"))
    threads: int = _f(0, "torch CPU threads; 0 = torch's default", min=0)
    diverge_loss: float = _f(1e3, "a train loss above this (or non-finite) stops the cell as diverged", min=0.0)
    checkpoint_every: int = _f(0, "save a checkpoint every N steps (0 = never); a killed cell resumes "
                               "from its last checkpoint", min=0)
    match: str = _f("none", "fair budgets: resize cells so non-embedding params ('params') or training "
                    "FLOPs per token ('flops') match the grid's first cell within 1%",
                    choices=("none", "params", "flops"))
    match_by: str = _f("ffn", "what train.match adjusts: the FFN width ('ffn') or the depth ('n_layers')",
                       choices=("ffn", "n_layers"))
    devices: int = _f(1, "processes per cell: > 1 trains one cell with DDP under torchrun "
                      "(one GPU each on CUDA, gloo on CPU); batch_size is the global batch", min=1)
    deterministic: bool = _f(False, "torch.use_deterministic_algorithms (slower; recorded with the run)")
    lr_sweep: list = field(default_factory=list, metadata={
        "doc": "fair learning rates (abl.run.lr_sweep): train every cell at each of these peak LRs on the first "
               "seed, then each variant at its own best LR on the other seeds; empty = train.lr"})
    compile: bool = _f(False, "torch.compile the model and its loss for the training steps (compile time "
                       "is recorded apart as compile_s, never in tokens/s; evaluation stays eager)")


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


@dataclass
class EvalConfig:
    """One switch per post-training evaluation (abl.run.evaluations); off records none of its metrics."""

    decode: bool = _f(True, "after training: cached greedy decoding speed (prefill/decode tokens per second), "
                      "KV-cache bytes per token and decode agreement")
    extrapolation: bool = _f(False, "after training: val_loss_x2/x4, on windows of 2 and 4 times the "
                             "training context (1x is val_loss); off by default (its longer windows cost more "
                             "than the regular evaluation): ablations/position.toml turns it on")
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

    @property
    def label(self) -> str:
        return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in self.varied.items()) or "base"

    @property
    def cell_key(self) -> str:
        """Identifies the cell across seeds (the run_id without the seed)."""
        cfg = dict(self.config)
        cfg.pop("seed", None)
        return config_hash(cfg)

    def resize(self, model: ModelConfig, components: dict[str, Any], matched: dict[str, Any]) -> None:
        """Take a budget-matched model (``train.match``); the config and run id follow."""
        self.model, self.components = model, components
        self.config["model"] = dataclasses.asdict(model)
        self.config["components"] = components
        self.config["matched"] = matched
        self.run_id = config_hash(self.config)


@dataclass
class Grid:
    path: str
    raw: dict[str, Any]
    cells: list[Cell]
    grid_paths: list[str]

def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def config_hash(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:16]
