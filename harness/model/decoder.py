"""The shared decoder-only skeleton. Every part comes from the registry.

    tokens -> embedding (x embed scale) -> position.embed -> N x block -> final norm -> LM head (x logit scale, soft cap) -> CE
                                                                             (+ z-loss)

(the GPT-2 layout, Radford et al. 2019, "Language Models are Unsupervised
Multitask Learners", sec. 2.3: a decoder-only Transformer, Vaswani et al. 2017,
arXiv:1706.03762, with a final norm after the last block). The block
component lays out its norm(s), mixer and FFN; the position component talks to
mixers only through ``PositionEncoding``. Nothing here names a variant.

The head's options (embedding scale, tying, logit scale, soft cap, z-loss: config keys of the
skeleton) live in one object, ``abl.model.head.LMHead``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.nn as nn

from ..contracts.config import ModelConfig
from ..contracts.registry import Registry
from ..kernels import TORCH, KernelBackend
from .head import LMHead


class PositionEncoding(nn.Module):
    """The one interface between a position component and every mixer.

    A position plugin overrides any of the three hooks; the defaults do
    nothing, so a mixer can call all three unconditionally:

    - ``embed(x, start)``: add absolute information to the token embeddings
      ``x [B, T, D]`` of positions ``start .. start+T-1``;
    - ``rotate(q, k, q_start, k_start)``: transform queries ``[B, Hq, Tq, Dh]``
      and keys ``[B, Hk, Tk, Dh]`` (RoPE-style);
    - ``score_bias(n_heads, q_len, k_len, q_start, k_start, device)``: an
      additive ``[H, Tq, Tk]`` float bias on the attention scores, or None
      (ALiBi / T5-style);
    - ``bias_slopes(n_heads, device)``: when the score bias is exactly the
      linear distance penalty ``-m_h (i - j)`` on every visible key, the
      per-head ``m_h`` as an fp32 ``[H]`` tensor, so a fused attention kernel
      forms the bias itself instead of reading an ``[H, Tq, Tk]`` tensor.
      None (the default) means "use ``score_bias``".
    """

    def embed(self, x: torch.Tensor, start: int) -> torch.Tensor:
        return x

    def rotate(self, q: torch.Tensor, k: torch.Tensor, q_start: int, k_start: int):
        return q, k

    def score_bias(self, n_heads: int, q_len: int, k_len: int, q_start: int, k_start: int,
                   device: torch.device) -> torch.Tensor | None:
        return None

    def bias_slopes(self, n_heads: int, device: torch.device) -> torch.Tensor | None:
        return None

    @classmethod
    def overrides(cls, hook: str) -> bool:
        """Does this position class override ``hook`` ("embed", "rotate", "score_bias", ...)?

        Mixers ask it of ``type(ctx.position)``; cost and check functions, which
        get the model config rather than a built position, of the class the host
        hands them as ``position=`` when they name that parameter
        (``Registry.call_with_position``).
        """
        return getattr(cls, hook) is not getattr(PositionEncoding, hook)


@dataclass
class ForwardContext:
    """Per-forward state handed to every block, mixer and FFN.

    - ``position``: the model's ``PositionEncoding`` (mixers use it; they must
      not store it as a submodule);
    - ``start``: absolute position of the first token (non-zero when decoding
      with a cache);
    - ``layer`` / ``cache``: the current block index, and the decoding cache.
      ``cache`` is None in training. For cached decoding the caller passes
      ``cache={}`` with the whole prompt at ``start=0`` (prefill), then one
      token at a time with ``start`` = tokens already seen. A mixer keeps its
      state (KV tensors, a recurrent state...) in ``cache[ctx.layer]``
      through ``KVCache(ctx)``; every tensor reachable from it counts as
      cache memory;
    - ``aux_losses``: components add differentiable auxiliary losses here
      (already weighted); the model adds them to the training loss;
    - ``metrics``: components add scalar diagnostics recorded every step;
    - ``need_logits``: False when the caller wants only the loss (the training
      step); the model may then fuse the LM head into the loss and return
      None for the logits.
    """

    position: PositionEncoding
    start: int = 0
    layer: int = 0
    cache: dict | None = None
    need_logits: bool = True
    aux_losses: dict[str, torch.Tensor] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)

    def add_aux_loss(self, name: str, value: torch.Tensor) -> None:
        self.aux_losses[name] = self.aux_losses.get(name, 0) + value

    def add_metric(self, name: str, value) -> None:
        """A float or a 0-d tensor; the trainer converts it when it records."""
        self.metrics[name] = value.detach() if isinstance(value, torch.Tensor) else float(value)


class KVCache:
    """One layer's slot of the decoding cache, ``ctx.cache[ctx.layer]``: what a mixer keeps between calls.

    ``KVCache(ctx)`` is a view for the layer ``ctx`` is at. In training
    (``ctx.cache`` None) every method passes through and keeps nothing, so a
    mixer calls them unconditionally. Keep only what the next call needs:
    every tensor reachable from the cache counts as cache memory.

    - Per-token tensors that grow with the sequence (attention's K and V, a
      compressed latent): ``append`` returns every token's tensors so far::

          kv, k_start = KVCache(ctx).append(k=k, v=v, window=self.window)
          y = attend(q, kv["k"], kv["v"], q_start=ctx.start, k_start=k_start)

    - A fixed-size recurrent state (linear attention, SSMs): ``state()`` is
      what the previous call kept, ``set_state(...)`` keeps the new one.
    """

    _START = "start"  # append keeps the absolute position of its first kept token under this key

    def __init__(self, ctx: ForwardContext):
        self.ctx = ctx

    @property
    def enabled(self) -> bool:
        """True while decoding with a cache (``ctx.cache`` is a dict)."""
        return self.ctx.cache is not None

    def append(self, *, window: int = 0, **new: torch.Tensor) -> tuple[dict[str, torch.Tensor], int]:
        """Append this call's per-token tensors to the layer's cache; return the whole sequence.

        ``new``: named tensors with time on dim -2 (e.g. ``k=[B, H, T, E]``),
        the same names on every call of a decode. Returns (the cached tokens'
        tensors followed by the new ones, the absolute position of their first
        token). The cache keeps the last ``window`` tokens (0 = all): a rolling
        buffer for sliding-window attention; what is returned is never cut,
        since this call's queries may read keys the buffer drops. The prefill
        (``ctx.start == 0``) starts a new sequence, and keeps its tensors as
        given: views of a larger tensor keep all of it alive as cache memory.
        Without a cache the new tensors come back unchanged, from ``ctx.start``.
        """
        if not new:
            raise ValueError("KVCache.append needs at least one tensor")
        if self._START in new:
            raise ValueError(f"{self._START!r} is reserved in a layer's cache; name the tensor otherwise")
        ctx = self.ctx
        if ctx.cache is None:
            return new, ctx.start
        old = ctx.cache.get(ctx.layer) if ctx.start else None
        if old:
            tensors = {name: torch.cat((old[name], t), dim=-2) for name, t in new.items()}
            start = int(old[self._START])
        else:
            tensors, start = new, ctx.start
        kept, kept_start = tensors, start
        n = next(iter(tensors.values())).size(-2)
        if window and n > window:
            # a copy (clone: a trailing slice can already be contiguous): a view would keep
            # the whole concatenation alive
            kept = {name: t[..., -window:, :].clone(memory_format=torch.contiguous_format)
                    for name, t in tensors.items()}
            kept_start += n - window
        ctx.cache[ctx.layer] = {**kept, self._START: kept_start}
        return tensors, start

    def state(self) -> Any | None:
        """What ``set_state`` kept on the previous call of this decode; None in training and
        on the prefill (``ctx.start == 0``): start from zeros."""
        if self.ctx.cache is None or self.ctx.start == 0:
            return None
        return self.ctx.cache.get(self.ctx.layer)

    def set_state(self, **state: torch.Tensor) -> None:
        """Keep ``state`` (named tensors) for the next call; nothing in training.

        Kept as given: clone a view of a larger tensor first, or all of that
        tensor stays alive and counts as cache memory.
        """
        if self.ctx.cache is not None:
            self.ctx.cache[self.ctx.layer] = dict(state)


def residual_out(linear: nn.Linear) -> nn.Linear:
    """Mark a projection that writes into the residual stream.

    Its init std is scaled by 1/sqrt(2 n_layers) (GPT-2), so the residual
    stream's variance does not grow with depth.
    """
    setattr(linear, "abl_residual_out", True)  # a marker attribute nn.Linear does not declare
    return linear


def own_init(module: nn.Module) -> nn.Module:
    """Mark ``module`` (and every module inside it) as initialised by its component.

    The skeleton's init (normal(0, ``init_std``) weights, zero biases, the
    depth-scaled std of ``residual_out``) then leaves its weights as the
    component's ``__init__`` set them, e.g. Mamba's dt projection. A component
    registered with ``register(..., own_init=True)`` gets this on the whole
    module its factory returns. Returns ``module``.
    """
    for m in module.modules():
        setattr(m, "abl_custom_init", True)  # a marker attribute nn.Module does not declare
    return module


class DecoderLM(nn.Module):
    """The model. ``kernel_backend`` (``abl.kernels.resolve`` of ``train.kernels``)
    is the path its ops take: it is active for the duration of each forward
    and only then, so two models in one process can run different backends."""

    def __init__(self, cfg: ModelConfig, components: dict[str, Any], registry: Registry,
                 kernel_backend: KernelBackend = TORCH):
        super().__init__()
        if cfg.vocab_size <= 0:
            raise ValueError("ModelConfig.vocab_size must be set before building the model")
        self.cfg = cfg
        self.kernel_backend = kernel_backend

        def part(axis):
            spec = components[axis]
            comp = registry.get(axis, spec["name"])
            return _keeping_init(comp.factory, comp.own_init), dict(spec["params"])

        norm_f, norm_p = part("norm")
        pos_f, pos_p = part("position")
        mix_f, mix_p = part("mixer")
        ffn_f, ffn_p = part("ffn")
        blk_f, blk_p = part("block")

        self.head = LMHead(cfg)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position: PositionEncoding = pos_f(cfg, **pos_p)
        if not isinstance(self.position, PositionEncoding):
            raise TypeError(f"position component {components['position']['name']!r} must "
                            "return a harness.model.PositionEncoding")

        def make_norm(dim: int) -> nn.Module:
            return norm_f(dim, **norm_p)

        layer_specs = components.get("layer_mixers")
        built = [0]  # blocks are built in order; each make_mixer() call is the next layer's

        def make_mixer() -> nn.Module:
            if layer_specs is None:
                return mix_f(cfg, self.position, **mix_p)
            spec = layer_specs[min(built[0], len(layer_specs) - 1)]
            comp = registry.get("mixer", spec["name"])
            return _keeping_init(comp.factory, comp.own_init)(cfg, self.position, **spec["params"])

        def make_ffn() -> nn.Module:
            return ffn_f(cfg, **ffn_p)

        blocks = []
        for i in range(cfg.n_layers):
            built[0] = i
            blocks.append(blk_f(cfg, make_norm, make_mixer, make_ffn, **blk_p))
        self.blocks = nn.ModuleList(blocks)
        wants_final = bool(getattr(self.blocks[0], "final_norm", True))
        self.final_norm = make_norm(cfg.d_model) if wants_final else nn.Identity()
        self.lm_head = self.head.projection()
        self._init_weights()
        self.head.tie(self.embed, self.lm_head)

    def _init_weights(self) -> None:
        std = self.cfg.init_std
        resid_std = std / math.sqrt(2 * self.cfg.n_layers)
        for m in self.modules():
            if getattr(m, "abl_custom_init", False):
                continue
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, resid_std if getattr(m, "abl_residual_out", False) else std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0.0, std)

    def n_params(self, non_embedding: bool = False) -> int:
        seen, total = set(), 0
        for name, p in self.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            if non_embedding and (p is self.embed.weight or p is self.lm_head.weight):
                continue
            total += p.numel()
        return total

    @contextlib.contextmanager
    def using_kernels(self, backend: KernelBackend) -> Iterator[DecoderLM]:
        """Forwards inside the block take ``backend``; the model's own one after it."""
        own, self.kernel_backend = self.kernel_backend, backend
        try:
            yield self
        finally:
            self.kernel_backend = own

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy in fp32 (the op: the chunked Triton kernel under
        ``train.kernels = "triton"``, no fp32 copy of the logits; torch's otherwise)."""
        from ..kernels.cross_entropy import cross_entropy  # lazily, as linear_cross_entropy in _forward

        return cross_entropy(logits, targets)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                ctx: ForwardContext | None = None):
        """idx, targets: [B, T] token ids. Returns (logits [B, T, V], loss or None, ctx).

        Logits are None when ``ctx.need_logits`` is False and the fused LM-head
        cross-entropy kernel ran.

        ``loss`` is cross-entropy plus the auxiliary losses components reported;
        the cross-entropy alone is ``ctx.metrics["ce_loss"]``.
        """
        with self.kernel_backend.activate():
            return self._forward(idx, targets, ctx)

    def _forward(self, idx: torch.Tensor, targets: torch.Tensor | None, ctx: ForwardContext | None):
        if ctx is None:
            ctx = ForwardContext(position=self.position)
        x = self.head.embed(self.embed, idx)
        x = self.position.embed(x, ctx.start)
        for i, block in enumerate(self.blocks):
            ctx.layer = i
            x = block(x, ctx)
        x = self.final_norm(x)
        logits, ce = self.head(x, self.lm_head, targets, ctx)
        loss = None
        if ce is not None:
            ctx.metrics["ce_loss"] = ce.detach()
            loss = ce
            for value in ctx.aux_losses.values():
                loss = loss + value
        return logits, loss, ctx


def _keeping_init(factory: Any, own: bool) -> Any:
    """``factory``, whose modules keep their own init when the component registered ``own_init``."""
    if not own:
        return factory
    return lambda *args, **kwargs: own_init(factory(*args, **kwargs))


def build_model(cfg: ModelConfig, components: dict[str, Any], registry: Registry,
                kernel_backend: KernelBackend = TORCH) -> DecoderLM:
    return DecoderLM(cfg, components, registry, kernel_backend=kernel_backend)
