"""State-space mixers (axis ``mixer``): Mamba (Gu & Dao 2023) and Mamba-2 (Dao & Gu 2024).

Mamba: Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective
State Spaces", arXiv:2312.00752, sec. 3 (the selective scan, Algorithm 2, and
the block, fig. 3). Mamba-2: Dao & Gu 2024, "Transformers are SSMs",
arXiv:2405.21060, sec. 6 (the chunked SSD algorithm) and sec. 7 (the block). Every factory is
``factory(config, position, **params)``; SSMs carry order in their recurrence
and use no position encoding, so ``position`` is ignored.

Both mixers decode with O(1) state: with ``ctx.cache`` set they keep
``{"conv": last d_conv - 1 conv inputs, "ssm": the recurrent state}`` in
``ctx.cache[ctx.layer]``. The prefill (``ctx.start == 0``) starts from zeros;
later calls, of one token or many, continue from the stored state, so cached
decoding computes exactly what a full recomputation does. The scans run in
fp32 with autocast off, whatever the training precision.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
import torch.nn as nn
import torch.nn.functional as F

from abl import Arg, hookimpl, own_init, residual_out
from abl.kernels.rmsnorm import rmsnorm
from abl.kernels.ssd_scan import ssd_chunked_flops, ssd_scan, ssd_sequential, ssd_step

# ---------------------------------------------------------------- shared parts


def causal_conv(x: torch.Tensor, conv: nn.Conv1d, state: torch.Tensor | None):
    """Depthwise causal conv over time: y_t = b + sum_k w_k * x_{t-K+1+k}. x [B, T, C].

    ``state`` [B, K-1, C] holds the K-1 inputs before x (zeros at the start,
    as the left padding of the reference implementation). Returns (y, new
    state). ``conv`` only holds the weights (nn.Conv1d layout, as in
    mamba_ssm); the K shifted products are written out because torch's flop
    counter overcounts the backward of a grouped conv (as if it were dense).
    """
    b, t, ch = x.shape
    k = conv.kernel_size[0]
    if state is None:
        state = x.new_zeros(b, k - 1, ch)
    xp = torch.cat([state.to(x.dtype), x], dim=1)
    w = conv.weight[:, 0, :]  # [C, K]
    y = xp[:, :t] * w[:, 0]
    for i in range(1, k):  # K taps (4), not a loop over time
        y = y + xp[:, i:i + t] * w[:, i]
    if conv.bias is not None:
        y = y + conv.bias
    return y, xp[:, xp.size(1) - (k - 1):]


def _dt_bias_init(n: int, dt_min: float, dt_max: float, floor: float = 1e-4) -> torch.Tensor:
    """softplus^-1 of dt ~ log-uniform[dt_min, dt_max] (the dt init of mamba_ssm, mamba_simple.py)."""
    dt = torch.exp(torch.rand(n) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=floor)
    return dt + torch.log(-torch.expm1(-dt))


def _cached_state(ctx):
    """The layer's recurrent state when continuing a cached decode, else None (start from zeros)."""
    if ctx is None or ctx.cache is None or ctx.start == 0:
        return None
    return ctx.cache.get(ctx.layer)


def _fp32(device: torch.device):
    """Autocast off: the scans run in fp32 (or the inputs' wider dtype), see ``_wide``."""
    return torch.autocast(device_type=device.type, enabled=False)


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))


# ---------------------------------------------------------------- Mamba-1 selective scan


def _blelloch_scan_(a: torch.Tensor, b: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """In place: b_t <- h_t of h_t = a_t h_{t-1} + b_t (h_{-1} = 0), along dim 1 of length 2^m.

    Blelloch's (1990) work-efficient scan, the one the Mamba paper uses (sec.
    3.3.2), with the associative operator (a1, b1) . (a2, b2) = (a1 a2, a2 b1 + b2)
    that composes two affine steps (associative because the recurrence is
    linear in h). The up-sweep leaves in every node the
    composition of its block; the down-sweep then hands each block the prefix
    of the block before it. O(T) work, 2 log2(T) parallel steps; each step
    reads and writes disjoint elements, so it works in place.
    ``reverse`` runs time backwards: h_t = a_t h_{t+1} + b_t (h_T = 0).
    """
    t = a.size(1)
    aa, bb = a, b
    while aa.size(1) > 1:  # up-sweep: in each pair the later node absorbs the earlier one
        aa, bb = aa.unflatten(1, (-1, 2)), bb.unflatten(1, (-1, 2))
        late, early = (0, 1) if reverse else (1, 0)
        bb[:, :, late].addcmul_(aa[:, :, late], bb[:, :, early])
        aa[:, :, late].mul_(aa[:, :, early])
        aa, bb = aa[:, :, late], bb[:, :, late]
    s = t // 4
    while s >= 1:  # down-sweep over the nodes at stride s, in pairs
        if reverse:  # the second child of pair j takes the suffix of pair j+1
            aa, bb = a[:, ::s].unflatten(1, (-1, 2)), b[:, ::s].unflatten(1, (-1, 2))
            bb[:, :-1, 1].addcmul_(aa[:, :-1, 1], bb[:, 1:, 0])
        else:  # the first child of pair j takes the prefix of pair j-1
            aa, bb = a[:, s - 1::s].unflatten(1, (-1, 2)), b[:, s - 1::s].unflatten(1, (-1, 2))
            bb[:, 1:, 0].addcmul_(aa[:, 1:, 0], bb[:, :-1, 1])
        s //= 2
    return b


def _padded(x: torch.Tensor, n: int) -> torch.Tensor:
    """A copy of x zero-padded to length n along dim 1 (the scan works in place on it)."""
    out = x.new_empty(x.size(0), n, *x.shape[2:])
    out[:, :x.size(1)] = x
    out[:, x.size(1):] = 0
    return out


class LinearScan(torch.autograd.Function):
    """h = scan(a, b), h_t = a_t h_{t-1} + b_t, with a scan for the backward too (Mamba
    sec. 3.3.2 recomputes rather than storing the scan's intermediate nodes).

    The adjoint of a linear recurrence is the same recurrence run backwards:
    g_t = dL/dh_t + a_{t+1} g_{t+1}; then dL/db_t = g_t and dL/da_t = g_t h_{t-1}.
    Only a and h are saved. The length is padded to a power of two with zeros
    at the end, which changes nothing before it (and adds nothing after it
    when running backwards).
    """

    @staticmethod
    def forward(ctx, a, b):
        t = a.size(1)
        n = 1 << (t - 1).bit_length()
        h = _blelloch_scan_(_padded(a, n), _padded(b, n))[:, :t]
        ctx.save_for_backward(a, h)
        return h

    @staticmethod
    def backward(ctx, grad_h):
        a, h = ctx.saved_tensors
        t = a.size(1)
        n = 1 << (t - 1).bit_length()
        g = _blelloch_scan_(_padded(a[:, 1:], n), _padded(grad_h, n), reverse=True)[:, :t]
        grad_a = torch.empty_like(a)
        grad_a[:, 0] = 0
        torch.mul(g[:, 1:], h[:, :-1], out=grad_a[:, 1:])
        return grad_a, g


def _discretise(u, dt, A, Bm):
    """exp(dt A) and dt B u (zero-order hold for A, Euler for B: Mamba sec. 2, eq. 4, and its reference code)."""
    decay = torch.exp(dt[..., None] * A)                  # [B, T, E, N]
    inp = (dt * u)[..., None] * Bm[:, :, None, :]          # [B, T, E, N]
    return decay, inp


def selective_scan(u, dt, A, Bm, Cm, initial_state=None):
    """Mamba-1 selective scan, parallel form (Gu & Dao 2023, Algorithm 2; D is added by the caller).

    u, dt [B, T, E]; A [E, N]; Bm, Cm [B, T, N]; state [B, E, N].
    Returns (y [B, T, E], final state [B, E, N]).
    """
    decay, inp = _discretise(u, dt, A, Bm)
    if initial_state is not None:  # h_0 = a_0 h_init + b_0
        inp[:, 0] += decay[:, 0] * initial_state
    h = LinearScan.apply(decay, inp)
    y = (h * Cm[:, :, None, :]).sum(-1)
    return y, h[:, -1]


def selective_scan_sequential(u, dt, A, Bm, Cm, initial_state=None):
    """The same recurrence, one step at a time (the ground truth for ``selective_scan``)."""
    decay, inp = _discretise(u, dt, A, Bm)
    h = initial_state if initial_state is not None else u.new_zeros(u.size(0), *A.shape)
    ys = []
    for t in range(u.size(1)):
        h = decay[:, t] * h + inp[:, t]
        ys.append(torch.einsum("ben,bn->be", h, Cm[:, t]))
    return torch.stack(ys, dim=1), h


# the parameters Mamba and Mamba-2 share: their type, doc and bounds (each block's signature gives the default)
DState = Annotated[int, Arg("SSM state size N per channel (Mamba) or per head dim (Mamba-2)", min=1)]
DConv = Annotated[int, Arg("width of the causal depthwise conv", min=1)]
Expand = Annotated[int, Arg("inner width / d_model", min=1)]
DtMin = Annotated[float, Arg("dt is initialised log-uniform in [dt_min, dt_max]", min=1e-6)]
DtMax = Annotated[float, Arg("see dt_min", min=1e-6)]
Bias = Annotated[bool, Arg("biases on in_proj and out_proj")]
ConvBias = Annotated[bool, Arg("bias on the conv")]


class Mamba(nn.Module):
    """The Mamba-1 block (Gu & Dao 2023, arXiv:2312.00752, sec. 3.4, fig. 3).

    x, z = in_proj(u); x = silu(conv(x)); y = selective_scan(x) + D x;
    out = out_proj(y * silu(z)), with input-dependent dt = softplus(W_dt2 W_dt1 x),
    B = W_B x, C = W_C x and A = -exp(A_log) (S4D-real init, A_n = -(n+1)).
    """

    def __init__(self, cfg, position=None, d_state: DState = 16, d_conv: DConv = 4, expand: Expand = 2,
                 dt_rank: Annotated[int, Arg("rank of the dt projection; 0 = ceil(d_model / 16)", min=0)] = 0,
                 dt_min: DtMin = 0.001, dt_max: DtMax = 0.1, bias: Bias = False, conv_bias: ConvBias = True):
        super().__init__()
        d = cfg.d_model
        e = expand * d
        self.d_inner, self.d_state = e, d_state
        self.dt_rank = dt_rank or math.ceil(d / 16)
        self.in_proj = nn.Linear(d, 2 * e, bias=bias)
        self.conv = nn.Conv1d(e, e, d_conv, groups=e, bias=conv_bias)
        self.x_proj = nn.Linear(e, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, e, bias=True)
        # dt init of mamba_simple.py: the skeleton's normal init must not overwrite it
        own_init(self.dt_proj)
        with torch.no_grad():
            nn.init.uniform_(self.dt_proj.weight, -self.dt_rank ** -0.5, self.dt_rank ** -0.5)
            self.dt_proj.bias.copy_(_dt_bias_init(e, dt_min, dt_max))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(e, 1))
        self.D = nn.Parameter(torch.ones(e))
        self.out_proj = residual_out(nn.Linear(e, d, bias=bias))

    def forward(self, x, ctx=None):
        state = _cached_state(ctx)
        u, z = self.in_proj(x).chunk(2, dim=-1)
        u, conv_state = causal_conv(u, self.conv, None if state is None else state["conv"])
        u = F.silu(u)
        dt, Bm, Cm = self.x_proj(u).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = F.softplus(self.dt_proj(dt))
        with _fp32(x.device):
            u = _wide(u)
            y, ssm_state = selective_scan(u, _wide(dt), -torch.exp(_wide(self.A_log)), _wide(Bm), _wide(Cm),
                                          None if state is None else state["ssm"])
            y = y + u * self.D
        if ctx is not None and ctx.cache is not None:  # copies: the views would keep whole sequences alive
            ctx.cache[ctx.layer] = {"conv": conv_state.clone(), "ssm": ssm_state.clone()}
        return self.out_proj(y * F.silu(_wide(z)))


# ---------------------------------------------------------------- Mamba-2


class GatedRMSNorm(nn.Module):
    """RMSNorm(y * silu(z)) * w over each group of channels.

    Mamba-2 sec. 7.1 ("extra normalization"); mamba_ssm's RMSNormGated with
    norm_before_gate=False and group size d_inner / n_groups.
    """

    def __init__(self, dim: int, groups: int = 1, eps: float = 1e-5):
        super().__init__()
        self.groups, self.eps = groups, eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, y, z):
        y = y * F.silu(z)
        g = y.unflatten(-1, (self.groups, -1))
        return rmsnorm(g, None, None, self.eps).flatten(-2) * self.weight


class Mamba2(nn.Module):
    """The Mamba-2 block (Dao & Gu 2024, arXiv:2405.21060, sec. 7).

    One in_proj gives z, xBC and dt; a depthwise causal conv + SiLU acts on
    x, B and C together; the SSD scan has a scalar A per head and B, C shared
    by each of ``n_groups`` groups of heads; then y + D x, the gated RMSNorm
    and out_proj. The scan is the op ``abl.kernels.ssd_scan.ssd_scan`` (the
    chunked torch reference ``ssd_chunked``, or its Triton forward under
    ``train.kernels`` = triton).
    """

    def __init__(self, cfg, position=None, d_state: DState = 64, d_conv: DConv = 4, expand: Expand = 2,
                 head_dim: Annotated[int, Arg("SSD head dimension P; heads = expand * d_model / head_dim",
                                              min=1)] = 32,
                 n_groups: Annotated[int, Arg("groups of heads sharing B and C", min=1)] = 1,
                 chunk_size: Annotated[int, Arg("chunk length L of the SSD algorithm", min=1)] = 64,
                 dt_min: DtMin = 0.001, dt_max: DtMax = 0.1, bias: Bias = False, conv_bias: ConvBias = True,
                 norm_eps: Annotated[float, Arg("epsilon of the gated RMSNorm", min=0.0)] = 1e-5):
        super().__init__()
        d = cfg.d_model
        e = expand * d
        self.d_inner, self.d_state, self.head_dim, self.n_groups = e, d_state, head_dim, n_groups
        self.n_heads = e // head_dim
        self.chunk_size = chunk_size
        conv_dim = e + 2 * n_groups * d_state
        self.in_proj = nn.Linear(d, 2 * e + 2 * n_groups * d_state + self.n_heads, bias=bias)
        self.conv = nn.Conv1d(conv_dim, conv_dim, d_conv, groups=conv_dim, bias=conv_bias)
        self.dt_bias = nn.Parameter(_dt_bias_init(self.n_heads, dt_min, dt_max))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.n_heads).uniform_(1, 16)))  # A_init_range
        self.D = nn.Parameter(torch.ones(self.n_heads))
        self.norm = GatedRMSNorm(e, n_groups, norm_eps)
        self.out_proj = residual_out(nn.Linear(e, d, bias=bias))

    def forward(self, x, ctx=None):
        b, t, _ = x.shape
        state = _cached_state(ctx)
        e, gn, h, p = self.d_inner, self.n_groups * self.d_state, self.n_heads, self.head_dim
        z, xbc, dt = self.in_proj(x).split([e, e + 2 * gn, h], dim=-1)
        xbc, conv_state = causal_conv(xbc, self.conv, None if state is None else state["conv"])
        u, Bm, Cm = F.silu(xbc).split([e, gn, gn], dim=-1)
        with _fp32(x.device):
            u = _wide(u).unflatten(-1, (h, p))
            Bm = _wide(Bm).unflatten(-1, (self.n_groups, self.d_state))
            Cm = _wide(Cm).unflatten(-1, (self.n_groups, self.d_state))
            dt = F.softplus(_wide(dt) + self.dt_bias)
            A = -torch.exp(_wide(self.A_log))
            h0 = None if state is None else state["ssm"]
            if t == 1 and h0 is not None:  # decoding: one recurrent step
                y, ssm_state = ssd_step(u[:, 0], dt[:, 0], A, Bm[:, 0], Cm[:, 0], h0)
                y = y[:, None]
            else:
                y, ssm_state = ssd_scan(u, dt, A, Bm, Cm, self.chunk_size, h0)
            y = (y + u * self.D[:, None]).reshape(b, t, e)
        if ctx is not None and ctx.cache is not None:  # copies: the views would keep whole sequences alive
            ctx.cache[ctx.layer] = {"conv": conv_state.clone(), "ssm": ssm_state.clone()}
        return self.out_proj(self.norm(y, _wide(z)))


# ---------------------------------------------------------------- registration


def _mamba_cost(cfg, d_state=16, d_conv=4, expand=2, dt_rank=0, bias=False, conv_bias=True, **_):
    """Mamba-1 cost: the four projections are the counted FLOPs; the conv (K taps per channel),
    the discretisation, the scan and its C-contraction are elementwise (O(T E N) work)."""
    from abl import Cost, linear_flops, linear_params

    d = cfg.d_model
    e, n, r = expand * d, d_state, dt_rank or math.ceil(d / 16)
    params = (linear_params(d, 2 * e, bias) + e * d_conv + (e if conv_bias else 0)
              + linear_params(e, r + 2 * n, False) + linear_params(r, e, True)
              + e * n + e + linear_params(e, d, bias))
    flops = linear_flops(d, 2 * e) + linear_flops(e, r + 2 * n) + linear_flops(r, e) + linear_flops(e, d)
    # saved for backward: in_proj input and output, conv out, silu out, x_proj out, dt,
    # the scan's decay (E x N) and its states (E x N at the scan's power-of-two padded
    # length), y, the gate, the out_proj input, and the softplus / gate products
    t = cfg.context
    t_scan = 1 << max(0, (t - 1).bit_length())
    saved = d + 2 * e + e + e + (r + 2 * n) + e + e * n + e * n * t_scan / t + 6 * e
    # at the peak, inside the reverse scan of the backward, about two E x N temporaries at the
    # padded length are live beyond the saved activations (calibrated against MemTracker)
    return Cost(params=params, flops_per_token=flops, activation_elements_per_token=saved,
                transient_elements_per_token=2 * e * n * t_scan / t,
                state_elements_per_sequence=e * n + e * (d_conv - 1))


def _mamba2_cost(cfg, d_state=64, d_conv=4, expand=2, head_dim=32, n_groups=1, chunk_size=64,
                 bias=False, conv_bias=True, **_):
    """Mamba-2 cost: the two projections and the five contractions of the chunked SSD scan."""
    from abl import Cost, linear_flops, linear_params

    d = cfg.d_model
    e = expand * d
    h, gn = e // head_dim, n_groups * d_state
    conv_dim = e + 2 * gn
    params = (linear_params(d, 2 * e + 2 * gn + h, bias) + conv_dim * d_conv + (conv_dim if conv_bias else 0)
              + 3 * h + e + linear_params(e, d, bias))
    scan, scan_useful = ssd_chunked_flops(cfg.context, chunk_size, h, head_dim, d_state, n_groups)
    proj = linear_flops(d, 2 * e + 2 * gn + h) + linear_flops(e, d)  # the conv is elementwise
    chunk = min(chunk_size, cfg.context)
    # saved on the reference path (harness/kernels/ssd_scan.py ssd_chunked), per token: in_proj
    # in/out; the conv output (with its causal padding), the conv activation's input and output;
    # per head, the chunk's L x L decay, C B^T and their product; B and C spread to the heads
    # and the contraction copies; e-wide: X = dt x, its copies for the two contractions, the
    # diagonal and off-diagonal outputs, the gated norm's inputs and output; the chunk-entry
    # states (H x P x N per chunk) and a few H-wide factors
    t = cfg.context
    saved = (d + (2 * e + 2 * gn + h) + conv_dim * (t + d_conv - 1) / t + 2 * conv_dim + 3 * h * chunk
             + 3 * h * d_state + 9 * e + h * head_dim * d_state / chunk + 4 * h)
    return Cost(params=params, flops_per_token=proj + scan, useful_flops_per_token=proj + scan_useful,
                activation_elements_per_token=saved,
                state_elements_per_sequence=h * head_dim * d_state + conv_dim * (d_conv - 1))


def _mamba2_check(cfg, params):
    e = params["expand"] * cfg.d_model
    errs = []
    if e % params["head_dim"]:
        errs.append(f"expand * d_model = {e} is not divisible by head_dim={params['head_dim']}")
    elif (e // params["head_dim"]) % params["n_groups"]:
        errs.append(f"the {e // params['head_dim']} heads do not split into n_groups={params['n_groups']}")
    return errs


@hookimpl
def register_components(register):
    # each block's signature declares its parameters (type, default, doc, bounds)
    register("mixer", "mamba", Mamba,
             doc="Mamba-1 block: selective scan with input-dependent dt, B, C (Gu & Dao 2023).",
             cost=_mamba_cost, reference=selective_scan_sequential)
    register("mixer", "mamba2", Mamba2,
             doc="Mamba-2 block: multi-head SSD, scalar A, gated RMSNorm (Dao & Gu 2024).",
             cost=_mamba2_cost, check=_mamba2_check, reference=ssd_sequential)
