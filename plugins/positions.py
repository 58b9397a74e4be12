"""Position encodings (axis ``position``), through ``harness.model.PositionEncoding``.

Seeds 002 sec. 1.5 (learned absolute, RoPE derivation) and 004 (position
interpolation). Every factory is ``factory(config, **params)``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from harness.hookspecs import hookimpl
from harness.model import PositionEncoding
from harness.registry import Param


class LearnedPosition(PositionEncoding):
    """x_p <- x_p + E[p], one learned vector per position up to the context (GPT-2)."""

    def __init__(self, cfg):
        super().__init__()
        self.context = cfg.context
        self.table = nn.Embedding(cfg.context, cfg.d_model)

    def embed(self, x, start):
        t = x.size(1)
        if start + t > self.context:
            raise ValueError(f"learned positions cover {self.context} tokens; got position {start + t - 1}")
        pos = torch.arange(start, start + t, device=x.device)
        return x + self.table(pos)


class RotaryPosition(PositionEncoding):
    """RoPE (Su et al. 2021; seeds 002 sec. 1.5.4): rotate each pair of q/k dims by p * theta_k.

    theta_k = theta^(-2k/d) for k < d/2. ``interpolation_factor`` s > 1 is
    position interpolation (Chen et al. 2023; seeds 004): position p is
    rotated as p / s, to stretch a model to s times its trained context.
    ``layout`` picks which dims form a pair: "interleaved" (2k, 2k+1) as in the
    paper and the seeds, or "half" (k, k + d/2) as in GPT-NeoX / LLaMA code.
    The rotation is computed in fp32.
    """

    def __init__(self, cfg, theta: float = 10000.0, interpolation_factor: float = 1.0,
                 layout: str = "interleaved"):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.layout = layout
        self.interpolation_factor = interpolation_factor
        k = torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim
        self.register_buffer("inv_freq", (theta ** -k).float(), persistent=False)
        self._cache: tuple | None = None

    def angles(self, start: int, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (start, length, device)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1], self._cache[2]
        pos = torch.arange(start, start + length, device=device, dtype=torch.float32)
        freqs = torch.outer(pos / self.interpolation_factor, self.inv_freq.to(device))  # [T, d/2]
        cos, sin = freqs.cos(), freqs.sin()
        self._cache = (key, cos, sin)
        return cos, sin

    def _apply(self, fn, *args, **kwargs):  # drop the cache when the module moves device
        self._cache = None
        return super()._apply(fn, *args, **kwargs)

    def _rotate(self, x, start):
        cos, sin = self.angles(start, x.size(-2), x.device)
        xf = x.float()
        if self.layout == "interleaved":
            x1, x2 = xf[..., 0::2], xf[..., 1::2]
            out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
        else:
            half = self.head_dim // 2
            x1, x2 = xf[..., :half], xf[..., half:]
            out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        return out.to(x.dtype)

    def rotate(self, q, k, q_start, k_start):
        return self._rotate(q, q_start), self._rotate(k, k_start)


def _rope_check(cfg, params):
    if cfg.head_dim % 2:
        return [f"RoPE needs an even head dim; d_model/n_heads = {cfg.head_dim}"]
    return []


@hookimpl
def register_components(register):
    register("position", "learned", LearnedPosition)
    register("position", "rope", RotaryPosition, params={
        "theta": Param(10000.0, doc="base of the frequencies theta_k = theta^(-2k/d)", min=1.0),
        "interpolation_factor": Param(1.0, doc="position interpolation: rotate position p as p/s",
                                      min=1e-6),
        "layout": Param("interleaved", doc="dims paired as (2k, 2k+1) or (k, k+d/2)",
                        choices=("interleaved", "half")),
    }, check=_rope_check)
