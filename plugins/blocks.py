"""Block layouts (axis ``block``): where the norms sit around each sublayer.

Pre- vs post-norm: Xiong et al. 2020, "On Layer Normalization in the
Transformer Architecture", arXiv:2002.04745; "double norm": Gemma 2 (Gemma
Team 2024, arXiv:2408.00118, sec. 2) and Grok-1's released code; post-branch
norm: OLMo 2 (Team OLMo 2024, "2 OLMo 2 Furious", arXiv:2501.00656). Every factory is
``factory(config, make_norm, make_mixer, make_ffn, **params)`` and returns a
module with ``forward(x, ctx)`` and a ``final_norm`` flag telling the skeleton
whether a norm follows the last block.
"""

from __future__ import annotations

import torch.nn as nn

from abl import hookimpl


class _Block(nn.Module):
    final_norm = True

    def __init__(self, cfg, make_norm, make_mixer, make_ffn):
        super().__init__()
        self.mixer = make_mixer()
        self.ffn = make_ffn()
        self.drop = nn.Dropout(cfg.dropout)


class PreNorm(_Block):
    """x = x + f(norm(x)) for f in (mixer, ffn); a final norm after the last block."""

    def __init__(self, cfg, make_norm, make_mixer, make_ffn):
        super().__init__(cfg, make_norm, make_mixer, make_ffn)
        self.norm1, self.norm2 = make_norm(cfg.d_model), make_norm(cfg.d_model)

    def forward(self, x, ctx):
        x = x + self.drop(self.mixer(self.norm1(x), ctx))
        return x + self.drop(self.ffn(self.norm2(x), ctx))


class PostNorm(_Block):
    """x = norm(x + f(x)) (Vaswani et al. 2017). The stream is already normed, so no final norm."""

    final_norm = False

    def __init__(self, cfg, make_norm, make_mixer, make_ffn):
        super().__init__(cfg, make_norm, make_mixer, make_ffn)
        self.norm1, self.norm2 = make_norm(cfg.d_model), make_norm(cfg.d_model)

    def forward(self, x, ctx):
        x = self.norm1(x + self.drop(self.mixer(x, ctx)))
        return self.norm2(x + self.drop(self.ffn(x, ctx)))


class SandwichNorm(_Block):
    """x = x + norm_out(f(norm_in(x))): "double norm" as in Gemma 2 and Grok."""

    def __init__(self, cfg, make_norm, make_mixer, make_ffn):
        super().__init__(cfg, make_norm, make_mixer, make_ffn)
        d = cfg.d_model
        self.norm1_in, self.norm1_out = make_norm(d), make_norm(d)
        self.norm2_in, self.norm2_out = make_norm(d), make_norm(d)

    def forward(self, x, ctx):
        x = x + self.drop(self.norm1_out(self.mixer(self.norm1_in(x), ctx)))
        return x + self.drop(self.norm2_out(self.ffn(self.norm2_in(x), ctx)))


class PostBranchNorm(_Block):
    """x = x + norm(f(x)): OLMo 2 normalises only the branch output, not the stream."""

    def __init__(self, cfg, make_norm, make_mixer, make_ffn):
        super().__init__(cfg, make_norm, make_mixer, make_ffn)
        self.norm1, self.norm2 = make_norm(cfg.d_model), make_norm(cfg.d_model)

    def forward(self, x, ctx):
        x = x + self.drop(self.norm1(self.mixer(x, ctx)))
        return x + self.drop(self.norm2(self.ffn(x, ctx)))


def _cost(norms):
    """A block owns no weights and no matmuls; it says how many norm layers it builds.

    With dropout on, each of the two sublayer outputs keeps its mask for
    backward (Korthikanti et al. 2022, arXiv:2205.05198, sec. 4.1); counted at activation width, which
    overstates torch's 1-byte bool masks.
    """

    def cost(config, **_):
        from abl import Cost

        masks = 2 * config.d_model if config.dropout > 0 else 0
        return Cost(norms=norms, activation_elements_per_token=masks)

    return cost


class ParallelBlock(_Block):
    """x = x + mixer(norm(x)) + ffn(norm(x)): one norm, both branches read it (GPT-J, PaLM).

    GPT-J (Wang & Komatsuzaki 2021, mesh-transformer-jax) and PaLM (Chowdhery
    et al. 2022, arXiv:2204.02311, sec. 2, "Parallel Layers"): the branches run side by side instead of
    in series, so one norm per block is removed and the two input matmuls
    can be fused (PaLM sec. 2 reports ~15% faster training at scale).
    """

    def __init__(self, cfg, make_norm, make_mixer, make_ffn):
        super().__init__(cfg, make_norm, make_mixer, make_ffn)
        self.norm = make_norm(cfg.d_model)

    def forward(self, x, ctx):
        h = self.norm(x)
        return x + self.drop(self.mixer(h, ctx)) + self.drop(self.ffn(h, ctx))


@hookimpl
def register_components(register):
    register("block", "pre", PreNorm, cost=_cost(2))
    register("block", "post", PostNorm, cost=_cost(2))
    register("block", "sandwich", SandwichNorm, cost=_cost(4))
    register("block", "post_branch", PostBranchNorm, cost=_cost(2))
    register("block", "parallel", ParallelBlock, cost=_cost(1))
