"""Feed-forward sublayers (axis ``ffn``).

Seeds 000 sec. 6 (activations, GLU family) and 002 sec. 2.1 (FFN sizing):
a dense FFN has d_ff = ratio * d_model (ratio 4 by default); a gated FFN
defaults to ratio 8/3 so its three matrices match the dense FFN's two
(Shazeer 2020). Every factory is ``factory(config, **params)``.
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from harness.hookspecs import hookimpl
from harness.model import residual_out
from harness.registry import Param


def hidden_size(d_model: int, ratio: float, multiple_of: int) -> int:
    h = int(round(ratio * d_model))
    return max(multiple_of, multiple_of * ((h + multiple_of - 1) // multiple_of))


class DenseFFN(nn.Module):
    """y = W2 act(W1 x + b1) + b2."""

    def __init__(self, cfg, activation, ratio: float = 4.0, bias: bool = False, multiple_of: int = 8):
        super().__init__()
        h = hidden_size(cfg.d_model, ratio, multiple_of)
        self.act = activation
        self.up = nn.Linear(cfg.d_model, h, bias=bias)
        self.down = residual_out(nn.Linear(h, cfg.d_model, bias=bias))

    def forward(self, x, ctx=None):
        return self.down(self.act(self.up(x)))


class GatedFFN(nn.Module):
    """y = W2 (act(W_gate x) * (W_up x)) (GLU variants, Shazeer 2020)."""

    def __init__(self, cfg, activation, ratio: float = 8 / 3, bias: bool = False, multiple_of: int = 8):
        super().__init__()
        h = hidden_size(cfg.d_model, ratio, multiple_of)
        self.act = activation
        self.gate_up = nn.Linear(cfg.d_model, 2 * h, bias=bias)
        self.down = residual_out(nn.Linear(h, cfg.d_model, bias=bias))

    def forward(self, x, ctx=None):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.act(gate) * up)


def _params(ratio):
    return {
        "ratio": Param(ratio, doc="hidden size / d_model", min=1e-3),
        "bias": Param(False, doc="biases on the projections"),
        "multiple_of": Param(8, doc="round the hidden size up to a multiple of this", min=1),
    }


@hookimpl
def register_components(register):
    def gelu(cfg, **p):
        """Dense FFN with GELU (tanh-free, exact erf form)."""
        return DenseFFN(cfg, nn.GELU(), **p)

    def swiglu(cfg, **p):
        """Gated FFN with a Swish/SiLU gate (SwiGLU)."""
        return GatedFFN(cfg, F.silu, **p)

    register("ffn", "gelu", gelu, params=_params(4.0))
    register("ffn", "swiglu", swiglu, params=_params(8 / 3))
