"""Block layouts against their equations, with stand-in sublayers whose outputs are known."""

import torch
import torch.nn as nn

from abl.contracts.config import ModelConfig
from abl.plugins.blocks import PostBranchNorm, PostNorm, PreNorm, SandwichNorm


class Affine(nn.Module):
    """A norm stand-in that is easy to tell apart: y = a*x + b."""

    def __init__(self, a, b):
        super().__init__()
        self.a, self.b = a, b

    def forward(self, x):
        return self.a * x + self.b


class Sub(nn.Module):
    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, x, ctx=None):
        return torch.tanh(self.k * x)


def build(cls):
    cfg = ModelConfig(d_model=4, n_heads=1)
    norms = iter([Affine(2.0, 0.1), Affine(3.0, -0.2), Affine(0.5, 0.3), Affine(1.5, 0.0)])
    return cls(cfg, lambda d: next(norms), lambda: Sub(0.7), lambda: Sub(-1.3))


f = lambda x: torch.tanh(0.7 * x)  # noqa: E731  mixer
g = lambda x: torch.tanh(-1.3 * x)  # noqa: E731  ffn
n1 = lambda x: 2.0 * x + 0.1  # noqa: E731
n2 = lambda x: 3.0 * x - 0.2  # noqa: E731
n3 = lambda x: 0.5 * x + 0.3  # noqa: E731
n4 = lambda x: 1.5 * x  # noqa: E731

X = torch.linspace(-2, 2, 8).view(1, 2, 4)


def test_pre():
    h = X + f(n1(X))
    torch.testing.assert_close(build(PreNorm)(X, None), h + g(n2(h)))
    assert PreNorm.final_norm


def test_post():
    h = n1(X + f(X))
    torch.testing.assert_close(build(PostNorm)(X, None), n2(h + g(h)))
    assert not PostNorm.final_norm


def test_sandwich():
    h = X + n2(f(n1(X)))
    torch.testing.assert_close(build(SandwichNorm)(X, None), h + n4(g(n3(h))))


def test_post_branch():
    h = X + n1(f(X))
    torch.testing.assert_close(build(PostBranchNorm)(X, None), h + n2(g(h)))
