"""Analytic cost model: what a component declares through ``register(..., cost=fn)``.

A cost function returns a ``Cost`` for ONE instance of the component:

| axis | signature | instance |
|---|---|---|
| norm | ``cost(dim, **params)`` | one norm layer of width ``dim`` |
| block | ``cost(config, **params)`` | the block's own parts, not its mixer/ffn/norms; set ``norms`` to how many norm layers one block builds |
| position | ``cost(config, **params)`` | the whole model's position component |
| mixer | ``cost(config, **params)`` | one layer's mixer |
| ffn | ``cost(config, **params)`` | one layer's FFN |

Conventions (so predictions can be checked against measurement):

- ``params``: trainable parameters, exact.
- ``flops_per_token``: forward FLOPs per token at sequence length
  ``config.context``, averaged over the positions of a training sequence,
  counted as ``torch.utils.flop_counter`` counts them: 2 per multiply-add in
  matrix products (linear layers, attention scores and values as the
  implementation executes them). Elementwise work is not counted.
- ``flops_per_forward``: counted FLOPs of work done once per forward pass for the whole batch,
  whatever its size (a filter or kernel generated from the parameters at the sequence length,
  e.g. an implicit long-convolution filter); added once per step, not per token.
- ``useful_flops_per_token``: the same, but only the work the algorithm needs
  (e.g. causal attention counts the lower triangle only, sliding window only
  the window); used for MFU. Defaults to ``flops_per_token``.
- ``backward_factor``: backward FLOPs = factor x forward (2 unless stated).
- ``activation_elements_per_token``: elements saved for backward per token
  (as Korthikanti et al. 2022, arXiv:2205.05198, sec. 4.1, count them); multiplied by the activation
  dtype's bytes by the caller.
- ``activation_elements_per_forward``: elements saved for backward once per forward pass for
  the whole batch (the same work as ``flops_per_forward``: a kernel generated at the sequence
  length); added once to the step's activations.
- ``transient_elements_per_token``: elements one instance's backward
  allocates at once on top of what was saved (scan temporaries); the
  largest instance's (or the loss's logit gradient) counts toward the peak.
- ``state_elements_per_token``: decoding cache that grows with the sequence
  (KV cache) per token; ``state_elements_per_sequence``: fixed-size
  recurrent state per sequence (linear attention, SSMs). Multiplied by the
  cache dtype's bytes by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class Cost:
    params: int = 0
    flops_per_token: float = 0.0
    flops_per_forward: float = 0.0
    useful_flops_per_token: float | None = None
    backward_factor: float = 2.0
    activation_elements_per_token: float = 0.0
    activation_elements_per_forward: float = 0.0
    transient_elements_per_token: float = 0.0
    state_elements_per_token: float = 0.0
    state_elements_per_sequence: float = 0.0
    norms: int = 0

    @property
    def useful(self) -> float:
        return self.flops_per_token if self.useful_flops_per_token is None else self.useful_flops_per_token

    def scaled(self, k: float) -> "Cost":
        out = Cost(**{f.name: getattr(self, f.name) for f in fields(self)})
        for name in ("params", "flops_per_token", "flops_per_forward", "activation_elements_per_token",
                     "activation_elements_per_forward", "transient_elements_per_token",
                     "state_elements_per_token", "state_elements_per_sequence", "norms"):
            setattr(out, name, type(getattr(self, name))(getattr(self, name) * k))
        if self.useful_flops_per_token is not None:
            out.useful_flops_per_token = self.useful_flops_per_token * k
        return out


def linear_flops(d_in: int, d_out: int) -> float:
    """Forward FLOPs per token of a dense projection (2 per multiply-add)."""
    return 2.0 * d_in * d_out


def linear_params(d_in: int, d_out: int, bias: bool) -> int:
    return d_in * d_out + (d_out if bias else 0)
