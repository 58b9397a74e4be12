"""Position encodings (axis ``position``), through ``abl.model.decoder.PositionEncoding``.

Sources per encoding in the table below (authors, year, arXiv id, section).
Every factory is
``factory(config, **params)``. Each encoding uses exactly one of the three
hooks of the interface, so it works with every mixer that calls all three:

| name | hook | source |
|---|---|---|
| learned | embed | GPT-1 (Radford et al. 2018, OpenAI report), sec. 4.1; kept by GPT-2 |
| sinusoidal | embed | Vaswani et al. 2017, arXiv:1706.03762, sec. 3.5 |
| rope | rotate | Su et al. 2021, arXiv:2104.09864, sec. 3.2; interpolation: Chen et al. 2023, arXiv:2306.15595 |
| alibi | score_bias | Press et al. 2022, arXiv:2108.12409, sec. 3 |
| t5 | score_bias | Raffel et al. 2020, arXiv:1910.10683, sec. 2.1 |
| nope | none | Kazemnejad et al. 2023, arXiv:2305.19466 |

An encoding that cannot run past some length says so with ``max_positions``
(the harness reads it generically, e.g. to skip length extrapolation).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import torch
import torch.nn as nn

from abl import Arg, Cost, PositionEncoding, hookimpl
from abl.kernels.rope import rope_qk


class LearnedPosition(PositionEncoding):
    """x_p <- x_p + E[p], one learned vector per position up to the context (GPT-2).

    There is no row for positions past the training context, so
    ``max_positions`` = context and longer inputs raise ValueError.
    """

    def __init__(self, cfg):
        super().__init__()
        self.context = cfg.context
        self.max_positions = cfg.context
        self.table = nn.Embedding(cfg.context, cfg.d_model)

    def embed(self, x, start):
        t = x.size(1)
        if start + t > self.context:
            raise ValueError(f"learned positions cover {self.context} tokens; got position {start + t - 1}")
        pos = torch.arange(start, start + t, device=x.device)
        return x + self.table(pos)


class SinusoidalPosition(PositionEncoding):
    """x_p <- x_p + PE[p], PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(same).

    Vaswani et al. 2017, arXiv:1706.03762, sec. 3.5. Fixed, defined for any
    position. ``embed_scale`` (default on) multiplies the token embeddings by
    sqrt(d_model) first, as the paper does (sec. 3.4): with embeddings at the
    default init std 1/sqrt(d) the token part then has RMS 1 against the
    table's 1/sqrt(2). Unscaled, the fixed table outweighs the tokens sqrt(d)
    times over and the model barely learns (docs/findings.md, "Default initialisation").
    """

    inv_freq: torch.Tensor  # a buffer

    def __init__(self, cfg, base: Annotated[float, Arg("wavelength base: PE uses base^(2i/d)", min=1.0)] = 10000.0,
                 embed_scale: Annotated[bool, Arg("multiply token embeddings by sqrt(d_model) first "
                                                  "(Vaswani sec. 3.4)")] = True):
        super().__init__()
        self.d_model = cfg.d_model
        self.scale = math.sqrt(cfg.d_model) if embed_scale else 1.0
        i = torch.arange(0, cfg.d_model, 2, dtype=torch.float64)
        self.register_buffer("inv_freq", (base ** (-i / cfg.d_model)).float(), persistent=False)

    def table(self, start: int, length: int, device) -> torch.Tensor:
        pos = torch.arange(start, start + length, device=device, dtype=torch.float32)
        ang = torch.outer(pos, self.inv_freq.to(device))  # [T, ceil(d/2)]
        pe = torch.stack((ang.sin(), ang.cos()), dim=-1).flatten(-2)  # sin at 2i, cos at 2i+1
        return pe[:, : self.d_model]

    def embed(self, x, start):
        return x * self.scale + self.table(start, x.size(1), x.device).to(x.dtype)


class RotaryPosition(PositionEncoding):
    """RoPE (Su et al. 2021): rotate each pair of q/k dims by p * theta_k.

    Su et al. 2021, arXiv:2104.09864, sec. 3.2. theta_k = theta^(-2k/d) for k < d/2, d the size of the rotated dims (the
    head dim; MLA rotates only its decoupled RoPE dims). ``interpolation_factor``
    s > 1 is position interpolation (Chen et al. 2023, arXiv:2306.15595): position p
    is rotated as p / s, to stretch a model to s times its trained context.
    ``layout`` picks which dims form a pair: "interleaved" (2k, 2k+1) as in the
    paper, or "half" (k, k + d/2) as in GPT-NeoX / LLaMA code.
    The rotation is computed in fp32.
    """

    inv_freq: torch.Tensor  # a buffer

    def __init__(self, cfg,
                 theta: Annotated[float, Arg("base of the frequencies theta_k = theta^(-2k/d)", min=1.0)] = 10000.0,
                 interpolation_factor: Annotated[float, Arg("position interpolation: rotate position p as p/s",
                                                            min=1e-6)] = 1.0,
                 layout: Annotated[Literal["interleaved", "half"],
                                   Arg("dims paired as (2k, 2k+1) or (k, k+d/2)")] = "interleaved"):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.theta = theta
        self.layout = layout
        self.interpolation_factor = interpolation_factor
        self.register_buffer("inv_freq", self._inv_freq(self.head_dim), persistent=False)
        self._cache: tuple | None = None

    def _inv_freq(self, dim: int) -> torch.Tensor:
        k = torch.arange(0, dim, 2, dtype=torch.float64) / dim
        return (self.theta ** -k).float()

    def angles(self, start: int, length: int, device, dim: int | None = None):
        dim = dim or self.head_dim
        key = (start, length, device, dim)
        # under torch.compile the tables are computed in the graph (a few T x D/2 element-wise ops):
        # the cache is Python state, and filling it would fail the next call's guards (a second compile)
        compiling = torch.compiler.is_compiling()
        if not compiling and self._cache is not None and self._cache[0] == key:
            return self._cache[1], self._cache[2]
        inv_freq = self.inv_freq if dim == self.head_dim else self._inv_freq(dim)
        pos = torch.arange(start, start + length, device=device, dtype=torch.float32)
        freqs = torch.outer(pos / self.interpolation_factor, inv_freq.to(device))  # [T, d/2]
        cos, sin = freqs.cos(), freqs.sin()
        if not compiling:
            self._cache = (key, cos, sin)
        return cos, sin

    def _apply(self, fn, *args, **kwargs):  # drop the cache when the module moves device
        self._cache = None
        return super()._apply(fn, *args, **kwargs)

    def rotate(self, q, k, q_start, k_start):
        # q and k in one launch (abl.kernels.rope.rope_qk); the keys take their own angles only where
        # their positions differ from the queries' (a KV cache, Tq != Tk)
        cos_q, sin_q = self.angles(q_start, q.size(-2), q.device, q.size(-1))
        cos_k = sin_k = None
        if (k_start, k.size(-2), k.size(-1)) != (q_start, q.size(-2), q.size(-1)):
            cos_k, sin_k = self.angles(k_start, k.size(-2), k.device, k.size(-1))
        return rope_qk(q, k, cos_q, sin_q, cos_k, sin_k, self.layout)


def alibi_slopes(n_heads: int) -> list[float]:
    """Per-head ALiBi slopes (Press, Smith & Lewis 2021, "Train Short, Test Long", arXiv:2108.12409,
    sec. 3, and their reference code): the one definition; the attention kernel takes them as input.

    For n a power of two: the geometric sequence starting at 2^(-8/n) with
    ratio 2^(-8/n) (n = 8: 1/2, 1/4, ..., 1/256; for n = 16 this is
    m_h = 2^(-h/2)). Otherwise: the slopes of the closest smaller power
    of two 2^k, then every other slope of the 2^(k+1) sequence, n - 2^k of them.
    """

    def power_of_two(n):
        first = 2.0 ** (-8.0 / n)
        return [first ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_two(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_heads - closest]


class ALiBiPosition(PositionEncoding):
    """ALiBi: score_ij += -m_h (i - j) for key j <= query i (Press et al. 2022).

    Press et al. 2022, arXiv:2108.12409, sec. 3. No parameters and nothing added to the embeddings. The bias is added to
    the already scaled scores q.k / sqrt(d), as in the paper's code (added
    inside the 1/sqrt(d), every slope would shrink by sqrt(d)); the slopes are ``alibi_slopes``.
    """

    slopes: torch.Tensor  # a buffer

    def __init__(self, cfg):
        super().__init__()
        self.register_buffer("slopes", torch.tensor(alibi_slopes(cfg.n_heads)), persistent=False)
        self._cache: tuple | None = None

    def score_bias(self, n_heads, q_len, k_len, q_start, k_start, device):
        key = (n_heads, q_len, k_len, q_start, k_start, device)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        i = torch.arange(q_start, q_start + q_len, device=device)[:, None]
        j = torch.arange(k_start, k_start + k_len, device=device)[None, :]
        bias = -self.bias_slopes(n_heads, device)[:, None, None] * (i - j).float()  # future keys are masked anyway
        self._cache = (key, bias)
        return bias

    def bias_slopes(self, n_heads, device):
        slopes = self.slopes if n_heads == self.slopes.numel() else torch.tensor(alibi_slopes(n_heads))
        return slopes.to(device=device, dtype=torch.float32)

    def _apply(self, fn, *args, **kwargs):
        self._cache = None
        return super()._apply(fn, *args, **kwargs)


def t5_bucket(relative_position: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's causal (unidirectional) relative-position bucket of key - query (Raffel et al. 2020).

    Distances n = query - key below num_buckets/2 get their own bucket; larger
    ones share logarithmically wider buckets up to max_distance, beyond which
    all distances share the last bucket (as ``_relative_position_bucket`` with
    ``bidirectional=False`` in the T5 / mesh-tensorflow code).
    """
    n = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    large = max_exact + (
        torch.log(n.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).long()
    large = large.clamp(max=num_buckets - 1)
    return torch.where(is_small, n, large)


class T5RelativeBias(PositionEncoding):
    """T5 relative attention bias: score_ij += b[bucket(j - i), h] (Raffel et al. 2020 sec. 2.1).

    One learned scalar per (bucket, head), shared by every layer as in T5.
    It is the clipped relative distance of Shaw et al. 2018 (arXiv:1803.02155,
    sec. 3.2: clip the distance so the model applies to longer texts) with
    log-spaced buckets and a scalar bias instead of an embedding.
    """

    def __init__(self, cfg,
                 num_buckets: Annotated[int, Arg("relative-position buckets (learned scalar per bucket and head)",
                                                 min=2)] = 32,
                 max_distance: Annotated[int, Arg("distances beyond this share the last bucket", min=2)] = 128):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bias = nn.Embedding(num_buckets, cfg.n_heads)

    def score_bias(self, n_heads, q_len, k_len, q_start, k_start, device):
        if n_heads != self.n_heads:
            raise ValueError(f"t5 bias was built for {self.n_heads} heads, asked for {n_heads}")
        i = torch.arange(q_start, q_start + q_len, device=device)[:, None]
        j = torch.arange(k_start, k_start + k_len, device=device)[None, :]
        buckets = t5_bucket(j - i, self.num_buckets, self.max_distance)
        return self.bias(buckets).permute(2, 0, 1)  # [H, Tq, Tk]


class NoPosition(PositionEncoding):
    """NoPE: no position information at all; a causal decoder can still infer
    order from the mask (Haviv et al. 2022; Kazemnejad et al. 2023)."""

    def __init__(self, cfg):
        super().__init__()


def _rope_check(cfg, params):
    if cfg.head_dim % 2:
        return [f"RoPE needs an even head dim; model.head_dim = {cfg.head_dim}"
                + ("" if cfg.head_dim * cfg.n_heads != cfg.d_model else " (d_model / n_heads)")]
    return []


def _t5_check(cfg, params):
    if params["max_distance"] <= params["num_buckets"] // 2:
        return [f"max_distance={params['max_distance']} must exceed num_buckets/2="
                f"{params['num_buckets'] // 2}"]
    return []


# Cost functions (harness/contracts/cost.py conventions): trainable parameters only;
# adding, rotating and biasing are elementwise, so they count no FLOPs.

def _learned_cost(cfg):
    return Cost(params=cfg.context * cfg.d_model)


def _t5_cost(cfg, num_buckets, max_distance):
    return Cost(params=num_buckets * cfg.n_heads)


def _free_cost(cfg, **params):
    return Cost()


@hookimpl
def register_components(register):
    register("position", "learned", LearnedPosition, cost=_learned_cost)
    # each factory's signature declares its parameters (type, default, doc, bounds)
    register("position", "sinusoidal", SinusoidalPosition, cost=_free_cost)
    register("position", "rope", RotaryPosition, check=_rope_check, cost=_free_cost)
    register("position", "alibi", ALiBiPosition, cost=_free_cost)
    register("position", "t5", T5RelativeBias, check=_t5_check, cost=_t5_cost)
    register("position", "nope", NoPosition, cost=_free_cost)
