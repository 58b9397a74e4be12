"""Mixture-of-Experts FFN (axis ``ffn``, name ``moe``).

Sources: Shazeer et al. 2017, arXiv:1701.06538 (the sparsely-gated MoE layer);
GShard, Lepikhin et al. 2020, arXiv:2006.16668 (top-2 routing, capacity,
dropping); Switch Transformer, Fedus et al. 2022, arXiv:2101.03961
(load-balancing loss); expert choice, Zhou et al. 2022, arXiv:2202.09368;
dropless MoE, MegaBlocks, Gale et al. 2022, arXiv:2211.15841; shared
experts, DeepSeekMoE, Dai et al. 2024, arXiv:2401.06066; router z-loss,
ST-MoE, Zoph et al. 2022, arXiv:2202.08906. Each expert is any FFN
of ``abl.plugins.ffn`` (``expert`` names it).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import torch
import torch.nn as nn

from abl import Arg, hookimpl
from abl.plugins.ffn import ACT_KEEPS, DENSE_RATIO, GATED_RATIO, VARIANTS, ffn_cost, hidden_size, make_ffn


def expert_hidden(d_model: int, expert: str, expert_ratio: float, top_k: int, n_shared: int,
                  multiple_of: int) -> int:
    """Hidden size of one expert. ``expert_ratio`` 0 splits the expert FFN's default ratio
    (4, or 8/3 if gated) over the top_k routed + n_shared active experts, so the active
    parameters per token match one dense FFN of that kind (fine-grained experts,
    DeepSeekMoE sec. 3.1)."""
    if expert_ratio <= 0:
        expert_ratio = (GATED_RATIO if VARIANTS[expert][1] else DENSE_RATIO) / (top_k + n_shared)
    return hidden_size(d_model, expert_ratio, multiple_of)


class MixtureOfExperts(nn.Module):
    """Router + E experts (+ always-on shared experts); y = sum_e G[s, e] FFN_e(x_s) (Shazeer et al. 2017, eq. 1).

    Routing (token choice vs expert choice as Zhou et al. 2022 contrast them):

    - ``token_choice``: P = softmax(x W_r); each token keeps its top_k experts
      and renormalises their probabilities to sum to 1 (as GShard's top-2
      gating, Algorithm 1). With ``capacity_factor`` c > 0 an expert takes at most
      C = max(1, floor(c * top_k * N / E)) of the N tokens of the batch (the
      capacity c N / E of Switch sec. 2.2 with top_k assignments per token, GShard); first
      choices are served before second choices, then by position (GShard
      sec. 2.2). An assignment over capacity is dropped: that expert adds
      nothing for the token, so a token dropped by all its experts leaves the
      block as it came (residual only). c = 0 is dropless (MegaBlocks).
    - ``expert_choice`` (Zhou et al. 2022, eq. 1): P = softmax over experts as
      above; each expert takes the C tokens with the highest P[:, e] (c = 0
      means c = 1, i.e. top_k * N / E tokens per expert: the compute of token
      choice) and weights them by P. (Some write-ups take the softmax over
      tokens; we follow the paper.) Selection looks across the whole batch,
      future tokens included, so it is not causal; see Zhou et al. sec. 5.

    ``router_noise`` alpha is noisy gating in its simplest form: in training,
    P <- (1 - alpha) P + alpha eps with eps uniform on the simplex, a mixture
    of the router's probabilities with random ones that keeps every expert
    chosen now and then (Shazeer et al. 2017, sec. 2.1, add Gaussian noise to
    the logits instead); routing and gates use the noisy P.

    Losses (added with ``ctx.add_aux_loss``, already weighted):

    - load balancing (Switch eq. 4 / GShard):
      L_aux = E * sum_e f_e m_e, f_e = (tokens routed to e) / N counted before
      capacity, m_e = mean router probability of e. With top_k assignments per
      token sum_e f_e = top_k, so a perfectly balanced router gives top_k (1
      for Switch's top-1). Under expert choice every f_e is C / N, so the loss
      is constant and pushes nothing.
    - router z-loss (ST-MoE eq. 5): mean over tokens of logsumexp(logits)^2.

    Metrics (means over the MoE layers of one forward): ``moe_aux_loss`` and
    ``moe_z_loss`` (unweighted), ``moe_dropped_frac`` (token choice: dropped
    token-expert assignments / all; expert choice: tokens no expert took) and
    ``moe_load_entropy`` (entropy of each expert's share of routed
    assignments / log E: 1 is perfectly balanced, 0 all on one expert).
    """

    def __init__(self, cfg,
                 routing: Annotated[Literal["token_choice", "expert_choice"],
                                    Arg("token_choice (softmax, top-k, renormalise) or expert_choice (each "
                                        "expert takes its top tokens)")] = "token_choice",
                 n_experts: Annotated[int, Arg("routed experts E", min=1)] = 8,
                 top_k: Annotated[int, Arg("experts per token (token choice); expert choice takes top_k * N / E "
                                           "tokens per expert", min=1)] = 2,
                 n_shared_experts: Annotated[int, Arg("always-on experts added for every token", min=0)] = 0,
                 expert: Annotated[str, Arg("the FFN variant of every expert", choices=tuple(VARIANTS))] = "swiglu",
                 expert_ratio: Annotated[float, Arg("expert hidden size / d_model; 0 = the expert FFN's default "
                                                    "ratio / (top_k + n_shared_experts): active params match one "
                                                    "dense FFN", min=0.0)] = 0.0,
                 bias: Annotated[bool, Arg("biases in the experts")] = False,
                 multiple_of: Annotated[int, Arg("round the expert hidden size up to a multiple of this",
                                                 min=1)] = 8,
                 capacity_factor: Annotated[float, Arg("capacity = floor(c * top_k * tokens / E) per expert, the "
                                                       "rest dropped; 0 = dropless (expert choice: 0 means 1)",
                                                       min=0.0)] = 0.0,
                 router_noise: Annotated[float, Arg("noisy gating weight alpha in [0, 1] (training only)",
                                                    min=0.0, max=1.0)] = 0.0,
                 router_bias: Annotated[bool, Arg("bias on the router")] = False,
                 aux_loss_coef: Annotated[float, Arg("weight of the load-balancing loss E * sum f_e m_e",
                                                     min=0.0)] = 0.01,
                 router_z_loss_coef: Annotated[float, Arg("weight of the router z-loss", min=0.0)] = 0.001):
        super().__init__()
        if top_k > n_experts:
            raise ValueError(f"top_k={top_k} > n_experts={n_experts}")
        self.routing, self.n_experts, self.top_k = routing, n_experts, top_k
        self.capacity_factor, self.router_noise = capacity_factor, router_noise
        self.aux_loss_coef, self.router_z_loss_coef = aux_loss_coef, router_z_loss_coef
        hidden = expert_hidden(cfg.d_model, expert, expert_ratio, top_k, n_shared_experts, multiple_of)
        self.router = nn.Linear(cfg.d_model, n_experts, bias=router_bias)
        self.experts = nn.ModuleList(make_ffn(expert, cfg, hidden, bias) for _ in range(n_experts))
        self.shared = nn.ModuleList(make_ffn(expert, cfg, hidden, bias) for _ in range(n_shared_experts))

    def capacity(self, n_tokens: int) -> int | None:
        c = self.capacity_factor
        if self.routing == "expert_choice":
            c = c or 1.0
        if c <= 0:
            return None
        cap = max(1, math.floor(c * self.top_k * n_tokens / self.n_experts))
        return min(cap, n_tokens) if self.routing == "expert_choice" else cap

    def forward(self, x, ctx=None):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        # the router runs in the weights' precision (fp32 master weights), autocast off (Switch sec. 2.4)
        with torch.autocast(device_type=x.device.type, enabled=False):
            logits = self.router(x.to(self.router.weight.dtype))
        probs = torch.softmax(logits, dim=-1)
        route = probs
        if self.training and self.router_noise > 0:
            eps = -torch.log(torch.rand_like(probs))  # Exp(1) normalised: uniform on the simplex
            route = (1 - self.router_noise) * probs + self.router_noise * eps / eps.sum(-1, keepdim=True)
        if self.routing == "token_choice":
            token, gate, kept, routed = self._token_choice(route)
            dropped = 1 - kept.sum() / routed.sum()
        else:
            token, gate, kept = self._expert_choice(route)
            routed = kept
            dropped = 1 - (torch.bincount(token, minlength=x.size(0)) > 0).float().mean()
        out = self._dispatch(x, token, gate, kept)
        for shared in self.shared:
            out = out + shared(x)
        if ctx is not None:
            self._losses(ctx, logits, probs, routed, dropped, x.size(0))
        return out.reshape(shape)

    def _token_choice(self, route):
        n, k = route.size(0), self.top_k
        gate, expert = route.topk(k, dim=-1)
        gate = gate / gate.sum(-1, keepdim=True)  # renormalise over the kept experts
        # rank-major order: every first choice, then every second choice ...
        expert, gate = expert.t().reshape(-1), gate.t().reshape(-1)
        token = torch.arange(n, device=route.device).repeat(k)
        order = torch.argsort(expert, stable=True)  # group by expert, keeping that priority
        routed = torch.bincount(expert, minlength=self.n_experts)
        kept = routed
        cap = self.capacity(n)
        if cap is not None:
            first = torch.cumsum(routed, 0) - routed                      # where each expert's group starts
            slot = torch.arange(order.numel(), device=route.device) - first[expert[order]]
            order = order[slot < cap]
            kept = routed.clamp(max=cap)
        return token[order], gate[order], kept, routed

    def _expert_choice(self, route):
        cap = self.capacity(route.size(0))
        assert cap is not None  # expert choice always has one: capacity_factor or 1.0
        gate, token = route.t().topk(cap, dim=-1)  # [E, C]: each expert's top tokens
        kept = torch.full((self.n_experts,), cap, device=route.device)
        return token.reshape(-1), gate.reshape(-1), kept

    def _dispatch(self, x, token, gate, counts):
        """Gather the tokens grouped by expert, run each expert once on its batch, scatter-add back."""
        out = torch.zeros_like(x)
        ys = [expert(chunk) for expert, chunk in zip(self.experts, x[token].split(counts.tolist()))
              if chunk.size(0)]
        if ys:
            y = torch.cat(ys) * gate[:, None]
            out.index_add_(0, token, y.to(out.dtype))
        return out

    def _losses(self, ctx, logits, probs, routed, dropped, n_tokens):
        f = routed.float() / n_tokens
        aux = self.n_experts * (f * probs.mean(0)).sum()
        z = torch.logsumexp(logits, dim=-1).pow(2).mean()
        if self.aux_loss_coef:
            ctx.add_aux_loss("moe_aux_loss", self.aux_loss_coef * aux)
        if self.router_z_loss_coef:
            ctx.add_aux_loss("moe_z_loss", self.router_z_loss_coef * z)
        share = routed.float() / routed.sum()
        entropy = -torch.xlogy(share, share).sum() / math.log(self.n_experts) if self.n_experts > 1 \
            else torch.ones(())
        # running mean over this forward's MoE layers (add_metric keeps one value per name)
        seen = getattr(ctx, "moe_layers_seen", 0) + 1
        ctx.moe_layers_seen = seen
        for name, value in (("moe_aux_loss", aux), ("moe_z_loss", z), ("moe_dropped_frac", dropped),
                            ("moe_load_entropy", entropy)):
            value = value.detach()
            prev = ctx.metrics.get(name)
            ctx.add_metric(name, value if prev is None or seen == 1 else prev + (value - prev) / seen)


def _check(cfg, params):
    errs = []
    if params["top_k"] > params["n_experts"]:
        errs.append(f"top_k={params['top_k']} is larger than n_experts={params['n_experts']}: "
                    "a token cannot be routed to more experts than exist")
    return errs


def _cost(cfg, routing="token_choice", n_experts=8, top_k=2, n_shared_experts=0, expert="swiglu",
          expert_ratio=0.0, bias=False, multiple_of=8, capacity_factor=0.0, router_bias=False, **_):
    """Params: router + all routed and shared experts. FLOPs (as executed = useful): the router and
    the active experts only: top_k per token for token choice (an upper bound when a capacity
    drops tokens), c * top_k on average for expert choice (c = 1 when capacity_factor is 0)."""
    from abl import Cost, linear_flops, linear_params

    d = cfg.d_model
    hidden = expert_hidden(d, expert, expert_ratio, top_k, n_shared_experts, multiple_of)
    one = ffn_cost(d, hidden, VARIANTS[expert][1], bias, ACT_KEEPS.get(expert, 1))
    active = top_k if routing == "token_choice" else (capacity_factor or 1.0) * top_k
    params = linear_params(d, n_experts, router_bias) + (n_experts + n_shared_experts) * one.params
    flops = linear_flops(d, n_experts) + (active + n_shared_experts) * one.flops_per_token
    # router input, logits, probs; per active expert its FFN's activations plus the gathered
    # input and the output it scales by the gate
    saved = d + 2 * n_experts + active * (one.activation_elements_per_token + 2 * d) \
        + n_shared_experts * one.activation_elements_per_token
    return Cost(params=params, flops_per_token=flops, activation_elements_per_token=saved)


@hookimpl
def register_components(register):
    # the layer's signature declares its parameters (type, default, doc, bounds)
    register("ffn", "moe", MixtureOfExperts,
             doc="Mixture-of-Experts FFN: a router and E experts (plus shared ones), token or expert choice.",
             cost=_cost, check=_check, width="expert_ratio")
