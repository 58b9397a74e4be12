"""A ladder of model sizes in a grid file: ``[ladder]`` names the sizes, each size's token budget and its lr.

```toml
[ladder]
sizes = [{ d_model = 64, n_layers = 2 }, { d_model = 96, n_layers = 3 }, { d_model = 128, n_layers = 4 }]
tokens_per_param = 20     # each size trains on 20 tokens per non-embedding parameter
lr = "transfer"           # the grid's train.lr at every size (tuned on the smallest, transferred)
```

- ``sizes``: tables of ``[model]`` settings, one per size, smallest first. Their
  keys vary together (a tied axis): each point of the grid's other axes is
  trained at every size. A size table may also hold ``lr`` when the rule is
  ``"per-size"``.
- ``tokens_per_param``: the token budget rule. Each size's ``train.steps`` is
  ceil(ratio * N / (batch_size * context)), N its non-embedding parameters as
  the cost model counts them (exact; abl.model.costmodel); Hoffmann et al.
  2022 (arXiv:2203.15556, sec. 3 and table 3) find about 20 tokens per
  parameter compute-optimal. Without it every size trains ``train.steps``
  steps (the same tokens at every size), and the grid says so.
- ``lr``: ``"transfer"`` (default): the grid's lr at every size, i.e. tuned on
  one size and transferred unchanged; ``"per-size"``: each size table's ``lr``.

abl.analysis.ladder reads the runs back (``abl ladder``): per pair of variants, the verdict at each
size and whether the ordering holds as the model grows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..contracts.registry import Registry

LR_RULES = ("transfer", "per-size")
KEYS = ("sizes", "tokens_per_param", "lr")


@dataclass
class Ladder:
    sizes: list[dict[str, Any]]  # [model] settings per size, smallest first
    tokens_per_param: float | None = None
    lr: str = "transfer"
    lrs: list[float] = field(default_factory=list)  # per size, with lr = "per-size"

    @property
    def paths(self) -> list[str]:
        """The model paths the sizes set, in the first size's order (they vary together)."""
        return [f"model.{k}" for k in self.sizes[0]]

    @property
    def axis(self) -> str:
        """The one path that names the size axis: the first key whose value differs between every two sizes.
        The analysis takes it as one factor (the others vary with it and would make the model deficient)."""
        return next(f"model.{k}" for k in self.sizes[0] if len({repr(s[k]) for s in self.sizes}) == len(self.sizes))

    def rule(self) -> str:
        tokens = (f"{self.tokens_per_param:g} tokens per non-embedding parameter" if self.tokens_per_param
                  else "the same train.steps at every size")
        lr = "the grid's lr at every size (transferred)" if self.lr == "transfer" else "an lr per size, as given"
        return f"{len(self.sizes)} sizes; token budget: {tokens}; lr: {lr}"


def parse_ladder(raw: dict, registry: Registry) -> tuple[Ladder | None, list[str]]:
    """The grid file's ``[ladder]`` (None without one) and what is wrong with it."""
    from .validation import known_path

    table = raw.get("ladder")
    if table is None:
        return None, []
    if not isinstance(table, dict):
        return None, ["[ladder] must be a table with sizes = [{ d_model = ..., n_layers = ... }, ...]"]
    errs = [f"ladder: unknown key {k!r} (keys: {', '.join(KEYS)})" for k in table if k not in KEYS]
    sizes = table.get("sizes")
    if not isinstance(sizes, list) or len(sizes) < 2 or not all(isinstance(s, dict) and s for s in sizes):
        return None, errs + ["ladder.sizes must be a list of two or more tables of [model] settings"]
    rule = table.get("lr", "transfer")
    if rule not in LR_RULES:
        errs.append(f"ladder.lr must be one of {', '.join(repr(r) for r in LR_RULES)}, got {rule!r}")
    lrs: list[float] = []
    first = [k for k in sizes[0] if k != "lr"]
    models = []
    for i, size in enumerate(sizes):
        keys = [k for k in size if k != "lr"]
        if keys != first and set(keys) != set(first):
            errs.append(f"ladder.sizes[{i}] sets {sorted(keys)}, the first size {sorted(first)}: every size must "
                        "set the same [model] keys")
        for k in keys:
            msg = known_path(f"model.{k}", registry)
            if msg:
                errs.append(f"ladder.sizes[{i}]: {msg}")
        if rule == "per-size":
            lr = size.get("lr")
            if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not lr > 0:
                errs.append(f"ladder.sizes[{i}] needs lr > 0 with lr = \"per-size\"")
            else:
                lrs.append(float(lr))
        elif "lr" in size:
            errs.append(f"ladder.sizes[{i}] sets lr, but ladder.lr is {rule!r}: use lr = \"per-size\"")
        models.append({k: size[k] for k in keys})
    if len({tuple(sorted(m.items(), key=str)) for m in models}) < len(models):
        errs.append("ladder.sizes has two identical sizes")
    elif not errs and not any(len({repr(m[k]) for m in models}) == len(models) for k in first):
        errs.append("ladder.sizes must differ in one key at every size (e.g. a d_model that grows): that key "
                    "names the size axis")
    tpp = table.get("tokens_per_param")
    if tpp is not None and (isinstance(tpp, bool) or not isinstance(tpp, (int, float)) or not tpp > 0
                            or not math.isfinite(tpp)):
        errs.append(f"ladder.tokens_per_param must be a positive number, got {tpp!r}")
    if any(p in (raw.get("grid") or {}) for p in (f"model.{k}" for k in first)):
        errs.append("the grid sweeps a path the ladder's sizes set; sweep it in ladder.sizes instead")
    if errs:
        return None, errs
    return Ladder(models, float(tpp) if tpp is not None else None, rule, lrs), []


def size_values(ladder: Ladder, i: int) -> dict[str, Any]:
    """The varied settings of size ``i``: its model paths (what labels and the analysis read)."""
    return {f"model.{k}": v for k, v in ladder.sizes[i].items()}


def apply_size(cell_raw: dict, ladder: Ladder, i: int) -> dict:
    """``cell_raw`` at size ``i``: its [model] settings, and its lr under the per-size rule."""
    out = dict(cell_raw)
    out["model"] = {**(cell_raw.get("model") or {}), **ladder.sizes[i]}
    if ladder.lr == "per-size":
        out["train"] = {**(cell_raw.get("train") or {}), "lr": ladder.lrs[i]}
    return out


def budget_steps(cell: Any, registry: Registry, tokens_per_param: float) -> int:
    """Steps that give ``cell`` ``tokens_per_param`` tokens per non-embedding parameter (at least 1)."""
    from ..model.costmodel import predict

    n = int(predict(cell, registry)["n_params_non_embedding"])
    tokens_per_step = int(cell.train.batch_size) * int(cell.model.context)
    return max(1, math.ceil(tokens_per_param * n / tokens_per_step))
