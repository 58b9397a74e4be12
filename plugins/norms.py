"""Normalisation layers (axis ``norm``).

Definitions: LayerNorm from Ba et al. 2016, "Layer Normalization",
arXiv:1607.06450, sec. 3; RMSNorm from Zhang & Sennrich 2019, "Root Mean
Square Layer Normalization", arXiv:1910.07467, eq. 4; ScaleNorm from Nguyen
& Salazar 2019, "Transformers without Tears", arXiv:1910.05895, sec. 2.3;
BatchNorm from Ioffe & Szegedy 2015, "Batch Normalization", arXiv:1502.03167,
Algorithms 1 and 2. Every factory is ``factory(dim, **params)``.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from torch import nn

from abl import Arg, hookimpl
from abl.kernels.layernorm import layernorm
from abl.kernels.rmsnorm import rmsnorm


EPS_DOC = "added for numerical safety (see the class docstring for where)"
GAIN_DOC = "learnable per-channel scale gamma"


class LayerNorm(nn.Module):
    """y = (x - E[x]) / sqrt(Var[x] + eps) * gamma + beta  (Ba et al. 2016).

    The paper (Ba et al. 2016, arXiv:1607.06450, sec. 3) has no eps, and
    write-ups disagree on where it goes: torch puts it inside the square root
    (``eps_placement="inside"``, the default); some write sqrt(Var) + eps
    (``"outside"``). Variance is the biased (1/d) estimate in both.
    """

    def __init__(self, dim: int, eps: Annotated[float, Arg(EPS_DOC, min=0.0)] = 1e-5,
                 gain: Annotated[bool, Arg(GAIN_DOC)] = True,
                 bias: Annotated[bool, Arg("learnable per-channel shift beta")] = True,
                 eps_placement: Annotated[Literal["inside", "outside"],
                                          Arg("inside: sqrt(var + eps); outside: sqrt(var) + eps")] = "inside"):
        super().__init__()
        self.dim, self.eps, self.eps_placement = dim, eps, eps_placement
        self.weight = nn.Parameter(torch.ones(dim)) if gain else None
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x):
        return layernorm(x, self.weight, self.bias, self.eps, self.eps_placement)


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * gamma  (Zhang & Sennrich 2019).

    arXiv:1910.07467, eq. 4. The statistic is computed in fp32 whatever the input dtype. The paper's
    optional bias is the ``bias`` parameter (off by default, as in LLaMA).
    """

    def __init__(self, dim: int, eps: Annotated[float, Arg(EPS_DOC, min=0.0)] = 1e-6,
                 gain: Annotated[bool, Arg(GAIN_DOC)] = True,
                 bias: Annotated[bool, Arg("learnable per-channel shift (the paper's optional b)")] = False):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if gain else None
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x):
        return rmsnorm(x, self.weight, self.bias, self.eps)


class ScaleNorm(nn.Module):
    """y = g * x / max(||x||_2, eps), one scalar g initialised to sqrt(dim).

    Nguyen & Salazar 2019, sec. 2.3. With ``gain=False`` g stays sqrt(dim),
    which makes the output RMS 1 like the other norms.
    """

    def __init__(self, dim: int, eps: Annotated[float, Arg("lower bound on the L2 norm", min=0.0)] = 1e-5,
                 gain: Annotated[bool, Arg("learnable scalar g (init sqrt(dim)); False keeps it fixed")] = True):
        super().__init__()
        self.eps = eps
        g = torch.tensor(math.sqrt(dim))
        if gain:
            self.g = nn.Parameter(g)
        else:
            self.register_buffer("g", g)

    def forward(self, x):
        xf = x.float()
        norm = xf.norm(dim=-1, keepdim=True).clamp_min(self.eps)
        return (self.g * xf / norm).to(x.dtype)


class BatchNorm(nn.Module):
    """y = (x - mu_B) / sqrt(var_B + eps) * gamma + beta over the batch (Ioffe & Szegedy 2015).

    arXiv:1502.03167, Algorithm 1: in training, mu_B and var_B (biased) are taken per channel over
    every token of the batch, all positions of all sequences; the running averages (momentum
    ``momentum``, unbiased variance as Algorithm 2 and torch keep them) replace them in eval mode.

    In a causal language model this leaks: the statistics of position t include the tokens after
    t in its own sequence (and in the others), so in training the output at t depends on the
    future and the model can learn to read it. Training loss then falls below what eval mode (the
    running statistics, no leak) reaches; ``tests/test_norms_batchnorm.py`` shows it, and
    docs/variants.md records it. It is offered to measure that failure, not as a working LM norm.
    Statistics in fp32 whatever the input dtype.
    """

    running_mean: torch.Tensor
    running_var: torch.Tensor

    def __init__(self, dim: int, eps: Annotated[float, Arg("added to the batch variance", min=0.0)] = 1e-5,
                 momentum: Annotated[float, Arg("weight of the current batch in the running statistics",
                                                min=0.0, max=1.0)] = 0.1,
                 affine: Annotated[bool, Arg("learnable per-channel gamma and beta")] = True):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine else None
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))

    def forward(self, x):
        flat = x.float().reshape(-1, x.size(-1))
        y = F.batch_norm(flat, self.running_mean, self.running_var, self.weight, self.bias,
                         training=self.training, momentum=self.momentum, eps=self.eps)
        return y.reshape(x.shape).to(x.dtype)


class NoNorm(nn.Identity):
    """Identity: the ablation "no normalisation at all"."""

    def __init__(self, dim: int):
        super().__init__()


# Cost functions (harness/contracts/cost.py conventions). A norm is elementwise work, so it
# adds no counted FLOPs; for backward it saves its input (Korthikanti et al. 2022,
# arXiv:2205.05198, sec. 4.1: each LayerNorm keeps its input) plus its per-token statistics, and
# whatever else the reference implementation keeps (the Triton kernels keep
# only the input and the statistics).


def _layernorm_cost(dim, gain=True, bias=True, **_):
    from abl import Cost

    return Cost(params=dim * (int(gain) + int(bias)), activation_elements_per_token=dim + 2)  # mean, rstd


def _rmsnorm_cost(dim, gain=True, bias=False, **_):
    from abl import Cost

    # the reference keeps x, rstd and (with a gain) x * rstd for the gain's gradient
    return Cost(params=dim * (int(gain) + int(bias)), activation_elements_per_token=dim * (1 + int(gain)) + 1)


def _scalenorm_cost(dim, gain=True, **_):
    from abl import Cost

    # x, g * x and the norm ||x||
    return Cost(params=int(gain), activation_elements_per_token=2 * dim + 1)


def _batchnorm_cost(dim, affine=True, **_):
    from abl import Cost

    # x (fp32 copy), the normalised x and the per-channel batch statistics (not per token)
    return Cost(params=2 * dim if affine else 0, activation_elements_per_token=2 * dim)


def _no_norm_cost(dim, **_):
    from abl import Cost

    return Cost()


@hookimpl
def register_components(register):
    # each factory's signature declares its parameters (type, default, doc, bounds)
    register("norm", "layernorm", LayerNorm, cost=_layernorm_cost)
    register("norm", "rmsnorm", RMSNorm, cost=_rmsnorm_cost)
    register("norm", "scalenorm", ScaleNorm, cost=_scalenorm_cost)
    register("norm", "batchnorm", BatchNorm, cost=_batchnorm_cost)
    register("norm", "none", NoNorm, doc="Identity: no normalisation.", cost=_no_norm_cost)
