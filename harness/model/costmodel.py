"""Model-level cost prediction from the components' declared cost functions.

Every component declares the cost of ONE instance (``harness/contracts/cost.py``); this
module assembles the whole model the way ``abl.model.decoder.DecoderLM`` builds it:

    embedding + position + n_layers x (block + block.norms x norm + mixer + ffn)
              + final norm (when the block wants one) + LM head (unless tied)

and turns the per-instance figures into per-token and per-step predictions:

- parameters, exact (``n_params_non_embedding`` leaves out the token embedding
  and the LM head, as ``DecoderLM.n_params(non_embedding=True)`` does);
- forward and training FLOPs. As executed: forward x (1 + backward_factor) per
  component, which is what ``torch.utils.flop_counter`` sees for one training
  step. Useful (model FLOPs, for MFU): useful forward x (1 + min(backward_factor,
  2)), so recomputation counts as hardware FLOPs only (model vs hardware FLOPs:
  Korthikanti et al. 2022, arXiv:2205.05198; MFU: Chowdhery et al. 2022, PaLM,
  arXiv:2204.02311, App. B). The LM head's 2·D·V per token is included (the 6N
  rule of Kaplan et al. 2020, arXiv:2001.08361, sec. 2.1, leaves it out);
- activation memory saved for backward (Korthikanti et al. 2022, sec. 4.1), at the run's
  activation dtype (the precision policy's autocast dtype);
- decoding cache: KV bytes per token and fixed state bytes per sequence
  (keys and values per layer per token; Pope et al. 2022, "Efficiently Scaling
  Transformer Inference", arXiv:2211.05102);
- parameter, gradient and optimizer memory (mixed precision: Micikevicius et al.
  2018, arXiv:1710.03740, sec. 3.1) as abl
  trains: fp32 master weights, fp32 gradients, two fp32 AdamW moments. Under
  mixed precision the low-precision weight copies that autocast saves for
  backward (``torch.autocast`` caches the cast weight of each matmul) are counted too:
  4 + 4 + 8 + 2 = 18 bytes per parameter, the same total as the usual mixed-precision
  count of 2-byte weights, 12 bytes of fp32 master weights and Adam moments and
  4-byte gradients (ZeRO, Rajbhandari et al. 2020, arXiv:1910.02054, sec. 3.1,
  counts 16 with 2-byte gradients);
- the working memory of the precision policy's matmuls (``Precision.gemm_transient_bytes``:
  e.g. fp8's per-GEMM quantized and rescaled operand copies), the largest
  linear layer's, at the peak, where it coincides with the saved activations.

Nothing here names a variant. A component without a cost function is an error
that names it (``CostModelError``), except where the caller asks for the cell
to be measured instead (``predict(..., measure_missing=True)``,
abl.model.measuredcost).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, fields
from collections.abc import Iterator
from typing import Any

from ..contracts.cost import Cost
from ..contracts.registry import Registry, RegistryError

FP32_BYTES = 4
ADAM_STATES = 2  # AdamW keeps two running moments per parameter (Loshchilov & Hutter 2019, arXiv:1711.05101, alg. 2)

# Peak training memory: measured/predicted must lie in this band. Measured is
# ``peak_tensor_bytes`` (harness/model/memory.py: live tensor storages over one whole
# training step, on the torch reference path); predicted is ``train_peak_bytes``.
# Calibration (CPU, every cell of the seven shipped grids, one step each, and
# every built-in at the tests' tiny shapes): fp32 cells 1.01-1.04 (the residue
# is the batch, RNG and bookkeeping tensors), bf16/fp16 1.14 and fp8 (emulated)
# 1.16 (the reference norms, RoPE and loss upcast to fp32 copies that the model
# counts at the autocast width). The band leaves ~10% either side. fp8 since its
# GEMMs' working memory is counted (Precision.gemm_transient_bytes), CPU, emulated
# and with the real torch._scaled_mm path forced alike: the precision grid's fp8
# cells 1.09; the selftest's GPU training cell (d_model 256, 4 layers, context 256,
# batch 16) 1.125 real / 1.140 emulated (1.345 before), real with compute = fp32
# 0.952 (tests/test_fp8_memory.py).
MEMORY_BAND = (0.9, 1.25)

# (predicted key, measured metric name, agreement required) - the table.
# A float is a relative tolerance; "exact" means equal; a (lo, hi) tuple bounds
# measured / predicted.
CHECKS: list[tuple[str, str, Any]] = [
    ("n_params", "n_params", "exact"),
    ("n_params_non_embedding", "n_params_non_embedding", "exact"),
    ("flops_per_step", "flops_per_step_measured", 0.05),
    ("train_peak_bytes", "peak_tensor_bytes", MEMORY_BAND),
]


class CostModelError(RegistryError):
    """A component has no cost function, or its cost function misbehaves (a user error)."""


@dataclass
class Part:
    """One kind of instance in the model: its cost and how many the model has."""

    name: str  # e.g. "layers 0-3: mixer 'mha'"
    axis: str  # norm, block, position, mixer, ffn, or "skeleton"
    component: str
    count: int
    cost: Cost

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "axis": self.axis, "component": self.component, "count": self.count,
                **{f.name: getattr(self.cost, f.name) for f in fields(self.cost)}}


def component_cost(registry: Registry, axis: str, spec: dict[str, Any], *args) -> Cost:
    """Call the registered cost function of ``spec`` ({"name", "params"}) on ``args``."""
    comp = registry.get(axis, spec["name"])
    if comp.cost is None:
        raise CostModelError(
            f"{axis} {spec['name']!r} (plugin {comp.plugin!r}, {comp.package} {comp.version}) declares no "
            f"cost function, so its cost cannot be predicted; pass cost=... to register() "
            f"(docs/plugins.md, 'Costs': the signature and conventions), or use abl cost, which "
            f"measures such a cell instead")
    try:
        out = registry.call_with_position(comp.cost, *args, **dict(spec.get("params") or {}))
    except Exception as exc:  # noqa: BLE001 - name the component whatever went wrong
        raise CostModelError(f"the cost function of {axis} {spec['name']!r} (plugin {comp.plugin!r}) "
                             f"failed: {exc!r}") from exc
    if not isinstance(out, Cost):
        raise CostModelError(f"the cost function of {axis} {spec['name']!r} (plugin {comp.plugin!r}) "
                             f"returned {type(out).__name__}, not a harness.cost.Cost")
    return out


def block_wants_final_norm(registry: Registry, model, spec: dict[str, Any]) -> bool:
    """The block's ``final_norm`` flag: a class attribute, or read off one block built with stubs."""
    factory = registry.get("block", spec["name"]).factory
    if isinstance(factory, type):
        return bool(getattr(factory, "final_norm", True))
    import torch.nn as nn

    block = factory(model, lambda dim: nn.Identity(), lambda: nn.Identity(), lambda: nn.Identity(),
                    **dict(spec.get("params") or {}))
    return bool(getattr(block, "final_norm", True))


def _spec_key(spec: dict[str, Any]) -> str:
    return json.dumps([spec["name"], spec.get("params") or {}], sort_keys=True, default=str)


def _layer_ranges(idx: list[int]) -> str:
    if not idx:
        return "none"
    runs, start, prev = [], idx[0], idx[0]
    for i in idx[1:] + [None]:  # type: ignore[list-item]
        if i is not None and i == prev + 1:
            prev = i
            continue
        runs.append(f"{start}" if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return "layer " + ",".join(runs) if len(idx) == 1 else "layers " + ",".join(runs)


def model_parts(model, components: dict[str, Any], registry: Registry) -> list[Part]:
    """Every kind of instance the model builds, with its cost (``model.vocab_size`` must be set)."""
    if model.vocab_size <= 0:
        raise CostModelError("model.vocab_size must be known to predict costs (0 = from the dataset; "
                             "use predict(), which resolves it)")
    d, v, n = model.d_model, model.vocab_size, model.n_layers
    parts: list[Part] = []
    norm_spec = components["norm"]
    norm_cost = component_cost(registry, "norm", norm_spec, d)
    block_spec = components["block"]
    block_cost = component_cost(registry, "block", block_spec, model)
    parts.append(Part("token embedding", "skeleton", "embedding", 1, Cost(params=v * d)))
    pos_spec = components["position"]
    parts.append(Part(f"position {pos_spec['name']!r}", "position", pos_spec["name"], 1,
                      component_cost(registry, "position", pos_spec, model)))
    parts.append(Part(f"layers 0-{n - 1}: block {block_spec['name']!r}" if n > 1 else
                      f"layer 0: block {block_spec['name']!r}", "block", block_spec["name"], n, block_cost))
    if block_cost.norms:
        parts.append(Part(f"{block_cost.norms} x {n} norms {norm_spec['name']!r} in blocks", "norm",
                          norm_spec["name"], block_cost.norms * n, norm_cost))
    # mixers: one spec per layer for hybrids (layer_pattern), else model.mixer everywhere
    layer_specs = components.get("layer_mixers") or [components["mixer"]] * n
    if len(layer_specs) != n:
        raise CostModelError(f"components['layer_mixers'] has {len(layer_specs)} entries for {n} layers")
    groups: dict[str, list[int]] = {}
    for i, spec in enumerate(layer_specs):
        groups.setdefault(_spec_key(spec), []).append(i)
    for key, idx in groups.items():
        spec = layer_specs[idx[0]]
        parts.append(Part(f"{_layer_ranges(idx)}: mixer {spec['name']!r}", "mixer", spec["name"], len(idx),
                          component_cost(registry, "mixer", spec, model)))
    ffn_spec = components["ffn"]
    parts.append(Part(f"layers 0-{n - 1}: ffn {ffn_spec['name']!r}" if n > 1 else
                      f"layer 0: ffn {ffn_spec['name']!r}", "ffn", ffn_spec["name"], n,
                      component_cost(registry, "ffn", ffn_spec, model)))
    if block_wants_final_norm(registry, model, block_spec):
        parts.append(Part(f"final norm {norm_spec['name']!r}", "norm", norm_spec["name"], 1, norm_cost))
    # LM head: its matmul always runs; its weight is the embedding's when tied.
    # It saves its input (D) for backward; the loss's log-softmax output is
    # saved in fp32 (logits.float()), V per token - added as bytes in predict_model.
    parts.append(Part("LM head" + (" (tied to the embedding)" if model.tie_embeddings else ""), "skeleton",
                      "lm_head", 1, Cost(params=0 if model.tie_embeddings else v * d,
                                         flops_per_token=2.0 * d * v, activation_elements_per_token=d)))
    return parts


def predict_model(model, components: dict[str, Any], registry: Registry, *, batch_size: int,
                  activation_bytes: int = FP32_BYTES) -> dict[str, Any]:
    """Predictions for a model config with a known vocab size (cheap: nothing is built).

    ``components`` is a cell's resolved ``components`` dict. Use this to size
    models (e.g. budget matching); ``predict`` resolves the vocab size and the
    activation dtype for a cell.
    """
    parts = model_parts(model, components, registry)
    d, v = model.d_model, model.vocab_size
    tokens = batch_size * model.context
    tot = {k: 0.0 for k in ("params", "fwd", "useful_fwd", "train", "useful_train", "act", "kv", "state", "once",
                            "train_once", "act_once")}
    for p in parts:
        c, k = p.cost, p.count
        tot["params"] += c.params * k
        tot["fwd"] += c.flops_per_token * k
        tot["useful_fwd"] += c.useful * k
        tot["train"] += c.flops_per_token * (1 + c.backward_factor) * k
        tot["useful_train"] += c.useful * (1 + min(c.backward_factor, 2.0)) * k
        tot["act"] += c.activation_elements_per_token * k
        tot["kv"] += c.state_elements_per_token * k
        tot["state"] += c.state_elements_per_sequence * k
        tot["once"] += c.flops_per_forward * k  # once per forward, for the whole batch
        tot["train_once"] += c.flops_per_forward * (1 + c.backward_factor) * k
        tot["act_once"] += c.activation_elements_per_forward * k
    n_params = int(round(tot["params"]))
    n_embedding = v * d * (1 if model.tie_embeddings else 2)
    act_per_token = tot["act"] * activation_bytes + v * FP32_BYTES  # + fp32 log-softmax output of the loss
    static = {
        "param_bytes": FP32_BYTES * n_params,
        "grad_bytes": FP32_BYTES * n_params,
        "optimizer_bytes": ADAM_STATES * FP32_BYTES * n_params,
        "autocast_copy_bytes": activation_bytes * n_params if activation_bytes < FP32_BYTES else 0,
    }
    static_bytes = sum(static.values())
    # the loss's backward forms the fp32 gradient of the logits while the saved
    # log-softmax output is still alive: one more V-wide fp32 row per token;
    # a component may declare a larger transient of its own backward
    loss_backward = v * FP32_BYTES * tokens
    transient = max([p.cost.transient_elements_per_token * activation_bytes * tokens for p in parts] + [0.0])
    # the precision policy's matmul working memory (fp8: quantized operand copies). Its worst is in a
    # layer's backward, while the saved activations are live (not with the loss's transient). By then
    # the previous step's gradients are gone (abl.train.loop zero-grads, set_to_none, after the forward)
    # and the new ones appear as the backward proceeds: every layer repeats the same linears, so the
    # largest one's first backward is the last layer's, before the other n - 1 layers have gradients.
    gemm = precision_gemm_transient_bytes(model, components, registry, tokens)
    grads_not_yet = FP32_BYTES * (n_params - n_embedding) * (model.n_layers - 1) / model.n_layers
    gemm_at_peak = max(0.0, gemm - grads_not_yet)
    kv_per_token = tot["kv"] * activation_bytes
    state_per_seq = tot["state"] * activation_bytes
    return {
        "vocab_size": v,
        "tokens_per_step": tokens,
        "activation_dtype_bytes": activation_bytes,
        "n_params": n_params,
        "n_params_embedding": n_embedding,
        "n_params_non_embedding": n_params - n_embedding,
        "flops_per_token": tot["fwd"],
        "useful_flops_per_token": tot["useful_fwd"],
        "train_flops_per_token": tot["train"],
        "useful_train_flops_per_token": tot["useful_train"],
        "flops_6n_per_token": 6.0 * (n_params - n_embedding),
        "forward_flops_per_step": tot["fwd"] * tokens + tot["once"],
        "flops_per_step": tot["train"] * tokens + tot["train_once"],
        "useful_flops_per_step": tot["useful_train"] * tokens + tot["train_once"],
        "activation_bytes_per_token": act_per_token,
        "activation_bytes_per_step": act_per_token * tokens + tot["act_once"] * activation_bytes,
        "kv_cache_bytes_per_token": kv_per_token,
        "state_bytes_per_sequence": state_per_seq,
        "decode_cache_bytes_per_sequence": kv_per_token * model.context + state_per_seq,
        **static,
        "static_bytes": static_bytes,
        "loss_backward_bytes": loss_backward,
        "gemm_transient_bytes": gemm,
        "backward_transient_bytes": max(loss_backward, transient, gemm_at_peak),
        "train_peak_bytes": (static_bytes + act_per_token * tokens + tot["act_once"] * activation_bytes
                             + max(loss_backward, transient, gemm_at_peak)),
        "parts": [p.as_dict() for p in parts],
    }


_dtype_cache: dict[str, int] = {}
_linear_cache: dict[str, list[tuple[str, int, int, bool]]] = {}


def model_linears(model, components: dict[str, Any], registry: Registry) -> Iterator[tuple[str, int, int, bool]]:
    """(qualified name, in_features, out_features, has bias) of every ``nn.Linear`` the model builds.

    The model is built on the meta device (no memory, no initialisation), once
    per shape, and only when this is iterated.
    """
    key = json.dumps([dataclasses.asdict(model), {k: v for k, v in components.items()
                                                  if k not in ("dataset", "precision")}], sort_keys=True, default=str)
    if key not in _linear_cache:
        import torch
        import torch.nn as nn

        from .decoder import DecoderLM

        try:
            with torch.device("meta"):
                core = DecoderLM(model, components, registry)
        except Exception as exc:  # noqa: BLE001 - a component that cannot be built without data
            raise CostModelError(f"the precision policy asks for the model's linear layers, and building the "
                                 f"model on the meta device failed: {type(exc).__name__}: {exc}") from exc
        _linear_cache[key] = [(name, mod.in_features, mod.out_features, mod.bias is not None)
                              for name, mod in core.named_modules() if isinstance(mod, nn.Linear)]
    yield from _linear_cache[key]


def precision_gemm_transient_bytes(model, components: dict[str, Any], registry: Registry, tokens: int) -> int:
    """The precision policy's declared matmul working memory for one training step (0 without a policy)."""
    spec = components.get("precision")
    if not spec:
        return 0
    comp = registry.get("precision", spec["name"])
    policy = comp.factory(**dict(spec.get("params") or {}))
    try:
        return int(policy.gemm_transient_bytes(model_linears(model, components, registry), tokens))
    except CostModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - name the policy whatever went wrong
        raise CostModelError(f"gemm_transient_bytes of precision {spec['name']!r} (plugin {comp.plugin!r}) "
                             f"failed: {exc!r}") from exc


def dataset_vocab_size(cell, registry: Registry) -> int:
    """The cell's vocab size: ``model.vocab_size`` or, when 0, its tokenizer's (or a pre-tokenised
    dataset's; the dataset is loaded once per process, nothing is trained)."""
    if cell.model.vocab_size > 0:
        return cell.model.vocab_size
    from ..data.tokenstore import vocab_size

    return vocab_size(cell, registry)


def activation_dtype_bytes(cell, registry: Registry) -> int:
    """Bytes per activation element under the cell's precision policy (its ``compute_dtype``)."""
    spec = cell.components["precision"]
    key = _spec_key(spec)
    if key not in _dtype_cache:
        policy = registry.get("precision", spec["name"]).factory(**spec["params"])
        _dtype_cache[key] = policy.compute_dtype.itemsize
    return _dtype_cache[key]


def predict(cell, registry: Registry, *, vocab_size: int | None = None,
            activation_bytes: int | None = None, measure_missing: bool = False) -> dict[str, Any]:
    """Predicted costs of one cell (a ``abl.contracts.config.Cell``). Raises CostModelError.

    ``vocab_size`` overrides the dataset lookup (pass the recorded one for a
    finished run); ``activation_bytes`` overrides the precision policy's dtype.
    With ``measure_missing``, a cell with a component that declares no cost
    function is measured instead (abl.model.measuredcost: once per shape);
    the result's ``cost_source`` says which ("predicted" or "measured").
    """
    v = vocab_size or dataset_vocab_size(cell, registry)
    model = dataclasses.replace(cell.model, vocab_size=v)
    ab = activation_bytes or activation_dtype_bytes(cell, registry)
    if measure_missing and missing_costs(cell.components, registry):
        from .measuredcost import measure_model

        try:
            return measure_model(model, cell.components, registry, batch_size=cell.train.batch_size,
                                 activation_bytes=ab)
        except Exception as exc:  # a plugin's module that cannot run: name it, no traceback
            missing = ", ".join(missing_costs(cell.components, registry))
            raise CostModelError(f"{missing} declares no cost function, and measuring the model instead "
                                 f"failed: {type(exc).__name__}: {exc}") from exc
    return {"cost_source": "predicted",
            **predict_model(model, cell.components, registry, batch_size=cell.train.batch_size,
                            activation_bytes=ab)}


def missing_costs(components: dict[str, Any], registry: Registry) -> list[str]:
    """'axis name' of every model component of a cell that declares no cost function."""
    layers = components.get("layer_mixers")
    specs = [(a, components[a]) for a in ("norm", "block", "position", "ffn")]
    specs += [("mixer", s) for s in layers] if layers else [("mixer", components["mixer"])]
    out = []
    for axis, spec in specs:
        if registry.get(axis, spec["name"]).cost is None:
            label = f"{axis} {spec['name']!r}"
            if label not in out:
                out.append(label)
    return out


def agreement(predicted: float | None, measured: float | None, required: Any) -> tuple[float | None, str]:
    """(measured / predicted, verdict) for one row of ``CHECKS``."""
    if predicted is None or measured is None:
        return None, "not measured" if measured is None else "not predicted"
    ratio = measured / predicted if predicted else None
    if required == "exact":
        return ratio, "agrees (exact)" if round(measured) == round(predicted) else "DISAGREES"
    if isinstance(required, float):
        ok = ratio is not None and abs(ratio - 1) <= required
        return ratio, f"agrees (within {required:.0%})" if ok else f"DISAGREES (outside {required:.0%})"
    if isinstance(required, tuple):
        lo, hi = required
        ok = ratio is not None and lo <= ratio <= hi
        band = f"{lo:g}-{hi:g}x"
        return ratio, f"agrees (within {band})" if ok else f"DISAGREES (outside {band})"
    raise ValueError(f"unknown agreement requirement {required!r}")
