"""Fair budgets: ``train.match`` resizes cells so they cost what the grid's first cell costs.

- ``train.match = "params"``: non-embedding parameters match;
- ``train.match = "flops"``: training FLOPs per token match (as executed, from
  the cost model, so attention's T^2 terms and MoE active experts count);
- ``train.match_by = "ffn"`` (default) adjusts the FFN's width knob: the float
  parameter the FFN declared with ``register(..., width="<param>")`` (the dense
  and gated FFNs' ``ratio``, an MoE's ``expert_ratio``); ``multiple_of``
  rounding is set to 1 so the width can move in steps of one unit.
  ``"n_layers"`` adjusts the depth instead.

The reference is the first cell of the grid; every other cell must land
within 1% of it or the grid is rejected before training. The adjusted values
live in the cell's resolved config (so in its run id) and under
``config["matched"]``.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from ..contracts.config import width_param
from ..contracts.registry import Registry

TOLERANCE = 0.01


def _measure(cell, registry: Registry, model, components, what: str, vocab: int) -> float:
    from .costmodel import predict_model

    pred = predict_model(dataclasses.replace(model, vocab_size=vocab), components, registry,
                         batch_size=cell.train.batch_size)
    return float(pred["n_params_non_embedding"] if what == "params" else pred["train_flops_per_token"])


def match_cells(cells: list, registry: Registry) -> list[str]:
    """Resize ``cells`` in place (run ids recomputed). Returns error messages."""
    from .costmodel import dataset_vocab_size

    first = cells[0]
    what, by = first.train.match, first.train.match_by
    if what == "none":
        return []
    vocab = dataset_vocab_size(first, registry)
    target = _measure(first, registry, first.model, first.components, what, vocab)
    errs: list[str] = []
    done: dict[str, tuple[Any, Any, float]] = {}
    first_key = first.cell_key
    for cell in cells:
        key = cell.cell_key
        if key == first_key:
            cell.resize(cell.model, cell.components, {"by": by, "what": what, "target": target, "achieved": target})
            continue
        if key not in done:  # each cell at its own vocabulary (its tokenizer's): the LM head's FLOPs follow it
            done[key] = _solve(cell, registry, what, by, target, dataset_vocab_size(cell, registry), errs)
        model, components, achieved = done[key]
        if model is None:
            continue
        cell.resize(model, components, {"by": by, "what": what, "target": target, "achieved": achieved})
    return list(dict.fromkeys(errs))


def _solve(cell, registry, what, by, target, vocab, errs) -> tuple[Any, Any, float]:
    label = cell.label
    components = copy.deepcopy(cell.components)
    model = dataclasses.replace(cell.model)
    if by == "n_layers":
        best: tuple[Any, dict, float] | None = None
        for n in range(1, 4 * cell.model.n_layers + 9):
            trial = dataclasses.replace(model, n_layers=n)
            comps = _tile_layers(components, trial)
            value = _measure(cell, registry, trial, comps, what, vocab)
            if best is None or abs(value - target) < abs(best[2] - target):
                best = (trial, comps, value)
        assert best is not None
        model, components, value = best
    else:
        ffn = components["ffn"]
        knob = width_param(registry, ffn["name"])
        if knob is None:
            errs.append(f"cell [{label}]: train.match_by = 'ffn' needs an ffn that declares its width knob "
                        f"(register(..., width='<param>')); ffn {ffn['name']!r} declares none "
                        f"(use train.match_by = 'n_layers')")
            return None, None, 0.0
        if "multiple_of" in ffn["params"]:
            ffn["params"]["multiple_of"] = 1
        lo, hi = 1e-3, 256.0
        closest: tuple[float, float] | None = None
        for _ in range(60):  # the cost grows with the width: bisect, keep the closest
            mid = (lo + hi) / 2
            ffn["params"][knob] = mid
            value = _measure(cell, registry, model, components, what, vocab)
            if closest is None or abs(value - target) < abs(closest[1] - target):
                closest = (mid, value)
            if value < target:
                lo = mid
            else:
                hi = mid
        assert closest is not None
        ffn["params"][knob] = round(closest[0], 6)
        value = _measure(cell, registry, model, components, what, vocab)
    if abs(value - target) > TOLERANCE * target:
        errs.append(f"cell [{label}]: train.match = {what!r} by {by!r} gets within "
                    f"{abs(value - target) / target:.1%} of the first cell, more than 1%")
    return model, components, value


def _tile_layers(components: dict, model) -> dict:
    if "layer_mixers" not in components:
        return components
    by_name = {s["name"]: s for s in components["layer_mixers"]}
    out = dict(components)
    out["layer_mixers"] = [by_name[n] for n in model.layer_mixer_names()]
    return out
