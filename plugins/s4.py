"""The diagonal state-space mixer S4D (axis ``mixer``, name ``s4``): the linear time-invariant SSM.

Gu, Gupta, Goel & Ré 2022, "On the Parameterization and Initialization of
Diagonal State Space Models", arXiv:2206.11893 (S4D). The layer is H = d_model
independent single-input single-output SSMs, one per channel (sec. 2):

    x'(t) = A x(t) + B u(t),  y(t) = C x(t) + D u(t),   A = diag(a_1 .. a_N) complex,

kept as N/2 complex modes whose conjugates are implicit (sec. 3, conjugate
symmetry: the real part of the kernel is taken twice, ``2 Re``). Discretised
with the zero-order hold (sec. 3, discretisation): dA = exp(dt A),
dB = (dt A)^-1 (exp(dt A) - I) dt B. Training computes the convolution kernel
K_l = 2 Re(C dA^l dB) (sec. 3, the Vandermonde kernel) and applies it with an
FFT convolution (S4, Gu, Goel & Ré 2021, arXiv:2111.00396, sec. 3); cached
decoding runs the recurrence x_t = dA x_{t-1} + dB u_t, y_t = 2 Re(C x_t) + D u_t.

Initialisations (sec. 4, ``init``):

- ``lin``: S4D-Lin, a_n = -1/2 + i pi n, B = 1;
- ``inv``: S4D-Inv, a_n = -1/2 + i N/pi (N/(2n+1) - 1), B = 1;
- ``legs``: S4D-LegS, the eigenvalues of the normal part of the HiPPO-LegS
  matrix, A^(N) = A + P P^T with P_n = sqrt(n + 1/2) (S4D sec. 4; S4 sec. 3 and
  the HiPPO-LegS matrix of Gu et al. 2020, arXiv:2008.07669, Theorem 2), with B
  projected onto its eigenvectors, B = V^* B_LegS, B_LegS,n = sqrt(2n + 1). Two departures from the
  authors' S4D-LegS (state-spaces, ``dplr`` with init ``legs``, which calls ``nplr('legs', N, B_clip=2.0)``):
  the authors clamp Im B to [-2, 2] and abl does not (at N = 64, 11 of the 32 modes have
  |Im B| > 2, up to 41); and B is V^* B_LegS unhalved, which the authors' code also keeps, although
  its own comment notes that the S4D paper's theory halves B to match the DPLR form. So abl's B is
  twice the theory's value, and equal to the authors' code's before its clamp. The eigenvalues are
  the authors' (tests/test_s4.py).

dt is log-uniform in [dt_min, dt_max] per channel, C ~ complex N(0, 1), A
is parameterised as -exp(log_re) + i im (the real part kept negative through
exp, one of the parameterisations the paper compares), D ~ N(0, 1). The block around the SSM is the S4D paper's (and its
reference ``s4d.py``'s): y = GELU(SSM(u) + D u), then a position-wise linear
H -> 2H and a GLU. One deviation: the reference trains A, B and dt at a
smaller learning rate (1e-3) without weight decay; the harness has one
learning rate, and its optimizer decays every parameter of 2 or more
dimensions (here A, B and C; the 1-d dt and D are not decayed).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Annotated, Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

from abl import Arg, Cost, KVCache, hookimpl, linear_flops, linear_params, residual_out

Init = Literal["lin", "inv", "legs"]
INITS: tuple[str, ...] = get_args(Init)


@lru_cache(maxsize=16)
def legs_diagonal(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The S4D-LegS (A, B) for state size n (even): n/2 complex modes, fp64.

    HiPPO-LegS (Gu et al. 2020, Theorem 2): A_nk = -sqrt(2n+1) sqrt(2k+1) for n > k, -(n+1) for n = k,
    0 above; B_n = sqrt(2n+1). A + P P^T with P_n = sqrt(n + 1/2) is -1/2 I plus a skew-symmetric
    matrix (S4, arXiv:2111.00396, the normal plus low-rank form), so its eigenvalues are
    -1/2 + i w with w the eigenvalues of the Hermitian -i (A + P P^T) (``eigh``). One of each
    conjugate pair is kept; B is projected onto the eigenvectors, V^* B (S4D sec. 4).
    """
    q = torch.arange(n, dtype=torch.float64)
    r = torch.sqrt(2 * q + 1)
    a = -torch.tril(r[:, None] * r[None, :], diagonal=-1) - torch.diag(q + 1)
    p = torch.sqrt(q + 0.5)
    normal = a + p[:, None] * p[None, :]
    re = torch.diagonal(normal).mean()
    w_im, v = torch.linalg.eigh(normal.to(torch.complex128) * -1j)
    order = torch.argsort(w_im)
    w_im, v = w_im[order][: n // 2], v[:, order][:, : n // 2]  # the modes of negative imaginary part
    a_diag = re + 1j * w_im
    b = v.conj().transpose(0, 1) @ r.to(torch.complex128)
    return a_diag, b


def s4d_init(n: int, init: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B) at initialisation for one channel: n/2 complex modes each (S4D sec. 4)."""
    half = torch.arange(n // 2, dtype=torch.float64)
    if init == "legs":
        return legs_diagonal(n)
    if init == "lin":
        im = math.pi * half
    elif init == "inv":
        im = n / math.pi * (n / (2 * half + 1) - 1)
    else:
        raise ValueError(f"unknown S4D init {init!r}; one of {list(INITS)}")
    return torch.complex(torch.full_like(half, -0.5), im), torch.ones(n // 2, dtype=torch.complex128)


def zoh(log_dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Zero-order hold (S4D sec. 3): (dt A, dA = exp(dt A), dB = (exp(dt A) - 1) / A * B).

    log_dt [H]; A, B [H, N/2] complex. ``(exp(dt A) - 1) / A`` is (dt A)^-1 (exp(dt A) - I) dt.
    """
    dta = A * torch.exp(log_dt)[:, None]
    da = torch.exp(dta)
    return dta, da, B * torch.expm1(dta) / A


def s4d_kernel(log_dt, A, B, C, length: int) -> torch.Tensor:
    """K [H, L]: K_l = 2 Re(sum_n C_n dA_n^l dB_n) (S4D sec. 3; a Vandermonde product in dt A).

    Written as an elementwise product and a sum (not an einsum), so the kernel's O(H N L) work is
    elementwise as the cost model counts it."""
    dta, _, db = zoh(log_dt, A, B)
    vander = torch.exp(dta[..., None] * torch.arange(length, device=dta.device, dtype=dta.real.dtype))
    return 2 * ((C * db)[..., None] * vander).sum(1).real


def fft_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Causal convolution y_t = sum_{s<=t} k_{t-s} u_s by FFT of length 2L (no wrap-around). u [B, H, L], k [H, L]."""
    length = u.size(-1)
    y = torch.fft.irfft(torch.fft.rfft(u, n=2 * length) * torch.fft.rfft(k, n=2 * length), n=2 * length)
    return y[..., :length]


def s4d_recurrence(u, log_dt, A, B, C, state=None):
    """The recurrence, one step at a time (the ground truth for the kernel). u [B, H, L] real.

    x_t = dA x_{t-1} + dB u_t, y_t = 2 Re(sum_n C_n x_t,n). Returns (y [B, H, L], x_L [B, H, N/2] complex).
    """
    _, da, db = zoh(log_dt, A, B)
    x = u.new_zeros(u.size(0), *A.shape, dtype=A.dtype) if state is None else state
    ys = []
    for t in range(u.size(-1)):
        x = da * x + db * u[..., t, None]
        ys.append(2 * (C * x).sum(-1).real)
    return torch.stack(ys, dim=-1), x


def _complex(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_complex(t)


class DiagSSM(nn.Module):
    """H independent diagonal SSMs with the skip D (S4D sec. 2-4), the core of ``S4D`` and of H3's
    diagonal SSM: ``forward(u [B, H, L], state, cached)`` -> (y [B, H, L], the state after u).

    In training (``cached`` False) the output is the FFT convolution and no state is formed; with a
    cache it continues from ``state`` (None: zeros), the complex modes [B, H, N/2].
    """

    def __init__(self, h: int, d_state: int, init: str = "lin", dt_min: float = 0.001, dt_max: float = 0.1):
        super().__init__()
        a, b = s4d_init(d_state, init)
        self.log_dt = nn.Parameter(torch.rand(h) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        self.log_A_real = nn.Parameter(torch.log(-a.real).float().repeat(h, 1))
        self.A_imag = nn.Parameter(a.imag.float().repeat(h, 1))
        self.B = nn.Parameter(torch.view_as_real(b.to(torch.complex64)).repeat(h, 1, 1))
        self.C = nn.Parameter(torch.view_as_real(torch.randn(h, d_state // 2, dtype=torch.complex64)))
        self.D = nn.Parameter(torch.randn(h))

    def ssm(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log_dt, A, B, C) in ``dtype`` (fp32 or wider) and its complex counterpart."""
        a = torch.complex(-torch.exp(self.log_A_real.to(dtype)), self.A_imag.to(dtype))
        return self.log_dt.to(dtype), a, _complex(self.B.to(dtype)), _complex(self.C.to(dtype))

    def forward(self, u: torch.Tensor, state: torch.Tensor | None = None, cached: bool = False):
        """u [B, H, L] in fp32 or wider (the SSM runs in its dtype)."""
        log_dt, a, b, c = self.ssm(u.dtype)
        if cached:
            y, state = continue_from(u, log_dt, a, b, c, state)
        else:
            y, state = fft_conv(u, s4d_kernel(log_dt, a, b, c, u.size(-1))), None
        return y + u * self.D[:, None].to(u.dtype), state


def continue_from(u, log_dt, a, b, c, state):
    """Cached decoding: the SSM outputs of u [B, H, T] and the state after it, from ``state`` (None: zeros).

    One token is one step of the recurrence. A longer chunk (the prefill) is the convolution
    plus the decaying contribution of the state, 2 Re(C dA^(t+1) x_0), and the new state
    x_T = dA^T x_0 + sum_s dA^(T-1-s) dB u_s: the recurrence unrolled, not a second model.
    """
    t = u.size(-1)
    dta, da, db = zoh(log_dt, a, b)
    if t == 1:
        x = db * u[..., 0, None] if state is None else da * state + db * u[..., 0, None]
        return 2 * (c * x).sum(-1).real[..., None], x
    powers = torch.exp(dta[..., None] * torch.arange(t + 1, device=u.device, dtype=u.dtype))  # [H, N/2, T+1]
    y = fft_conv(u, 2 * ((c * db)[..., None] * powers[..., :t]).sum(1).real)
    x = ((db[..., None] * powers[..., :t].flip(-1))[None] * u[:, :, None, :].to(a.dtype)).sum(-1)
    if state is not None:
        y = y + 2 * ((c[..., None] * powers[..., 1:])[None] * state[..., None]).sum(2).real
        x = x + powers[..., t] * state
    return y, x


def fp32(device: torch.device):
    """Autocast off: the SSMs run in fp32 (or their input's wider dtype) whatever the training precision."""
    return torch.autocast(device_type=device.type, enabled=False)


def wide(t: torch.Tensor) -> torch.Tensor:
    """t in fp32, or in its own dtype where that is wider (fp64 in tests)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class S4D(nn.Module):
    """S4D layer (Gu, Gupta, Goel & Ré 2022, arXiv:2206.11893): H diagonal SSMs, FFT convolution in
    training, the recurrence for cached decoding; then GELU, a linear H -> 2H and a GLU.

    ``d_state`` is N, the state size of the paper (N/2 complex modes are stored, the conjugates
    implicit), and must be even.
    """

    def __init__(self, cfg, position=None,
                 d_state: Annotated[int, Arg("state size N per channel (N/2 complex modes are stored); even",
                                             min=2)] = 64,
                 init: Annotated[Init, Arg("A and B at init: S4D-Lin, S4D-Inv or S4D-LegS (S4D sec. 4)")] = "lin",
                 dt_min: Annotated[float, Arg("dt is initialised log-uniform in [dt_min, dt_max] per channel",
                                              min=1e-6)] = 0.001,
                 dt_max: Annotated[float, Arg("see dt_min", min=1e-6)] = 0.1):
        super().__init__()
        h = cfg.d_model
        self.ssm = DiagSSM(h, d_state, init, dt_min, dt_max)
        self.out_proj = residual_out(nn.Linear(h, 2 * h))

    def forward(self, x, ctx=None):
        cache = KVCache(ctx) if ctx is not None and ctx.cache is not None else None
        with fp32(x.device):
            kept = cache.state() if cache is not None else None
            y, state = self.ssm(wide(x).transpose(1, 2), None if kept is None else _complex(kept["ssm"]),
                                cache is not None)
            if cache is not None:
                cache.set_state(ssm=torch.view_as_real(state).clone())
            y = F.gelu(y).transpose(1, 2)
        return F.glu(self.out_proj(y.to(x.dtype)), dim=-1)


def diag_ssm_params(h: int, n: int) -> int:
    """Trainable parameters of ``DiagSSM``: dt and D (H each), A, B and C (N/2 complex = N reals each)."""
    return 2 * h + 3 * h * n


def _s4_check(cfg, params):
    return [] if params["d_state"] % 2 == 0 else [
        f"d_state={params['d_state']} must be even (S4D keeps N/2 complex modes and their conjugates)"]


def _s4_cost(cfg, d_state=64, **_):
    """Params: dt (H), A and B and C (N/2 complex each, 2 reals), D (H), the output linear H -> 2H with bias.

    Counted FLOPs: the output linear only; the FFT convolution (O(H L log L) per sequence) and the
    kernel's Vandermonde product (O(H N L) per sequence, batch-independent) are not matrix products
    and are not counted (as torch's flop counter)."""
    h, n = cfg.d_model, d_state
    params = diag_ssm_params(h, n) + linear_params(h, 2 * h, True)
    # Saved for backward, calibrated against torch's MemTracker over a training step (context 32 and
    # 64, batch 4 and 8): the kernel's Vandermonde powers and their product with C dB, complex
    # H x N/2 x L each, are kept once per forward for the whole batch (about 2.3 H N L reals); what
    # grows with the tokens is small next to them (the FFT products are freed before the peak).
    per_forward = 2.3 * h * n * cfg.context
    saved = h
    return Cost(params=params, flops_per_token=linear_flops(h, 2 * h), activation_elements_per_token=saved,
                activation_elements_per_forward=per_forward, state_elements_per_sequence=h * n)


@hookimpl
def register_components(register):
    # the layer's signature declares its parameters (type, default, doc, bounds)
    register("mixer", "s4", S4D,
             doc="S4D: diagonal linear time-invariant SSM, FFT convolution / recurrent decode (Gu et al. 2022).",
             cost=_s4_cost, check=_s4_check, reference=s4d_recurrence)
