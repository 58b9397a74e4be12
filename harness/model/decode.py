"""Cached greedy decoding and length extrapolation: the measurements behind the
``decode`` and ``extrapolation`` post-training evaluations (abl.train.evaluations).

Nothing here names a variant. Decoding uses the ``ForwardContext`` cache
contract (harness/model/decoder.py, ``KVCache``): the whole prompt at
``start=0`` with ``cache={}`` (prefill), then one token at a time with
``start`` = tokens already seen; every tensor reachable from ``ctx.cache`` is
cache memory. Forwards run under the run's precision policy; its
``compute_dtype`` is the cache dtype.

Metrics (logged once, at the last training step):

- ``prefill_tokens_per_s``, ``decode_tokens_per_s``: batch-1 greedy
  generation with the cache, a prompt of half the trained context, then one
  token per step until the sequence is the trained context long;
- ``kv_bytes_per_token``: the analytic decode-state bytes per token at that
  length and the run's dtype, from each mixer's registered ``cost``
  (``state_elements_per_token`` + ``state_elements_per_sequence`` / length,
  summed over layers; Pope et al. 2022, arXiv:2211.05102); ``kv_bytes_per_token_measured``:
  the bytes of the live cache over the tokens it covers;
  ``kv_cache_bytes_measured``: the live cache in total;
- ``decode_agreement``: the fraction of greedy tokens that one full forward
  over the generated sequence also picks (1.0 = cached decoding reproduces
  recomputation);
- ``val_loss_x1`` / ``_x2`` / ``_x4``: mean validation cross-entropy on the
  same target tokens at every scale, with only the context before them
  changing: windows ending at evenly spaced points of the validation split,
  each scoring its last ``context`` targets, fed with ``context``, 2x and 4x
  ``context`` tokens (the last ``context`` positions of a forward of k x
  ``context`` tokens), in batches whose score matrices are no larger than the
  regular evaluation's. ``val_loss_x1`` is the model at its trained length on
  these targets: compare x2/x4 with it, not with ``val_loss``, whose windows
  start anywhere in the split (so it differs from ``val_loss_x1`` by the
  text, not by the model). The scored targets depend only on the validation
  tokens, the context and the number of windows (``extrapolation_ends``), never
  on the model. A position component that cannot go past a length says so
  with a ``max_positions`` attribute; that length is skipped with a note, and
  so is any length whose forward raises.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch
import torch.nn.functional as F

from ..contracts.precision import Precision
from .decoder import DecoderLM, ForwardContext

EXTRAPOLATION_SCALES = (1, 2, 4)  # multiples of the trained context; the targets are the same at each


def cache_bytes(cache: Any) -> int:
    """Bytes of every distinct tensor storage reachable from ``cache`` (dicts, lists, objects)."""
    seen_storage: set[int] = set()
    seen_obj: set[int] = set()
    total, stack = 0, [cache]
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in seen_storage:
                seen_storage.add(storage.data_ptr())
                total += storage.nbytes()
            continue
        if id(obj) in seen_obj or obj is None or isinstance(obj, (int, float, str, bool)):
            continue
        seen_obj.add(id(obj))
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
    return total


def layer_mixer_specs(model_config, components: dict) -> list[dict]:
    """The mixer spec ({"name", "params"}) of every layer."""
    if components.get("layer_mixers"):
        return list(components["layer_mixers"])
    return [components["mixer"]] * model_config.n_layers


def analytic_state_bytes(model_config, components: dict, registry, length: int,
                         dtype: torch.dtype) -> tuple[float | None, list[str]]:
    """Decode-state bytes of one sequence of ``length`` tokens, from the mixers' cost functions.

    Returns (bytes or None, names of mixers without a cost function).
    """
    cfg = dataclasses.replace(model_config, context=length)
    elem = torch.empty((), dtype=dtype).element_size()
    total, missing = 0.0, []
    for spec in layer_mixer_specs(model_config, components):
        comp = registry.get("mixer", spec["name"])
        if comp.cost is None:
            missing.append(spec["name"])
            continue
        c = registry.call_with_position(comp.cost, cfg, **spec["params"])
        total += (c.state_elements_per_token * length + c.state_elements_per_sequence) * elem
    return (None if missing else total), sorted(set(missing))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclasses.dataclass
class Generation:
    tokens: torch.Tensor  # [B, n_new] greedy tokens
    cache: dict
    prefill_s: float
    decode_s: float
    decode_steps: int


@torch.no_grad()
def greedy_generate(model: DecoderLM, prompt: torch.Tensor, n_new: int,
                    precision: Precision | None = None) -> Generation:
    """Prefill ``prompt`` [B, P] into a fresh cache, then feed one greedy token per step.

    Produces ``n_new`` tokens after ``n_new - 1`` single-token steps, so the
    cache ends up covering P + n_new - 1 tokens. Forwards run in
    ``precision``'s autocast (none: fp32).
    """
    device = prompt.device
    precision = precision or Precision()
    cache: dict = {}
    _sync(device)
    t0 = time.perf_counter()
    with precision.autocast(device):
        logits, _, _ = model(prompt, ctx=ForwardContext(position=model.position, start=0, cache=cache))
    nxt = logits[:, -1].argmax(-1, keepdim=True)
    _sync(device)
    t1 = time.perf_counter()
    out = [nxt]
    seen = prompt.size(1)
    for _ in range(n_new - 1):
        with precision.autocast(device):
            logits, _, _ = model(nxt, ctx=ForwardContext(position=model.position, start=seen, cache=cache))
        seen += 1
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        out.append(nxt)
    _sync(device)
    t2 = time.perf_counter()
    return Generation(torch.cat(out, dim=1), cache, t1 - t0, t2 - t1, n_new - 1)


@torch.no_grad()
def recompute_generate(model: DecoderLM, prompt: torch.Tensor, n_new: int,
                       precision: Precision | None = None) -> torch.Tensor:
    """Greedy generation without a cache: the whole sequence is recomputed at every step."""
    precision = precision or Precision()
    seq = prompt
    for _ in range(n_new):
        with precision.autocast(prompt.device):
            logits, _, _ = model(seq, ctx=ForwardContext(position=model.position))
        seq = torch.cat((seq, logits[:, -1].argmax(-1, keepdim=True)), dim=1)
    return seq[:, prompt.size(1):]


@torch.no_grad()
def decode_metrics(model: DecoderLM, model_config, components: dict, registry, val: torch.Tensor,
                   device: torch.device, precision: Precision) -> tuple[dict, list[str]]:
    """Speed and cache size of cached greedy decoding at the trained context length."""
    context = model_config.context
    p = max(1, context // 2)
    prompt = val[:p].view(1, p).to(device)
    n_new = context - p + 1  # the last fed token makes the sequence `context` long
    greedy_generate(model, prompt, min(4, n_new), precision)  # warm-up (allocator, caches)
    gen = greedy_generate(model, prompt, n_new, precision)
    if not gen.cache:
        return {}, ["decode metrics not recorded: the mixers kept no state in ctx.cache "
                    "(no cached decoding to measure)"]
    length = p + gen.decode_steps
    measured = cache_bytes(gen.cache)
    metrics = {
        "prefill_tokens_per_s": p / max(gen.prefill_s, 1e-9),
        "decode_tokens_per_s": gen.decode_steps / max(gen.decode_s, 1e-9),
        "kv_cache_bytes_measured": measured,
        "kv_bytes_per_token_measured": measured / length,
    }
    notes = []
    analytic, missing = analytic_state_bytes(model_config, components, registry, length,
                                             precision.compute_dtype)
    if analytic is None:
        notes.append(f"kv_bytes_per_token (analytic) not recorded: mixer(s) {', '.join(missing)} "
                     "registered no cost function")
    else:
        metrics["kv_bytes_per_token"] = analytic / length
    # one full forward over the generated sequence must pick the same tokens
    seq = torch.cat((prompt, gen.tokens[:, :-1]), dim=1)
    with precision.autocast(device):
        logits, _, _ = model(seq, ctx=ForwardContext(position=model.position))
    agree = (logits[:, p - 1:].argmax(-1) == gen.tokens).float().mean().item()
    metrics["decode_agreement"] = agree
    if agree < 1.0:
        notes.append(f"cached greedy decoding agreed with full recomputation on {agree:.1%} of tokens")
    return metrics, notes


def extrapolation_ends(n_val: int, context: int, n_windows: int, scales=EXTRAPOLATION_SCALES) -> torch.Tensor | None:
    """Where each extrapolation window ends: ``n_windows`` evenly spaced indices ``e`` of the validation
    split, each with ``longest * context`` tokens before it (``longest``: the largest of ``scales`` the
    split holds), so the window of every scale k feeds ``val[e - k*context : e]`` and scores the targets
    ``val[e - context + 1 : e + 1]``. None when not even 1x fits."""
    fits = [k for k in scales if n_val >= k * context + 1]
    if not fits:
        return None
    return torch.linspace(max(fits) * context, n_val - 1, n_windows).long()


def scored_targets(val: torch.Tensor, context: int, ends: torch.Tensor) -> torch.Tensor:
    """The target token ids [n_windows, context] every scale scores (the last ``context`` of each window)."""
    return val[ends[:, None] + torch.arange(1 - context, 1)[None, :]]


@torch.no_grad()
def extrapolation_metrics(model: DecoderLM, val: torch.Tensor, context: int, n_sequences: int,
                          batch_size: int, device: torch.device, precision: Precision,
                          scales=EXTRAPOLATION_SCALES) -> tuple[dict, list[str]]:
    """val_loss_x{k}: mean cross-entropy on the same ``n_sequences`` x ``context`` target tokens at every
    scale k, predicted from k * context tokens of input (the module docstring says how).

    The targets are fixed by the longest scale the validation split holds
    (``extrapolation_ends``), whatever the model; a scale the model's
    positions cannot reach is skipped with a note and leaves the others'
    targets as they are. A scale runs in batches of batch_size / k^2 windows,
    so a batch's T x T score matrices are no larger than the regular
    evaluation's and this evaluation does not raise the run's peak memory.
    """
    metrics: dict[str, float] = {}
    notes: list[str] = []
    limit = getattr(model.position, "max_positions", None)
    fits = [k for k in scales if len(val) >= k * context + 1]
    for k in scales:
        if k not in fits:
            notes.append(f"val_loss_x{k} not recorded: the validation split has {len(val)} tokens, "
                         f"fewer than {k * context + 1}")
    ends = extrapolation_ends(len(val), context, n_sequences, scales)
    if ends is None:
        return metrics, notes
    for k in fits:
        length = k * context
        name = f"val_loss_x{k}"
        if limit is not None and length > limit:
            notes.append(f"{name} not recorded: the position encoding covers {limit} positions "
                         f"(max_positions), the evaluation needs {length}")
            continue
        bs = max(1, batch_size // (k * k))
        idx = ends[:, None] + torch.arange(-length, 1)[None, :]  # inputs val[e-length : e], targets to e
        total, count = 0.0, 0
        try:
            for i in range(0, len(ends), bs):
                w = val[idx[i:i + bs]].to(device)
                with precision.autocast(device):
                    logits, _, _ = model(w[:, :-1], ctx=ForwardContext(position=model.position))
                scored = logits[:, -context:].float()
                ce = F.cross_entropy(scored.reshape(-1, scored.size(-1)), w[:, -context:].reshape(-1),
                                     reduction="sum")
                total += float(ce)
                count += w.size(0) * context
        except (ValueError, IndexError, RuntimeError) as exc:
            notes.append(f"{name} not recorded: the model cannot run {length} tokens "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
            continue
        metrics[name] = total / count
    return metrics, notes
