"""Feed-forward sublayers (axis ``ffn``): dense activations and the GLU family.

The dense FFN of Vaswani et al. 2017 (arXiv:1706.03762, sec. 3.3, eq. 2) with
ReLU, GELU (Hendrycks & Gimpel 2016, arXiv:1606.08415) or SiLU (Elfwing et
al. 2018, arXiv:1702.03118); gated linear units (Dauphin et al. 2017,
arXiv:1612.08083) and their variants and sizing from Shazeer 2020, "GLU
Variants Improve Transformer", arXiv:2002.05202. Every factory is ``factory(config, **params)``.

Sizing rule. A dense FFN has two matrices, d x d_ff and d_ff x d, with
d_ff = ratio * d_model and ratio 4 by default. A gated FFN has three (gate,
up, down), so its default ratio is 2/3 of that, 8/3: 3 * 8/3 d^2 = 2 * 4 d^2,
and the parameter counts match (Shazeer 2020 sec. 2).
Hidden sizes are rounded up to a multiple of ``multiple_of``.
"""

from __future__ import annotations

from typing import Annotated

import torch
import torch.nn as nn
import torch.nn.functional as F

from abl import Arg, hookimpl, params_of, residual_out
from abl.kernels import swiglu as glu_ops

DENSE_RATIO = 4.0
GATED_RATIO = DENSE_RATIO * 2 / 3  # 8/3: three matrices instead of two

# the parameters of both FFN kinds (each class's signature gives the default)
Ratio = Annotated[float, Arg("hidden size / d_model", min=1e-3)]
Bias = Annotated[bool, Arg("biases on the projections")]
MultipleOf = Annotated[int, Arg("round the hidden size up to a multiple of this", min=1)]


def hidden_size(d_model: int, ratio: float, multiple_of: int) -> int:
    h = int(round(ratio * d_model))
    return max(multiple_of, multiple_of * ((h + multiple_of - 1) // multiple_of))


def relu2(x):
    """Squared ReLU, max(0, x)^2 (So et al. 2021, "Primer", sec. 3)."""
    return torch.square(F.relu(x))


def identity(x):
    return x


# gated variants with a fused Triton kernel for act(gate) * up (harness/kernels/swiglu.py)
KERNELS = {"swiglu": "swiglu", "geglu": "geglu"}

# name -> (activation, gated). Dense: act(x W1) W2. Gated: (act(x W) * x V) W2,
# with the activations of Shazeer 2020 eqs. 1-6 (GLU uses the sigmoid, Dauphin
# et al. 2017; "bilinear" has none).
VARIANTS: dict[str, tuple] = {
    "relu": (F.relu, False),
    "gelu": (F.gelu, False),  # exact erf form, Hendrycks & Gimpel 2016 sec. 2
    "silu": (F.silu, False),  # swish with beta = 1
    "relu2": (relu2, False),
    "glu": (torch.sigmoid, True),
    "reglu": (F.relu, True),
    "geglu": (F.gelu, True),
    "swiglu": (F.silu, True),
    "bilinear": (identity, True),
}


class DenseFFN(nn.Module):
    """y = W2 act(W1 x + b1) + b2 (Vaswani et al. 2017, eq. 2)."""

    def __init__(self, cfg, activation, ratio: Ratio = DENSE_RATIO, bias: Bias = False,
                 multiple_of: MultipleOf = 8, hidden: int | None = None):
        super().__init__()
        h = hidden or hidden_size(cfg.d_model, ratio, multiple_of)
        self.act = activation
        self.up = nn.Linear(cfg.d_model, h, bias=bias)
        self.down = residual_out(nn.Linear(h, cfg.d_model, bias=bias))

    def forward(self, x, ctx=None):
        return self.down(self.act(self.up(x)))


class GatedFFN(nn.Module):
    """y = W2 (act(W_gate x + b_g) * (W_up x + b_u)) + b2 (Shazeer 2020, sec. 2).

    The gate and up projections are one matmul; the first half is the gate.
    ``kernel`` names the op of harness/kernels/swiglu.py that computes
    act(gate) * up ("swiglu" or "geglu"; fused under ``train.kernels`` = triton).
    """

    def __init__(self, cfg, activation, ratio: Ratio = GATED_RATIO, bias: Bias = False,
                 multiple_of: MultipleOf = 8, hidden: int | None = None, kernel: str | None = None):
        super().__init__()
        h = hidden or hidden_size(cfg.d_model, ratio, multiple_of)
        self.act, self.kernel = activation, kernel
        self.gate_up = nn.Linear(cfg.d_model, 2 * h, bias=bias)
        self.down = residual_out(nn.Linear(h, cfg.d_model, bias=bias))

    def forward(self, x, ctx=None):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        if self.kernel is not None:  # the op picks the fused kernel or torch's act(gate) * up
            return self.down(getattr(glu_ops, self.kernel)(gate, up))
        return self.down(self.act(gate) * up)


def make_ffn(name: str, cfg, hidden: int, bias: bool = False) -> nn.Module:
    """One FFN of variant ``name`` with an explicit hidden size (used by MoE experts)."""
    act, gated = VARIANTS[name]
    if gated:
        return GatedFFN(cfg, act, bias=bias, hidden=hidden, kernel=KERNELS.get(name))
    return DenseFFN(cfg, act, bias=bias, hidden=hidden)


# hidden-wide tensors an activation keeps for its backward beyond what its
# neighbours keep anyway: ReLU needs only its output (which the down
# projection keeps as its input); the identity of a bilinear GLU keeps nothing.
ACT_KEEPS = {"relu": 0, "bilinear": 0}


def ffn_cost(d_model: int, hidden: int, gated: bool, bias: bool, act_keeps: int = 1):
    """Cost of one FFN (harness/contracts/cost.py conventions).

    FLOPs: the two (dense) or three (gated) projections. Saved for backward
    (Korthikanti et al. 2022, arXiv:2205.05198, sec. 4.1): the input, the up (and gate) projection's output,
    what the activation keeps (``act_keeps`` hidden-wide tensors, see
    ``ACT_KEEPS``) and, gated, the product that the down projection reads.
    """
    from abl import Cost, linear_flops, linear_params

    n_in = 2 * hidden if gated else hidden
    params = linear_params(d_model, n_in, bias) + linear_params(hidden, d_model, bias)
    flops = linear_flops(d_model, n_in) + linear_flops(hidden, d_model)
    saved = d_model + n_in + act_keeps * hidden + (hidden if gated else 0)
    return Cost(params=params, flops_per_token=flops, activation_elements_per_token=saved)


def _params(gated: bool):
    """A variant's grid parameters: its FFN class's own declarations (``hidden`` and ``kernel`` are set
    by the code that builds it)."""
    return params_of(GatedFFN if gated else DenseFFN, "ratio", "bias", "multiple_of")


def _factory(name):
    act, gated = VARIANTS[name]

    def factory(cfg, **p):
        if gated:
            return GatedFFN(cfg, act, kernel=KERNELS.get(name), **p)
        return DenseFFN(cfg, act, **p)

    kind = "gated (GLU family)" if gated else "dense"
    factory.__doc__ = f"{kind} FFN with activation {name}"
    return factory


def _cost(name):
    gated = VARIANTS[name][1]

    def cost(cfg, ratio=GATED_RATIO if gated else DENSE_RATIO, bias=False, multiple_of=8, **_):
        return ffn_cost(cfg.d_model, hidden_size(cfg.d_model, ratio, multiple_of), gated, bias,
                        ACT_KEEPS.get(name, 1))

    return cost


_DOCS = {
    "relu": "Dense FFN with a ReLU (Vaswani et al. 2017).",
    "gelu": "Dense FFN with a GELU, exact erf form (Hendrycks & Gimpel 2016).",
    "silu": "Dense FFN with a SiLU / swish-1 (Ramachandran et al. 2017).",
    "relu2": "Dense FFN with a squared ReLU (So et al. 2021, Primer).",
    "glu": "Gated FFN with a sigmoid gate (Dauphin et al. 2017; Shazeer 2020).",
    "reglu": "Gated FFN with a ReLU gate (Shazeer 2020).",
    "geglu": "Gated FFN with a GELU gate (Shazeer 2020).",
    "swiglu": "Gated FFN with a SiLU gate (Shazeer 2020; LLaMA, PaLM).",
    "bilinear": "Gated FFN without activation (Shazeer 2020).",
}


@hookimpl
def register_components(register):
    for name, (_, gated) in VARIANTS.items():
        register("ffn", name, _factory(name), params=_params(gated),
                 doc=_DOCS[name], cost=_cost(name), width="ratio")
