"""The LM head's options in one place: what happens to the token embeddings on the way in and to the
final hidden states on the way out.

Four [model] keys of the skeleton (their names and defaults are hashed into run ids, so they stay
config keys; this object reads them from the model's config at each forward):

- ``embed_scale = "sqrt_d_model"`` multiplies the token embeddings by sqrt(d_model) before the
  position encoding (Vaswani et al. 2017, arXiv:1706.03762, sec. 3.4; Gemma 2 does it with tied
  embeddings, so the output projection reads the unscaled table);
- ``logit_scale = "inv_sqrt_d_model"`` multiplies the logits by 1/sqrt(d_model) (Mesh-TensorFlow's
  Transformer with tied embeddings, Shazeer et al. 2018, arXiv:1811.02084);
- ``logit_softcap`` = c > 0 soft-caps the (scaled) logits at c * tanh(logits / c) before the loss and
  wherever logits are read (Gemma 2, Gemma Team 2024, arXiv:2408.00118, sec. 2, "Logit soft-capping":
  c = 30.0 for the final layer);
- ``z_loss`` = c > 0 adds the output z-loss c * mean(log^2 Z) over the scored positions,
  Z = sum_v exp(logit_v) (PaLM, Chowdhery et al. 2022, arXiv:2204.02311, sec. 5, c = 1e-4), to the
  training loss as the auxiliary loss ``z_loss`` (and the metric ``log_z_sq``).

The output projection and the embedding table stay the model's own modules (``DecoderLM.lm_head`` and
``DecoderLM.embed``: their state-dict names are the checkpoints', and a precision may swap the
projection), so the head takes them as arguments.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn as nn

from ..contracts.config import ModelConfig, embed_factor, logit_factor
from ..data.tasks import IGNORE_INDEX
from ..kernels import use_triton

class LossContext(Protocol):
    """What the head needs of the forward pass's context (abl.model.decoder.ForwardContext): whether the
    caller wants the logits, and where an auxiliary loss and a diagnostic go."""

    need_logits: bool

    def add_aux_loss(self, name: str, value: torch.Tensor) -> None: ...

    def add_metric(self, name: str, value) -> None: ...


class LMHead:
    """Embedding scale, output projection and tying, logit scale, soft cap and z-loss of one model."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg

    def projection(self) -> nn.Linear:
        """The output projection d_model -> vocab_size, without bias (GPT-2)."""
        return nn.Linear(self.cfg.d_model, self.cfg.vocab_size, bias=False)

    def tie(self, embed: nn.Embedding, projection: nn.Linear) -> None:
        """Share the embedding table with the output projection when ``model.tie_embeddings`` (after
        the weights are initialised: the projection then reads the embedding's init)."""
        if self.cfg.tie_embeddings:
            projection.weight = embed.weight

    def embed(self, embed: nn.Embedding, idx: torch.Tensor) -> torch.Tensor:
        """Token embeddings [B, T, D] of ``idx`` [B, T], times the embedding scale."""
        x = embed(idx)
        factor = embed_factor(self.cfg.embed_scale, self.cfg.d_model)
        return x * factor if factor != 1.0 else x

    def fuses(self, projection: nn.Module, targets: torch.Tensor | None, ctx: LossContext) -> bool:
        """Whether the projection and the loss run as one op, so the [B*T, V] logits never exist whole.

        Only the Triton op fuses (the reference would form the logits anyway, so on torch the model
        keeps them); a swapped projection (fp8) or a biased one does not; the z-loss needs the logits'
        normaliser and the soft cap changes them, so both keep them too.
        """
        plain = type(projection) is nn.Linear and projection.bias is None
        return (use_triton("linear_cross_entropy") and targets is not None and not ctx.need_logits and plain
                and not self.cfg.z_loss and not self.cfg.logit_softcap)

    def __call__(self, x: torch.Tensor, projection: nn.Module, targets: torch.Tensor | None,
                 ctx: LossContext) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(logits [B, T, V] or None when fused, cross-entropy or None without targets) of the final
        hidden states ``x``; the z-loss goes to ``ctx`` as an auxiliary loss."""
        scale = logit_factor(self.cfg.logit_scale, self.cfg.d_model)
        if self.fuses(projection, targets, ctx):
            assert targets is not None and isinstance(projection, nn.Linear)
            # imported here, not at the top: the kernel modules import triton, which decides once
            # at import whether it interprets, and a worker imports this module (through the
            # trainer) before it has switched the interpreter on for a CPU triton cell
            from ..kernels.cross_entropy import linear_cross_entropy

            # (s x) W^T = s (x W^T): the scale goes on the head's input
            return None, linear_cross_entropy(x * scale if scale != 1.0 else x, projection.weight, targets)
        logits = projection(x)
        if scale != 1.0:
            logits = logits * scale
        cap = self.cfg.logit_softcap
        if cap:
            logits = cap * torch.tanh(logits / cap)
        if targets is None:
            return logits, None
        from ..kernels.cross_entropy import cross_entropy  # lazily, as linear_cross_entropy above

        ce = cross_entropy(logits, targets)
        if self.cfg.z_loss:
            log_z = torch.logsumexp(logits.float(), dim=-1)[targets != IGNORE_INDEX]
            mean_sq = (log_z ** 2).mean()
            ctx.add_aux_loss("z_loss", self.cfg.z_loss * mean_sq)
            ctx.add_metric("log_z_sq", mean_sq)
        return logits, ce
