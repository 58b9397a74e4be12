"""Cross-entropy over the vocabulary, chunked so the full fp32 softmax is never materialised.

Per row with logits x [V] and target t (the next-token loss of the skeleton;
z-loss from PaLM, Chowdhery et al. 2022, arXiv:2204.02311, sec. 5):
    lse = log sum_c exp(x_c)
    loss = (1 - eps) (lse - x_t) + eps (lse - mean_c x_c) + z * lse^2
where eps is label smoothing (Szegedy et al. 2016, arXiv:1512.00567, sec. 7, as torch
defines it) and z the z-loss weight.
Rows whose target is ``ignore_index`` contribute 0 and are not counted by the
mean. The forward kernel streams each row in BLOCK_V chunks with the online
max/sum of the softmax (Milakov & Gimelshein 2018, arXiv:1805.02867, Algorithm 3) and keeps
only lse [N] for the backward, which recomputes the softmax chunk by chunk:
    dloss/dx_c = p_c (1 + 2 z lse) - (1 - eps) [c = t] - eps / V,   p_c = exp(x_c - lse).

``linear_cross_entropy`` fuses the LM-head matmul too (the fused linear
cross-entropy of Liger-Kernel, Hsu et al. 2024, arXiv:2410.10989): rows are processed in chunks; each
chunk's logits exist only while its gradient is formed in place and turned
into d(hidden) and d(weight), so neither the [N, V] logits nor their fp32
softmax are ever whole in memory.
"""

import torch
import torch.nn.functional as F

from . import use_triton
from .utils import cdiv, check_launch, next_pow2, on_gpu, tl, triton

# ---------------------------------------------------------------- kernels


@triton.jit
def _ce_fwd_kernel(LOGITS, stride_l, TARGETS, LOSS, LSE, V, ignore_index, label_smoothing, z_loss,
                   HAS_SMOOTHING: tl.constexpr, HAS_Z_LOSS: tl.constexpr, BLOCK_V: tl.constexpr):
    # fp64 when torch.compile launches the kernel (a Python float): the sums stay fp32
    label_smoothing = tl.cast(label_smoothing, tl.float32)
    z_loss = tl.cast(z_loss, tl.float32)
    row = tl.program_id(0).to(tl.int64)
    base = LOGITS + row * stride_l
    target = tl.load(TARGETS + row)
    m = float("-inf")
    s = 0.0
    sum_x = 0.0
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        mask = cols < V
        x = tl.load(base + cols, mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
        if HAS_SMOOTHING:
            sum_x += tl.sum(tl.where(mask, x, 0.0), axis=0)
    lse = m + tl.log(s)
    valid = target != ignore_index
    x_t = tl.load(base + target, mask=valid, other=0.0).to(tl.float32)
    loss = lse - x_t
    if HAS_SMOOTHING:
        loss = (1.0 - label_smoothing) * loss + label_smoothing * (lse - sum_x / V)
    if HAS_Z_LOSS:
        loss += z_loss * lse * lse
    tl.store(LOSS + row, tl.where(valid, loss, 0.0))
    tl.store(LSE + row, lse)


@triton.jit
def _ce_bwd_kernel(LOGITS, stride_l, DLOGITS, stride_dl, TARGETS, LSE, DLOSS, stride_dloss, V,
                   ignore_index, label_smoothing, z_loss,
                   HAS_SMOOTHING: tl.constexpr, HAS_Z_LOSS: tl.constexpr, BLOCK_V: tl.constexpr):
    # fp64 when torch.compile launches the kernel (a Python float): the sums stay fp32
    label_smoothing = tl.cast(label_smoothing, tl.float32)
    z_loss = tl.cast(z_loss, tl.float32)
    # May run in place (DLOGITS == LOGITS): each program reads its chunk before writing it.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    mask = cols < V
    target = tl.load(TARGETS + row)
    lse = tl.load(LSE + row)
    dloss = tl.load(DLOSS + row * stride_dloss).to(tl.float32)
    x = tl.load(LOGITS + row * stride_l + cols, mask=mask, other=float("-inf")).to(tl.float32)
    grad = tl.exp(x - lse)
    if HAS_Z_LOSS:
        grad = grad * (1.0 + 2.0 * z_loss * lse)
    if HAS_SMOOTHING:
        grad = grad - label_smoothing / V
        grad = tl.where(cols == target, grad - (1.0 - label_smoothing), grad)
    else:
        grad = tl.where(cols == target, grad - 1.0, grad)
    valid = target != ignore_index
    grad = tl.where(valid, grad * dloss, 0.0)
    tl.store(DLOGITS + row * stride_dl + cols, grad.to(DLOGITS.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------- launchers


def _block_v(v: int, x) -> int:
    cap = 4096 if on_gpu(x) else 128
    return min(cap, next_pow2(v))


def ce_fwd(logits2, targets1, ignore_index, label_smoothing, z_loss):
    """logits2 [N, V], targets1 [N] -> (loss [N] fp32, lse [N] fp32)."""
    n, v = logits2.shape
    loss = torch.empty(n, dtype=torch.float32, device=logits2.device)
    lse = torch.empty(n, dtype=torch.float32, device=logits2.device)
    if n:
        block = _block_v(v, logits2)
        _ce_fwd_kernel[(n,)](
            logits2, logits2.stride(0), targets1, loss, lse, v, ignore_index,
            float(label_smoothing), float(z_loss),
            HAS_SMOOTHING=label_smoothing > 0, HAS_Z_LOSS=z_loss > 0, BLOCK_V=block,
            num_warps=8 if block >= 2048 else 4)
    return loss, lse


def ce_bwd(logits2, targets1, lse, dloss, ignore_index, label_smoothing, z_loss, out=None):
    """d(loss)/d(logits) scaled per row by dloss [N] (any stride, 0 included); out may be logits2."""
    n, v = logits2.shape
    dlogits = torch.empty_like(logits2) if out is None else out
    if n:
        block = _block_v(v, logits2)
        _ce_bwd_kernel[(n, cdiv(v, block))](
            logits2, logits2.stride(0), dlogits, dlogits.stride(0), targets1, lse, dloss, dloss.stride(0),
            v, ignore_index, float(label_smoothing), float(z_loss),
            HAS_SMOOTHING=label_smoothing > 0, HAS_Z_LOSS=z_loss > 0, BLOCK_V=block,
            num_warps=8 if block >= 2048 else 4)
    return dlogits


def _check_targets(targets1, v, ignore_index):
    # Out-of-range targets would read out of bounds; checking costs a device sync on
    # CUDA, so it is done where it is free (CPU, the interpreter).
    if targets1.device.type == "cpu":
        bad = (targets1 != ignore_index) & ((targets1 < 0) | (targets1 >= v))
        if bool(bad.any()):
            raise IndexError(f"target {int(targets1[bad][0])} is out of bounds for {v} classes")


def _check_args(reduction, label_smoothing, z_loss, allowed=("mean", "sum", "none")):
    if reduction not in allowed:
        raise ValueError(f"reduction must be one of {allowed}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if z_loss < 0:
        raise ValueError(f"z_loss must be >= 0, got {z_loss}")


# ---------------------------------------------------------------- autograd


class CrossEntropyFunction(torch.autograd.Function):
    """Per-row losses [N] fp32; the caller reduces them (so any reduction backpropagates)."""

    @staticmethod
    def forward(ctx, logits2, targets1, ignore_index, label_smoothing, z_loss):
        check_launch(logits2, targets1)
        _check_targets(targets1, logits2.shape[1], ignore_index)
        if logits2.stride(-1) != 1:
            logits2 = logits2.contiguous()
        loss, lse = ce_fwd(logits2, targets1, ignore_index, label_smoothing, z_loss)
        ctx.save_for_backward(logits2, targets1, lse)
        ctx.args = (ignore_index, label_smoothing, z_loss)
        ctx.mark_non_differentiable(lse)
        return loss, lse

    @staticmethod
    def backward(ctx, dloss, _dlse):
        logits2, targets1, lse = ctx.saved_tensors
        return ce_bwd(logits2, targets1, lse, dloss, *ctx.args), None, None, None, None


def _reduce(rows, valid, reduction):
    if reduction == "none":
        return rows
    total = rows.sum()
    return total / valid.sum() if reduction == "mean" else total


def cross_entropy_triton(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0) -> torch.Tensor:
    """Cross-entropy of ``logits`` against integer ``targets`` with the Triton kernels.

    Args:
        logits: ``[..., V]`` (fp32/bf16/fp16; arithmetic in fp32).
        targets: ``[...]`` integer class ids; ``ignore_index`` rows are skipped.
        reduction: "mean" (over non-ignored rows, as torch), "sum" or "none".
        label_smoothing: torch's label smoothing eps.
        z_loss: weight of the z-loss term z * lse^2 (0 = off).

    Returns:
        fp32 scalar (or ``[...]`` for "none"). Differentiable in logits; the
        gradient has logits' dtype.
    """
    _check_args(reduction, label_smoothing, z_loss)
    v = logits.shape[-1]
    logits2 = logits.reshape(-1, v)
    targets1 = targets.reshape(-1)
    if targets1.shape[0] != logits2.shape[0]:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} disagree")
    rows, _ = CrossEntropyFunction.apply(logits2, targets1, ignore_index, float(label_smoothing),
                                         float(z_loss))
    out = _reduce(rows, targets1 != ignore_index, reduction)
    return out.view(targets.shape) if reduction == "none" else out


class LinearCrossEntropyFunction(torch.autograd.Function):
    """Fused LM head + cross-entropy. The gradients are formed in the forward, chunk by chunk,
    and scaled by the incoming gradient in the backward."""

    @staticmethod
    def forward(ctx, hidden2, weight, bias, targets1, ignore_index, reduction, label_smoothing, z_loss,
                chunk_size):
        check_launch(hidden2, weight, bias, targets1)
        n, d = hidden2.shape
        v = weight.shape[0]
        _check_targets(targets1, v, ignore_index)
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], (
            bias is not None and ctx.needs_input_grad[2])
        valid = targets1 != ignore_index
        if reduction == "mean":
            scale = (1.0 / valid.sum().clamp_min(1).float()).reshape(1)
        else:
            scale = torch.ones(1, dtype=torch.float32, device=hidden2.device)
        rows = torch.empty(n, dtype=torch.float32, device=hidden2.device)
        grad_h = torch.empty_like(hidden2) if need_h else None
        grad_w = torch.zeros(v, d, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(v, dtype=torch.float32, device=weight.device) if need_b else None
        chunk = chunk_size or max(1, next_pow2(cdiv(n, cdiv(v, d))))
        for s in range(0, n, chunk):
            hc, tc = hidden2[s:s + chunk], targets1[s:s + chunk]
            logits = F.linear(hc, weight, bias)  # autocast (if on) picks the matmul dtype, as for lm_head
            if logits.stride(-1) != 1:
                logits = logits.contiguous()
            chunk_rows, lse = ce_fwd(logits, tc, ignore_index, label_smoothing, z_loss)
            rows[s:s + chunk] = chunk_rows
            if need_h or need_w or need_b:
                dlogits = ce_bwd(logits, tc, lse, scale.expand(logits.shape[0]), ignore_index,
                                 label_smoothing, z_loss, out=logits)
                if grad_h is not None:
                    grad_h[s:s + chunk] = (dlogits @ weight.to(dlogits.dtype)).to(hidden2.dtype)
                if need_w:
                    grad_w += (dlogits.t() @ hc.to(dlogits.dtype)).float()
                if need_b:
                    grad_b += dlogits.float().sum(0)
        # an all-ignored batch gives 0/0 = nan for "mean", as torch does
        loss = rows.sum() / valid.sum() if reduction == "mean" else rows.sum()
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.dtypes = (weight.dtype, bias.dtype if bias is not None else None)
        return loss

    @staticmethod
    def backward(ctx, g):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        wd, bd = ctx.dtypes
        return (grad_h * g.to(grad_h.dtype) if grad_h is not None else None,
                (grad_w * g).to(wd) if grad_w is not None else None,
                (grad_b * g).to(bd) if grad_b is not None else None,
                None, None, None, None, None, None)


def linear_cross_entropy_triton(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         bias: torch.Tensor | None = None, ignore_index: int = -100,
                         reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                         chunk_size: int | None = None) -> torch.Tensor:
    """``cross_entropy(hidden @ weight.T + bias, targets)`` without materialising the logits.

    Args:
        hidden: ``[..., D]`` final hidden states (after the final norm).
        weight: ``[V, D]`` the LM head (``lm_head.weight``; tied embeddings work too).
        targets: ``[...]`` integer class ids.
        bias: ``[V]`` or None.
        reduction: "mean" or "sum" (the gradients are formed in the forward, so a
            per-row "none" is not offered).
        chunk_size: rows per chunk (default: about N*D/V rows, so a chunk's logits
            are the size of the hidden states).

    Returns:
        fp32 scalar. Differentiable in hidden, weight and bias.
    """
    _check_args(reduction, label_smoothing, z_loss, allowed=("mean", "sum"))
    d = hidden.shape[-1]
    return LinearCrossEntropyFunction.apply(hidden.reshape(-1, d), weight, bias, targets.reshape(-1),
                                            ignore_index, reduction, float(label_smoothing),
                                            float(z_loss), chunk_size)


# ---------------------------------------------------------------- references


def cross_entropy_reference(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
                            reduction: str = "mean", label_smoothing: float = 0.0,
                            z_loss: float = 0.0) -> torch.Tensor:
    """torch's cross-entropy on the fp32 logits, plus the z-loss term (materialises everything)."""
    v = logits.shape[-1]
    x = logits.float().reshape(-1, v)
    t = targets.reshape(-1)
    if not z_loss:  # torch's own reduction, so the loss is bit for bit F.cross_entropy's
        out = F.cross_entropy(x, t, ignore_index=ignore_index, reduction=reduction,
                              label_smoothing=label_smoothing)
        return out.view(targets.shape) if reduction == "none" else out
    rows = F.cross_entropy(x, t, ignore_index=ignore_index, reduction="none",
                           label_smoothing=label_smoothing)
    valid = t != ignore_index
    if z_loss:
        rows = rows + torch.where(valid, z_loss * torch.logsumexp(x, -1).pow(2), 0.0)
    out = _reduce(rows, valid, reduction)
    return out.view(targets.shape) if reduction == "none" else out


def linear_cross_entropy_reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                                   bias: torch.Tensor | None = None, ignore_index: int = -100,
                                   reduction: str = "mean", label_smoothing: float = 0.0,
                                   z_loss: float = 0.0) -> torch.Tensor:
    return cross_entropy_reference(F.linear(hidden, weight, bias), targets, ignore_index, reduction,
                                   label_smoothing, z_loss)


# ---------------------------------------------------------------- the ops


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0) -> torch.Tensor:
    """Cross-entropy on the active kernel backend (``abl.kernels.use_triton``):
    ``cross_entropy_triton`` under triton, ``cross_entropy_reference`` otherwise."""
    if use_triton("cross_entropy"):
        return cross_entropy_triton(logits, targets, ignore_index, reduction, label_smoothing, z_loss)
    return cross_entropy_reference(logits, targets, ignore_index, reduction, label_smoothing, z_loss)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         bias: torch.Tensor | None = None, ignore_index: int = -100,
                         reduction: str = "mean", label_smoothing: float = 0.0,
                         z_loss: float = 0.0) -> torch.Tensor:
    """LM head + cross-entropy on the active kernel backend (``abl.kernels.use_triton``):
    ``linear_cross_entropy_triton`` (the logits never exist whole) under triton,
    ``linear_cross_entropy_reference`` (which forms them) otherwise."""
    if use_triton("linear_cross_entropy"):
        return linear_cross_entropy_triton(hidden, weight, targets, bias, ignore_index, reduction,
                                           label_smoothing, z_loss)
    return linear_cross_entropy_reference(hidden, weight, targets, bias, ignore_index, reduction,
                                          label_smoothing, z_loss)
