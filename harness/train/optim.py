"""The optimizer and the learning-rate schedule of a training run.

AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization",
arXiv:1711.05101) with weight decay on matrices only, and a linear warm-up
followed by a cosine decay to a floor (Loshchilov & Hutter 2017, "SGDR:
Stochastic Gradient Descent with Warm Restarts", arXiv:1608.03983, eq. 5,
one cycle without restarts).
"""

from __future__ import annotations

import math

import torch


def lr_at(step: int, cfg) -> float:
    """Linear warm-up to lr over warmup_steps, then cosine down to lr * min_lr_ratio."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, cfg) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not norms, biases, gains, scalars)."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    seen: set[int] = set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> float:
    for g in optimizer.param_groups:
        g["lr"] = lr
    return lr

