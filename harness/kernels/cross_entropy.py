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
cross-entropy of Liger-Kernel, Hsu et al. 2024, arXiv:2410.10989; its code credits
github.com/mgmalek/efficient_cross_entropy): the gradients are formed in the
forward, rows in chunks; each chunk's logits exist only while its gradient is
formed in place and turned into d(hidden) and d(weight), so neither the [N, V]
logits nor their fp32 softmax are ever whole in memory. Here:

- the weight (and bias) are cast to the compute dtype (autocast's, else the
  weight's) once per call, not per chunk;
- d(weight) and d(bias) accumulate in fp32 inside the GEMM: ``torch.addmm(acc,
  a, b, out_dtype=torch.float32, out=acc)`` reads the fp32 accumulator in the
  epilogue, as Liger-Kernel's FLCE does (torch's out_dtype GEMM overloads,
  pytorch/pytorch#150812: CUDA, fp16/bf16 -> fp32, from torch 2.8; an fp32 ``acc``
  beside fp16/bf16 operands was fixed in pytorch/pytorch#167931; no CPU kernels as of
  2.13). Whether this torch and device take it is probed once (``fp32_out_gemms``),
  not read off a version string; without it the product goes through an fp32 buffer
  a slice of V at a time (``_accumulate_weight_grad``). No [V, D] temporary is made
  per chunk; the weight's [V, D] fp32 accumulator is written by the first chunk's GEMM.
- a chunk's logits (chunk rows x V in the compute dtype) are never larger than
  the fp32 d(weight) [V, D] (``chunk_rows``), so there are few chunks and the
  accumulator is read and written few times.

Both ops are ``torch.library`` custom ops, so ``torch.compile`` traces callers
without graph breaks: ``abl::cross_entropy_fwd`` / ``abl::cross_entropy_bwd`` are
``triton_op``s (the compiler sees their kernels through ``wrap_triton``), and
``abl::linear_cross_entropy`` is an opaque ``custom_op`` whose body is GEMMs and
those kernels (its chunk loop and in-place logits gain nothing from tracing).
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch.library import triton_op, wrap_triton

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


def ce_fwd(logits2, targets1, ignore_index, label_smoothing, z_loss, traced=True):
    """logits2 [N, V], targets1 [N] -> (loss [N] fp32, lse [N] fp32).

    ``traced``: launch through ``wrap_triton`` (inside the triton_ops, where the compiler
    may trace the launch); False launches the kernel directly (inside an opaque op).
    """
    n, v = logits2.shape
    loss = torch.empty(n, dtype=torch.float32, device=logits2.device)
    lse = torch.empty(n, dtype=torch.float32, device=logits2.device)
    if n:
        block = _block_v(v, logits2)
        kernel = wrap_triton(_ce_fwd_kernel) if traced else _ce_fwd_kernel
        kernel[(n,)](
            logits2, logits2.stride(0), targets1, loss, lse, v, ignore_index,
            float(label_smoothing), float(z_loss),
            HAS_SMOOTHING=label_smoothing > 0, HAS_Z_LOSS=z_loss > 0, BLOCK_V=block,
            num_warps=8 if block >= 2048 else 4)
    return loss, lse


def ce_bwd(logits2, targets1, lse, dloss, ignore_index, label_smoothing, z_loss, out=None, traced=True):
    """d(loss)/d(logits) scaled per row by dloss [N] (any stride, 0 included); out may be logits2."""
    n, v = logits2.shape
    dlogits = torch.empty_like(logits2) if out is None else out
    if n:
        block = _block_v(v, logits2)
        kernel = wrap_triton(_ce_bwd_kernel) if traced else _ce_bwd_kernel
        kernel[(n, cdiv(v, block))](
            logits2, logits2.stride(0), dlogits, dlogits.stride(0), targets1, lse, dloss, dloss.stride(0),
            v, ignore_index, float(label_smoothing), float(z_loss),
            HAS_SMOOTHING=label_smoothing > 0, HAS_Z_LOSS=z_loss > 0, BLOCK_V=block,
            num_warps=8 if block >= 2048 else 4)
    return dlogits


def _check_targets(targets1, v, ignore_index):
    # Out-of-range targets would read out of bounds; checking costs a device sync on
    # CUDA, so it is done where it is free (CPU, the interpreter). The ops run it on
    # real tensors only: under the interpreter they are opaque to the compiler.
    if targets1.device.type == "cpu" and not _is_fake(targets1):
        bad = (targets1 != ignore_index) & ((targets1 < 0) | (targets1 >= v))
        if bool(bad.any()):
            raise IndexError(f"target {int(targets1[bad][0])} is out of bounds for {v} classes")


def _is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)


def _check_args(reduction, label_smoothing, z_loss, allowed=("mean", "sum", "none")):
    if reduction not in allowed:
        raise ValueError(f"reduction must be one of {allowed}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if z_loss < 0:
        raise ValueError(f"z_loss must be >= 0, got {z_loss}")


# ---------------------------------------------------------------- cross_entropy: the ops


@triton_op("abl::cross_entropy_fwd", mutates_args=())
def _cross_entropy_fwd(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                       label_smoothing: float, z_loss: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, V] (unit stride along V), targets [N] -> (per-row loss [N], lse [N]), fp32."""
    check_launch(logits, targets)
    _check_targets(targets, logits.shape[1], ignore_index)
    return ce_fwd(logits, targets, ignore_index, label_smoothing, z_loss)


@_cross_entropy_fwd.register_fake
def _(logits, targets, ignore_index, label_smoothing, z_loss):
    n = logits.shape[0]
    return (logits.new_empty(n, dtype=torch.float32), logits.new_empty(n, dtype=torch.float32))


@triton_op("abl::cross_entropy_bwd", mutates_args=())
def _cross_entropy_bwd(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, dloss: torch.Tensor,
                       ignore_index: int, label_smoothing: float, z_loss: float) -> torch.Tensor:
    """d(sum_r dloss_r loss_r)/d(logits) [N, V] in logits' dtype."""
    check_launch(logits, targets, lse, dloss)
    return ce_bwd(logits, targets, lse, dloss, ignore_index, label_smoothing, z_loss)


@_cross_entropy_bwd.register_fake
def _(logits, targets, lse, dloss, ignore_index, label_smoothing, z_loss):
    return torch.empty_like(logits)


def _kernels_interpreted() -> bool:
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return False
    return isinstance(_ce_fwd_kernel, InterpretedFunction)


if _kernels_interpreted():
    # A triton_op is decomposed into its kernels when AOTAutograd functionalizes a graph
    # (so Inductor can see them), which runs its body on fake tensors. Interpreted kernels
    # cannot run on those, so under the interpreter the ops stay opaque in the graph and
    # run eagerly on real tensors (as torch.export keeps them).
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    def _opaque(mode, op, types, args, kwargs):
        return mode.__torch_dispatch__(op, types, args, kwargs)

    for _op in (_cross_entropy_fwd, _cross_entropy_bwd):
        _op.register_torch_dispatch(FunctionalTensorMode)(_opaque)


class CrossEntropyFunction(torch.autograd.Function):
    """Per-row losses [N] fp32; the caller reduces them (so any reduction backpropagates)."""

    @staticmethod
    def forward(ctx, logits2, targets1, ignore_index, label_smoothing, z_loss):
        if logits2.stride(-1) != 1:
            logits2 = logits2.contiguous()
        loss, lse = torch.ops.abl.cross_entropy_fwd(logits2, targets1, ignore_index, label_smoothing, z_loss)
        ctx.save_for_backward(logits2, targets1, lse)
        ctx.args = (ignore_index, label_smoothing, z_loss)
        ctx.mark_non_differentiable(lse)
        return loss, lse

    @staticmethod
    def backward(ctx, dloss, _dlse):
        logits2, targets1, lse = ctx.saved_tensors
        dlogits = torch.ops.abl.cross_entropy_bwd(logits2, targets1, lse, dloss, *ctx.args)
        return dlogits, None, None, None, None


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
        gradient has logits' dtype. Traceable by ``torch.compile`` without graph breaks.
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


# ---------------------------------------------------------------- linear_cross_entropy: GEMMs

# Rows per chunk: the transient logits (rows x V in the compute dtype) are at most the
# fp32 weight gradient [V, D] (4 D V bytes), i.e. rows <= 4 D / (bytes per logit): D rows
# in fp32, 2 D in bf16/fp16, rounded down to a multiple of 64. At least MIN_CHUNK_ROWS (the
# bound then holds for D >= 64 in fp32, D >= 32 in bf16/fp16) so the GEMMs stay efficient, at
# most MAX_CHUNK_ROWS. Chunks are balanced: N is split into as few chunks as the cap allows,
# of equal size rounded up to a multiple of 64 rows (within the cap). Few chunks matter: each
# one reads and writes the fp32 accumulator [V, D] once.
MIN_CHUNK_ROWS = 64
MAX_CHUNK_ROWS = 16384

# The fallbacks that form d(weight) through an fp32 buffer do it a slice of V at a time,
# so that buffer (and an fp32 copy of the slice of d(logits)) holds at most this many
# elements (16 MiB).
FALLBACK_SLICE_ELEMS = 1 << 22


def chunk_rows(n: int, d: int, logit_bytes: int) -> int:
    """Rows per chunk for N rows, hidden size D and logits of ``logit_bytes`` bytes each
    (see MIN_CHUNK_ROWS): chunk_rows x V x logit_bytes <= V x D x 4 for D >= 64."""
    cap = 4 * d // max(1, logit_bytes)
    cap = max(MIN_CHUNK_ROWS, min(MAX_CHUNK_ROWS, cap // 64 * 64))
    if n <= cap:
        return max(1, n)
    rows = cdiv(n, cdiv(n, cap))
    return min(cap, cdiv(rows, 64) * 64)


_FP32_OUT_GEMMS: dict[tuple, tuple[bool, bool]] = {}


def _addmm_fp32(acc, a, b):
    """acc += a @ b with fp16/bf16 a, b: the GEMM reads and writes the fp32 accumulator."""
    return torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)


def _mm_fp32(a, b, out):
    """out (fp32) = a @ b with fp16/bf16 a, b, written from the GEMM's fp32 accumulator."""
    return torch.mm(a, b, out_dtype=torch.float32, out=out)


def fp32_out_gemms(device: torch.device, dtype: torch.dtype) -> tuple[bool, bool]:
    """(addmm, mm): whether ``_addmm_fp32`` and ``_mm_fp32`` work for ``dtype`` operands on
    ``device``, probed once per (device, dtype) with values whose fp16/bf16 rounding would
    show (torch's out_dtype overloads: CUDA fp16/bf16 -> fp32 only; none on CPU as of 2.13)."""
    key = (device.type, device.index, dtype)
    if key not in _FP32_OUT_GEMMS:
        a = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=dtype, device=device)
        b = torch.tensor([[1.0, 2.0], [2.0 ** -12, 0.0]], dtype=dtype, device=device)
        want = a.double() @ b.double()
        ok = []
        for probe in ("addmm", "mm"):
            try:
                if probe == "addmm":
                    acc = torch.full((2, 2), 0.5, dtype=torch.float32, device=device)
                    got = _addmm_fp32(acc, a, b)
                    good = got.data_ptr() == acc.data_ptr() and torch.equal(acc.double(), want + 0.5)
                else:
                    out = torch.empty(2, 2, dtype=torch.float32, device=device)
                    got = _mm_fp32(a, b, out)
                    good = got.data_ptr() == out.data_ptr() and torch.equal(out.double(), want)
            except (RuntimeError, NotImplementedError, TypeError, ValueError):
                good = False
            ok.append(bool(good))
        _FP32_OUT_GEMMS[key] = (ok[0], ok[1])
    return _FP32_OUT_GEMMS[key]


def _accumulate_weight_grad(grad_w, dlogits, hc, first, gemms):
    """grad_w [V, D] fp32 (=, on the first chunk) += dlogits.T @ hc, dlogits [C, V] and hc [C, D]
    in the compute dtype, with the products summed in fp32 and no [V, D] temporary."""
    a = dlogits.t()
    if dlogits.dtype == torch.float32:
        if first:
            torch.mm(a, hc, out=grad_w)
        else:
            grad_w.addmm_(a, hc)
        return
    addmm_ok, mm_ok = gemms
    if addmm_ok and not first:
        _addmm_fp32(grad_w, a, hc)
        return
    if mm_ok and first:
        _mm_fp32(a, hc, grad_w)
        return
    if addmm_ok:  # first chunk without the plain GEMM: accumulate into zeros
        grad_w.zero_()
        _addmm_fp32(grad_w, a, hc)
        return
    # Fallbacks, a slice of V at a time: the fp32-output GEMM into a buffer, added in;
    # where there is none (CPU), fp32 operands (correct, not fast).
    v, d = grad_w.shape
    c = max(1, hc.shape[0])
    # slices of at most FALLBACK_SLICE_ELEMS fp32 elements, and an fp32 copy of a slice of
    # d(logits) [C, width] never larger than d(weight) [V, D]
    width = max(1, min(FALLBACK_SLICE_ELEMS // max(d, c), v * d // c))
    slices = [(grad_w[v0:v0 + width], a[v0:v0 + width]) for v0 in range(0, v, width)]
    if mm_ok:
        buf = None if first else torch.empty(min(width, v), d, dtype=torch.float32, device=grad_w.device)
        for dst, part in slices:
            if buf is None:
                _mm_fp32(part, hc, dst)
            else:
                dst.add_(_mm_fp32(part, hc, buf[:dst.shape[0]]))
        return
    hc32 = hc.float()
    for dst, part in slices:
        if first:
            torch.mm(part.float(), hc32, out=dst)
        else:
            dst.addmm_(part.float(), hc32)


# ---------------------------------------------------------------- linear_cross_entropy: the op


def _linear_cross_entropy_impl(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                               targets: torch.Tensor, ignore_index: int, mean: bool, label_smoothing: float,
                               z_loss: float, chunk_size: int, compute_dtype: torch.dtype, need_h: bool,
                               need_w: bool, need_b: bool):
    """The loss and the gradients of ``abl::linear_cross_entropy`` (see there)."""
    check_launch(hidden, weight, bias, targets)
    n, d = hidden.shape
    v = weight.shape[0]
    _check_targets(targets, v, ignore_index)
    device, cdt = hidden.device, compute_dtype
    empty = lambda: hidden.new_empty(0)  # noqa: E731 - one each: outputs may not alias
    with torch.autocast(device.type, enabled=False):  # the dtypes here are explicit
        wc = weight.to(cdt)  # once per call
        bc = bias.to(cdt) if bias is not None else None
        valid = targets != ignore_index
        if mean:
            scale = (1.0 / valid.sum().clamp_min(1).float()).reshape(1)
        else:
            scale = torch.ones(1, dtype=torch.float32, device=device)
        rows = torch.empty(n, dtype=torch.float32, device=device)
        grad_h = torch.empty(n, d, dtype=hidden.dtype, device=device) if need_h else empty()
        grad_w = torch.empty(v, d, dtype=torch.float32, device=device) if need_w else empty()
        grad_b = torch.empty(v, dtype=torch.float32, device=device) if need_b else empty()
        chunk = chunk_size if chunk_size > 0 else chunk_rows(n, d, cdt.itemsize)
        chunk = max(1, min(chunk, n))
        gemms = fp32_out_gemms(device, cdt) if cdt != torch.float32 and (need_w or need_h) else (False, False)
        logits_buf = torch.empty(chunk, v, dtype=cdt, device=device)
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            hc, tc = hidden[s:e].to(cdt), targets[s:e]
            logits = logits_buf[:e - s]
            if bc is not None:
                torch.addmm(bc, hc, wc.t(), out=logits)
            else:
                torch.mm(hc, wc.t(), out=logits)
            chunk_loss, lse = ce_fwd(logits, tc, ignore_index, label_smoothing, z_loss, traced=False)
            rows[s:e] = chunk_loss
            if not (need_h or need_w or need_b):
                continue
            dlogits = ce_bwd(logits, tc, lse, scale.expand(e - s), ignore_index, label_smoothing, z_loss,
                             out=logits, traced=False)
            if need_h:
                if grad_h.dtype == cdt:
                    torch.mm(dlogits, wc, out=grad_h[s:e])
                elif grad_h.dtype == torch.float32 and gemms[1]:
                    _mm_fp32(dlogits, wc, grad_h[s:e])
                else:
                    grad_h[s:e] = dlogits @ wc
            if need_w:
                _accumulate_weight_grad(grad_w, dlogits, hc, s == 0, gemms)
            if need_b:
                if s == 0:
                    torch.sum(dlogits, 0, dtype=torch.float32, out=grad_b)
                else:
                    grad_b.add_(torch.sum(dlogits, 0, dtype=torch.float32))
        if n == 0:  # no chunk wrote them
            grad_w.zero_()
            grad_b.zero_()
        # an all-ignored batch gives 0/0 = nan for "mean", as torch does
        loss = rows.sum() / valid.sum() if mean else rows.sum()
    return loss, grad_h, grad_w, grad_b


@torch.library.custom_op("abl::linear_cross_entropy", mutates_args=())
def _linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                          targets: torch.Tensor, ignore_index: int, mean: bool, label_smoothing: float,
                          z_loss: float, chunk_size: int, compute_dtype: torch.dtype, need_h: bool,
                          need_w: bool, need_b: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                               torch.Tensor]:
    """hidden [N, D] @ weight [V, D].T (+ bias [V]) in ``compute_dtype``, cross-entropy against
    targets [N], chunk by chunk -> (loss: fp32 scalar, d(loss)/d(hidden) [N, D] in hidden's dtype,
    d(loss)/d(weight) [V, D] fp32, d(loss)/d(bias) [V] fp32); a gradient not asked for (need_*)
    is an empty tensor. ``chunk_size`` 0: ``chunk_rows``."""
    return _linear_cross_entropy_impl(hidden, weight, bias, targets, ignore_index, mean, label_smoothing,
                                      z_loss, chunk_size, compute_dtype, need_h, need_w, need_b)


@_linear_cross_entropy.register_fake
def _(hidden, weight, bias, targets, ignore_index, mean, label_smoothing, z_loss, chunk_size, compute_dtype,
      need_h, need_w, need_b):
    return (hidden.new_empty((), dtype=torch.float32),
            hidden.new_empty(hidden.shape) if need_h else hidden.new_empty(0),
            weight.new_empty(weight.shape, dtype=torch.float32) if need_w else hidden.new_empty(0),
            weight.new_empty(weight.shape[0], dtype=torch.float32) if need_b else hidden.new_empty(0))


class LinearCrossEntropyFunction(torch.autograd.Function):
    """Fused LM head + cross-entropy. The gradients are formed in the forward
    (``abl::linear_cross_entropy``) and scaled by the incoming gradient in the backward."""

    @staticmethod
    def forward(ctx, hidden2, weight, bias, targets1, ignore_index, reduction, label_smoothing, z_loss,
                chunk_size, compute_dtype):
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias is not None and ctx.needs_input_grad[2]
        loss, grad_h, grad_w, grad_b = torch.ops.abl.linear_cross_entropy(
            hidden2, weight, bias, targets1, ignore_index, reduction == "mean", label_smoothing, z_loss,
            chunk_size or 0, compute_dtype, need_h, need_w, need_b)
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.needs = (need_h, need_w, need_b)
        ctx.dtypes = (weight.dtype, bias.dtype if bias is not None else None)
        return loss

    @staticmethod
    def backward(ctx, g):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs
        wd, bd = ctx.dtypes
        return (grad_h * g.to(grad_h.dtype) if need_h else None,
                (grad_w * g).to(wd) if need_w else None,
                (grad_b * g).to(bd) if need_b else None,
                None, None, None, None, None, None, None)


def _compute_dtype(hidden, weight):
    """The LM head's matmul dtype: autocast's where it is on (as for lm_head), else the weight's."""
    kind = hidden.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    if hidden.dtype != weight.dtype:
        raise RuntimeError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must have the same dtype "
                           "outside autocast, as for F.linear")
    return weight.dtype


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
        chunk_size: rows per chunk (default ``chunk_rows``: a chunk's logits are at
            most the size of the fp32 weight gradient).

    The matmuls run in autocast's dtype where autocast is on, else in the weight's; the
    weight and bias gradients accumulate in fp32 and are returned in their dtypes.

    Returns:
        fp32 scalar. Differentiable in hidden, weight and bias. Traceable by
        ``torch.compile`` without graph breaks.
    """
    _check_args(reduction, label_smoothing, z_loss, allowed=("mean", "sum"))
    d = hidden.shape[-1]
    return LinearCrossEntropyFunction.apply(hidden.reshape(-1, d), weight, bias, targets.reshape(-1),
                                            ignore_index, reduction, float(label_smoothing),
                                            float(z_loss), chunk_size, _compute_dtype(hidden, weight))


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
