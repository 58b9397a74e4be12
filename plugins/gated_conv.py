"""Gated-convolution mixers (axis ``mixer``): H3 and Hyena.

- ``h3``: Fu, Dao, Saab, Thomas, Rudra & Ré 2023, "Hungry Hungry Hippos: Towards Language
  Modeling with State Space Models", arXiv:2212.14052, sec. 3.2 (the H3 layer, fig. 1 and
  Algorithm 1): Q, K, V projections; a shift SSM on K; the product with V; a diagonal SSM
  (S4D, ``abl.plugins.s4``); the product with Q; an output projection.
- ``hyena``: Poli, Massaroli, Nguyen, Fu, Dao, Baccus, Bengio, Ermon & Ré 2023, "Hyena
  Hierarchy: Towards Larger Convolutional Language Models", arXiv:2302.10866, sec. 3 (the
  Hyena recurrence, Definition 3.1 and Algorithm 3) and sec. 3.3 (the implicit filter: an FFN
  of a positional encoding times an exponential window, the "ExponentialModulation" of
  the reference ``hyena.py``).

Decoding. H3 has a recurrent form: the shift SSM's state is the last ``shift_state`` - 1
values of K and the diagonal SSM's its complex modes, so cached decoding keeps O(1) state
per sequence and equals the full forward. Hyena's long filters are implicit and as long as
the sequence: there is no recurrent form in the paper (later work distils one). Its cached
decoding here recomputes over the cache: it keeps the layer inputs of every token seen
(``KVCache.append``, d_model elements per token) and runs the training forward over all of
them for each new token, O(L log L) per step; the outputs are those of the full forward.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import nn

from abl import Arg, Cost, KVCache, hookimpl, linear_flops, linear_params, own_init, residual_out
from abl.plugins.s4 import DiagSSM, Init, diag_ssm_params, fft_conv, fp32, wide

# ---------------------------------------------------------------- H3


class H3(nn.Module):
    """The H3 layer (Fu, Dao et al. 2023, arXiv:2212.14052, sec. 3.2, Algorithm 1).

    Q = u W_Q, K = u W_K, V = u W_V; K' = SSM_shift(K): y_t = sum_{i < m} c_i k_{t-i} + D k_t (A the
    shift matrix, B = e_1: a learnable causal filter of length m = ``shift_state``); per head of
    width p = ``head_dim``, the outer product K' V^T (p x p channels) passes the diagonal SSM
    (S4D, ``init``); O = Q (that) and the output projection. ``head_dim`` = 1 is the elementwise
    form Q * SSM_diag(K' * V).

    One departure at ``head_dim`` p > 1: each of a head's p x p product channels gets its own
    diagonal SSM (d_model * p SSMs), where the reference (HazyResearch/H3, ``src/models/ssm/h3.py``:
    ``SSKernel(H = d_model / head_dim)``, its kernel broadcast over the p x p products) shares one
    SSM per head (d_model / p SSMs). At the default p = 1 the two are the same layer.
    """

    def __init__(self, cfg, position=None,
                 d_state: Annotated[int, Arg("state size N of the diagonal SSM (even)", min=2)] = 64,
                 shift_state: Annotated[int, Arg("state size m of the shift SSM: its filter length", min=1)] = 64,
                 head_dim: Annotated[int, Arg("width p of each head: the diagonal SSM runs over d_model * p "
                                              "channels", min=1)] = 1,
                 init: Annotated[Init, Arg("the diagonal SSM's S4D init (abl.plugins.s4)")] = "legs",
                 dt_min: Annotated[float, Arg("dt of the diagonal SSM is log-uniform in [dt_min, dt_max]",
                                              min=1e-6)] = 0.001,
                 dt_max: Annotated[float, Arg("see dt_min", min=1e-6)] = 0.1,
                 bias: Annotated[bool, Arg("biases on the Q, K, V and output projections")] = True):
        super().__init__()
        d = cfg.d_model
        self.d, self.head_dim, self.m = d, head_dim, shift_state
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, d, bias=bias) for _ in range(3))
        self.shift_C = nn.Parameter(torch.randn(d, shift_state))
        self.shift_D = nn.Parameter(torch.randn(d))
        self.diag = DiagSSM(d * head_dim, d_state, init, dt_min, dt_max)
        self.out_proj = residual_out(nn.Linear(d, d, bias=bias))

    def shift(self, k: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
        """SSM_shift over k [B, d, T] after the m - 1 inputs ``before`` [B, d, m-1] (zeros at the start)."""
        t = k.size(-1)
        kp = torch.cat([before, k], dim=-1)
        length = kp.size(-1)
        taps = self.shift_C.to(k.dtype)[:, :length]
        return fft_conv(kp, taps)[..., -t:] + k * self.shift_D.to(k.dtype)[:, None]

    def forward(self, x, ctx=None):
        b, t, d = x.shape
        cache = KVCache(ctx) if ctx is not None and ctx.cache is not None else None
        cached = cache is not None
        kept = cache.state() if cache is not None else None
        q, k, v = (p(x) for p in (self.q_proj, self.k_proj, self.v_proj))
        with fp32(x.device):
            k = wide(k).transpose(1, 2)  # [B, d, T]
            before = k.new_zeros(b, d, self.m - 1) if kept is None else kept["shift"]
            ks = self.shift(k, before)
            p = self.head_dim
            kv = ks.view(b, d // p, p, 1, t) * wide(v).transpose(1, 2).reshape(b, d // p, 1, p, t)
            state = None if kept is None else torch.view_as_complex(kept["ssm"])
            s, state = self.diag(kv.reshape(b, d * p, t), state, cached)
            o = (wide(q).transpose(1, 2).reshape(b, d // p, p, 1, t) * s.view(b, d // p, p, p, t)).sum(2)
            if cache is not None:
                window = torch.cat([before, k], dim=-1)[..., -(self.m - 1):] if self.m > 1 else before
                cache.set_state(shift=window.clone(), ssm=torch.view_as_real(state).clone())
        return self.out_proj(o.reshape(b, d, t).transpose(1, 2).to(x.dtype))


def _h3_check(cfg, params):
    errs = []
    if params["d_state"] % 2:
        errs.append(f"d_state={params['d_state']} must be even (the diagonal SSM keeps N/2 complex modes)")
    if cfg.d_model % params["head_dim"]:
        errs.append(f"d_model={cfg.d_model} is not divisible by head_dim={params['head_dim']}")
    return errs


def _h3_cost(cfg, d_state=64, shift_state=64, head_dim=1, bias=True, **_):
    """Counted FLOPs: the four projections; both SSMs are FFT convolutions (not counted)."""
    d, p = cfg.d_model, head_dim
    params = 4 * linear_params(d, d, bias) + d * shift_state + d + diag_ssm_params(d * p, d_state)
    # saved for backward, calibrated against torch's MemTracker (context 32 and 64, batch 4 and 8):
    # per token q, k, v, the shift SSM's output and the d x p product channels; once per forward
    # the diagonal SSM's Vandermonde kernel (as s4's, over d * p channels)
    saved = 4 * d + 12 * d * p
    per_forward = 2.2 * d * p * d_state * cfg.context
    return Cost(params=params, flops_per_token=4 * linear_flops(d, d), activation_elements_per_token=saved,
                activation_elements_per_forward=per_forward,
                state_elements_per_sequence=d * (shift_state - 1) + d * p * d_state)


# ---------------------------------------------------------------- Hyena


class Sin(nn.Module):
    """sin(w x) with a trainable frequency per feature (the implicit filter's activation, Hyena sec. 3.3)."""

    def __init__(self, dim: int, w: float = 1.0):
        super().__init__()
        self.freq = nn.Parameter(w * torch.ones(1, dim))

    def forward(self, x):
        return torch.sin(self.freq * x)


class HyenaFilter(nn.Module):
    """The implicit long filter h(t) = Window(t) * FFN(PE(t)) (Hyena sec. 3.3; the reference ``HyenaFilter``).

    PE(t) = [t/(L-1), Re z_k(t), Im z_k(t)], z_k(t) = exp(-i 2 pi f_k t / L) for
    ``(emb_dim - 1) / 2`` bands f_k in linspace(1e-4, bands - 1), L = the model's context; the FFN
    is Linear(emb_dim, w) Sin (Linear(w, w) Sin) x ``inner_mlps``, Linear(w, channels) with one
    shared Sin; the window exp(-|a_c| t / (L - 1)) with a_c spread over channels from
    log(target)/slow_decay to log(target)/fast_decay ("ExponentialModulation"). Positions past
    L (longer sequences than trained on) follow the same formulas.

    The decay rates run over the ``order`` x d channels in blocks: filter n takes the n-th block
    of d (``Hyena.operator``), so at order 2 the first filter has only the slower half of the rates
    and the second the faster half, as in the reference's standalone version
    (HazyResearch/safari ``standalone_hyena.py``: ``'l (o d) -> o d l'``). The full reference
    (safari ``src/models/sequence/hyena.py``: ``'c l (v o) -> c o v l'``) interleaves the filters,
    so each spans the whole range of rates. At order 1 the two agree.
    """

    deltas: torch.Tensor

    def __init__(self, channels: int, context: int, emb_dim: int = 3, width: int = 64, inner_mlps: int = 2,
                 freq: float = 1.0, fast_decay: float = 0.3, slow_decay: float = 1.5, target: float = 1e-2):
        super().__init__()
        self.context, self.emb_dim = context, emb_dim
        act = Sin(width, freq)
        layers: list[nn.Module] = [nn.Linear(emb_dim, width), act]
        for _ in range(inner_mlps):
            layers += [nn.Linear(width, width), act]
        layers.append(nn.Linear(width, channels, bias=False))
        self.mlp = nn.Sequential(*layers)
        self.register_buffer("deltas", torch.linspace(math.log(target) / slow_decay, math.log(target) / fast_decay,
                                                      channels).abs(), persistent=False)

    def positional(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        steps = torch.arange(length, device=device, dtype=next(self.mlp.parameters()).dtype)
        t = steps / max(self.context - 1, 1)
        bands = (self.emb_dim - 1) // 2
        f = torch.linspace(1e-4, bands - 1, bands, device=device, dtype=steps.dtype)
        w = 2 * math.pi * steps / self.context
        z = torch.exp(-1j * f[None] * w[:, None])
        return torch.cat([t[:, None], z.real, z.imag], dim=-1), t

    def forward(self, length: int, device: torch.device) -> torch.Tensor:
        """The filters [channels, length]."""
        z, t = self.positional(length, device)
        h = self.mlp(z) * torch.exp(-t[:, None] * self.deltas)
        return h.transpose(0, 1)


class Hyena(nn.Module):
    """The Hyena operator of order N (Poli et al. 2023, arXiv:2302.10866, Definition 3.1, Algorithm 3).

    (x^1 .. x^N, v) = ShortConv(Linear(u)) (a causal depthwise conv of width ``short_filter``);
    z^1 = v, z^(n+1) = x^n * (h^n conv z^n + b^n z^n) for n = 1..N, y = Linear(z^(N+1)): N long
    convolutions and N gates, as the paper's Algorithm 3 defines order N. (The reference
    ``HyenaOperator`` gates once before its first convolution and builds N - 1 filters for
    "order" N; this follows the paper.) The skip b^n z^n of each long convolution is the
    reference's filter bias. The long filters h^n are implicit (``HyenaFilter``).
    """

    def __init__(self, cfg, position=None,
                 order: Annotated[int, Arg("N: the number of long convolutions and gates", min=1)] = 2,
                 filter_width: Annotated[int, Arg("width of the implicit filter's FFN", min=1)] = 64,
                 emb_dim: Annotated[int, Arg("positional features of the filter (t and (emb_dim - 1) / 2 bands); "
                                             "odd", min=1)] = 3,
                 inner_mlps: Annotated[int, Arg("hidden layers of the filter's FFN after the first", min=0)] = 2,
                 short_filter: Annotated[int, Arg("width of the causal depthwise conv on the projections",
                                                  min=1)] = 3,
                 freq: Annotated[float, Arg("initial frequency of the filter's Sin activation")] = 1.0,
                 fast_decay: Annotated[float, Arg("the window's fastest decay reaches target at this fraction of "
                                                  "the context", min=1e-6)] = 0.3,
                 slow_decay: Annotated[float, Arg("the slowest decay reaches target at this fraction of the "
                                                  "context", min=1e-6)] = 1.5,
                 target: Annotated[float, Arg("window value at the decay length", min=1e-9, max=1.0)] = 1e-2):
        super().__init__()
        d = cfg.d_model
        self.d, self.order, self.short = d, order, short_filter
        self.in_proj = nn.Linear(d, (order + 1) * d)
        self.short_w = nn.Parameter(torch.randn((order + 1) * d, short_filter) / math.sqrt(short_filter))
        self.short_b = nn.Parameter(torch.zeros((order + 1) * d))
        # the filter FFN keeps torch's default Linear init, as the reference's: the skeleton's normal init
        # (std 1/sqrt(d_model)) would change the frequencies its Sin activations start from
        self.filter = own_init(HyenaFilter(order * d, cfg.context, emb_dim, filter_width, inner_mlps, freq,
                                           fast_decay, slow_decay, target))
        self.filter_bias = nn.Parameter(torch.randn(order * d))
        self.out_proj = residual_out(nn.Linear(d, d))

    def operator(self, x: torch.Tensor) -> torch.Tensor:
        """The whole operator over x [B, T, d] (training, and decoding by recomputation)."""
        b, t, d = x.shape
        u = self.in_proj(x).transpose(1, 2)  # [B, (N+1) d, T]
        with fp32(x.device):
            u = wide(u)
            up = torch.cat([u.new_zeros(b, u.size(1), self.short - 1), u], dim=-1)
            uc = self.short_b.to(u.dtype)[:, None] + sum(up[..., i:i + t] * self.short_w.to(u.dtype)[:, i, None]
                                                      for i in range(self.short))
            *xs, v = uc.split(d, dim=1)
            h = self.filter(t, x.device).to(u.dtype).view(self.order, d, t)
            bias = self.filter_bias.to(u.dtype).view(self.order, d)
            for n in range(self.order):  # z^(n+1) = x^n * (h^n conv z^n + b^n z^n)
                v = xs[n] * (fft_conv(v, h[n]) + v * bias[n][:, None])
            y = v
        return self.out_proj(y.transpose(1, 2).to(x.dtype))

    def forward(self, x, ctx=None):
        if ctx is None or ctx.cache is None:
            return self.operator(x)
        seen, _ = KVCache(ctx).append(x=x)  # every token's layer input so far
        return self.operator(seen["x"])[:, -x.size(1):]


def _hyena_filter_params(d, order, filter_width, emb_dim, inner_mlps):
    w = filter_width
    return linear_params(emb_dim, w, True) + inner_mlps * linear_params(w, w, True) + w * order * d + w


def hyena_filter_flops(cfg, order=2, filter_width=64, emb_dim=3, inner_mlps=2, **_) -> float:
    """FLOPs of one evaluation of the implicit filter's FFN at the model's context: once per forward,
    shared by every sequence of the batch (``Cost.flops_per_forward``, not per token)."""
    w = filter_width
    return cfg.context * (linear_flops(emb_dim, w) + inner_mlps * linear_flops(w, w)
                          + linear_flops(w, order * cfg.d_model))


def _hyena_cost(cfg, order=2, filter_width=64, emb_dim=3, inner_mlps=2, short_filter=3, **_):
    """Counted FLOPs per token: the two projections. The short conv and the gates are elementwise,
    the long convolutions FFTs (O(L log L) per channel and sequence), and the filter FFN runs once
    per forward for the whole batch (``hyena_filter_flops``, the cost's ``flops_per_forward``)."""
    d = cfg.d_model
    params = (linear_params(d, (order + 1) * d, True) + (order + 1) * d * (short_filter + 1)
              + _hyena_filter_params(d, order, filter_width, emb_dim, inner_mlps) + order * d
              + linear_params(d, d, True))
    # saved per token (an estimate): the projection, its padded short conv, per order the gate
    # product, the two transforms and the convolution output, the last gate, out_proj's input
    saved = d + 2 * (order + 1) * d + order * 6 * d + 2 * d
    return Cost(params=params, flops_per_token=linear_flops(d, (order + 1) * d) + linear_flops(d, d),
                flops_per_forward=hyena_filter_flops(cfg, order, filter_width, emb_dim, inner_mlps),
                # the filter FFN's activations and the windowed filters, once per forward
                activation_elements_per_forward=cfg.context * (2 * (1 + inner_mlps) * filter_width + 4 * order * d),
                activation_elements_per_token=saved, state_elements_per_token=d)


@hookimpl
def register_components(register):
    # each mixer's signature declares its parameters (type, default, doc, bounds)
    register("mixer", "h3", H3,
             doc="H3: shift SSM and diagonal SSM gated by K, V and Q (Fu, Dao et al. 2023).",
             cost=_h3_cost, check=_h3_check)
    register("mixer", "hyena", Hyena,
             doc="Hyena: implicit long convolutions with data-controlled gating (Poli et al. 2023).",
             cost=_hyena_cost)
