"""Numeric precision policies (axis ``precision``).

FP32 master weights and optimizer state in every policy and FP16 with
dynamic loss scaling (Micikevicius et al. 2018, "Mixed Precision Training",
arXiv:1710.03740, sec. 3); TF32 as a matmul mode (NVIDIA A100 Tensor Core GPU
Architecture whitepaper, 2020); BF16 without loss scaling (Kalamkar et al.
2019, arXiv:1905.12322); FP8 with E4M3 for forward weights/activations, E5M2
for gradients and per-tensor or per-channel scaling (Micikevicius et al.
2022, "FP8 Formats for Deep Learning", arXiv:2209.05433). Every factory is ``factory(**params)`` and
returns a ``abl.contracts.precision.Precision``.

What ran is recorded, never what was asked for: ``tf32`` on a device without
TF32 records ``effective_precision = "fp32"``; ``fp8`` off H100-class GPUs runs
as an emulation and records ``emulated = True``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch
import torch.nn as nn

from abl import Arg, Precision, hookimpl


class FP32(Precision):
    """Everything in fp32."""

    name = "fp32"


class TF32(Precision):
    """fp32 tensors, matmuls in TF32 (fp32 range, 10-bit mantissa) on GPUs that have it.

    TF32 is a compute mode of NVIDIA tensor cores from Ampere (compute
    capability 8.0) on (NVIDIA A100 whitepaper, 2020): ``torch.set_float32_matmul_precision
    ("high")`` plus cuDNN's TF32 switch. Elsewhere the run is exactly fp32 and
    info() says so (``tf32_active = False``, ``effective_precision = "fp32"``).
    """

    name = "tf32"

    def __init__(self):
        self.active = False
        self.note = "not set up"

    def setup(self, model, device):
        if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8:
            torch.set_float32_matmul_precision("high")
            torch.backends.cudnn.allow_tf32 = True
            self.active = True
            self.note = "matmul precision 'high' (TF32 tensor cores)"
        else:
            where = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
            self.active = False
            self.note = f"no TF32 on {where} (needs compute capability >= 8.0): identical to fp32"

    def peak_format(self) -> str:
        return "tf32" if self.active else "fp32"

    def info(self) -> dict[str, Any]:
        return {**super().info(), "tf32_active": self.active,
                "effective_precision": "tf32" if self.active else "fp32", "precision_note": self.note}


class BF16(Precision):
    """torch.autocast to bfloat16 for matmuls; fp32 master weights and AdamW state.

    bf16 has fp32's exponent range, so no loss scaling is needed.
    """

    name = "bf16"
    compute_dtype = torch.bfloat16


class FP16(Precision):
    """torch.autocast to float16 plus dynamic loss scaling; fp32 master weights and AdamW state.

    fp16's range (6e-5 .. 6.5e4 normal) lets small gradients underflow, so the
    loss is multiplied by S before backward and the gradients divided by S
    before the step (Micikevicius et al. 2018, arXiv:1710.03740, sec. 3.2). S is dynamic (as NVIDIA AMP): a step
    whose gradients contain inf/nan is skipped and S *= backoff_factor; after
    ``growth_interval`` good steps in a row S *= growth_factor.

    Step metrics: ``loss_scale`` (the S this step's backward used),
    ``skipped_steps`` (cumulative), ``step_skipped`` (0/1), and ``grad_norm``
    (unscaled; absent on a skipped step).
    """

    name = "fp16"
    compute_dtype = torch.float16

    def __init__(self, init_scale: Annotated[float, Arg("initial loss scale S", min=1e-30)] = 2.0 ** 16,
                 growth_factor: Annotated[float, Arg("S *= this after growth_interval good steps", min=1.0)] = 2.0,
                 backoff_factor: Annotated[float, Arg("S *= this after a step with inf/nan gradients",
                                                      min=1e-6, max=1.0)] = 0.5,
                 growth_interval: Annotated[int, Arg("good steps in a row before S grows", min=1)] = 2000):
        self.scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.good_steps = 0
        self.skipped_steps = 0

    def backward(self, loss):
        (loss.float() * self.scale).backward()

    def unscale_(self, params) -> bool:
        """Divide every gradient by S in place; True when one of them is inf/nan."""
        groups: dict[tuple, list[torch.Tensor]] = {}
        for p in params:
            if p.grad is not None:
                groups.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
        found = False
        for (device, _), grads in groups.items():
            found_inf = torch.zeros(1, device=device)
            inv = torch.full((1,), 1.0 / self.scale, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv)
            found = found or bool(found_inf.item())
        return found

    def step(self, optimizer, params, grad_clip):
        used = self.scale
        if self.unscale_(params):
            self.skipped_steps += 1
            self.good_steps = 0
            self.scale = used * self.backoff_factor
            return {"loss_scale": used, "skipped_steps": self.skipped_steps, "step_skipped": 1.0}
        max_norm = grad_clip if grad_clip > 0 else float("inf")
        gn = torch.nn.utils.clip_grad_norm_(params, max_norm)
        optimizer.step()
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale = used * self.growth_factor
            self.good_steps = 0
        return {"grad_norm": gn, "loss_scale": used, "skipped_steps": self.skipped_steps,
                "step_skipped": 0.0}

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.good_steps = int(state["good_steps"])
        self.skipped_steps = int(state["skipped_steps"])

    def info(self) -> dict[str, Any]:
        return {**super().info(), "init_loss_scale": self.scale, "loss_scale_growth_interval":
                self.growth_interval}


# ---------------------------------------------------------------- fp8

E4M3 = torch.float8_e4m3fn  # forward: weights and activations (max 448, 3 mantissa bits)
E5M2 = torch.float8_e5m2    # backward: gradients (max 57344, 2 mantissa bits)


def fp8_quantize(x: torch.Tensor, dtype: torch.dtype, dim: int | None = None):
    """Scale into fp8's range and cast (fp8's range is too narrow to cast unscaled; Micikevicius et al. 2022).

    S = fp8_max / amax, x_q = fp8(saturate(x * S)), and x ~= x_q / S. ``dim``
    None: one S for the tensor (per-tensor); else amax is taken along ``dim``
    (keepdim), one S per slice (per-channel). An all-zero slice gets S = 1.
    Returns (x_q, S) with S in fp32.

    Working memory: one fp32 copy of x (scaled and clamped in place) and the
    fp8 result; amax = max(max x, -min x) needs no copy (abs, max and the cast of
    an exact max to fp32 are exact, so this equals amax |fp32(x)|).
    ``fp8_linear_transient_bytes`` counts these allocations.
    """
    fmax = torch.finfo(dtype).max
    lo, hi = torch.aminmax(x) if dim is None else torch.aminmax(x, dim=dim, keepdim=True)
    amax = torch.maximum(hi, lo.neg()).float()
    scale = torch.where(amax > 0, fmax / amax, torch.ones_like(amax))
    work = x.to(torch.float32, copy=True)  # the one fp32 working copy (x itself stays untouched)
    work.mul_(scale).clamp_(-fmax, fmax)
    return work.to(dtype), scale


def fp8_dequantize(x_q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x_q.to(torch.float32, copy=True).div_(scale)


def _pad16(t: torch.Tensor, dim: int, value: float = 0.0) -> torch.Tensor:
    pad = (-t.shape[dim]) % 16
    if not pad:
        return t
    shape = list(t.shape)
    shape[dim] = pad
    return torch.cat([t, torch.full(shape, value, dtype=t.dtype, device=t.device)], dim=dim)


def _scaled_mm_real(a_q, b_q, sa, sb, out_dtype):  # pragma: no cover - needs an H100-class GPU
    """a_q [M, K] @ b_q [K, N] on the fp8 tensor cores (torch._scaled_mm), dims padded to 16."""
    m, n = a_q.shape[0], b_q.shape[1]
    a_p = _pad16(_pad16(a_q, 0), 1)
    b_p = _pad16(_pad16(b_q, 0), 1)
    inv_a, inv_b = sa.reciprocal(), sb.reciprocal()
    if inv_a.dim():  # per-channel: [M, 1] and [1, N]
        inv_a = _pad16(inv_a, 0, 1.0).contiguous()
        inv_b = _pad16(inv_b, 1, 1.0).contiguous()
    b_p = b_p.t().contiguous().t()  # _scaled_mm wants b column-major
    out = torch._scaled_mm(a_p.contiguous(), b_p, scale_a=inv_a, scale_b=inv_b, out_dtype=torch.bfloat16)
    return out[:m, :n].to(out_dtype)


def fp8_matmul(a: torch.Tensor, b: torch.Tensor, a_dtype: torch.dtype, b_dtype: torch.dtype,
               per_channel: bool, out_dtype: torch.dtype, real: bool) -> torch.Tensor:
    """a [M, K] @ b [K, N] with both operands quantized to fp8.

    Scaling rule, the same on both paths: per-tensor, one scale per operand;
    per-channel, a is scaled per row and b per column (the dims that are not
    summed over, so the scales factor out of the product). ``real``: fp8
    tensor-core GEMM (torch._scaled_mm); otherwise the emulation
    quantize -> dequantize -> fp32 matmul, which sees the same rounding of the
    operands but accumulates in fp32.
    """
    a_q, sa = fp8_quantize(a, a_dtype, 1 if per_channel else None)
    b_q, sb = fp8_quantize(b, b_dtype, 0 if per_channel else None)
    if real:
        return _scaled_mm_real(a_q, b_q, sa, sb, out_dtype)
    return (fp8_dequantize(a_q, sa) @ fp8_dequantize(b_q, sb)).to(out_dtype)


class _FP8LinearFunction(torch.autograd.Function):
    """y = x W^T + b with fp8 GEMMs: forward E4M3 x E4M3; backward E5M2 grads x E4M3."""

    @staticmethod
    def forward(ctx, x2, weight, bias, per_channel, real, out_dtype):
        y = fp8_matmul(x2, weight.t(), E4M3, E4M3, per_channel, out_dtype, real)
        if bias is not None:
            y = y + bias.to(y.dtype)
        ctx.save_for_backward(x2, weight)
        ctx.args = (per_channel, real, bias is not None, bias.dtype if bias is not None else None)
        return y

    @staticmethod
    def backward(ctx, gy):
        x2, weight = ctx.saved_tensors
        per_channel, real, has_bias, bias_dtype = ctx.args
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = fp8_matmul(gy, weight, E5M2, E4M3, per_channel, x2.dtype, real)      # [M,N] @ [N,K]
        if ctx.needs_input_grad[1]:
            gw = fp8_matmul(gy.t(), x2, E5M2, E4M3, per_channel, torch.float32, real).to(weight.dtype)
        if has_bias and ctx.needs_input_grad[2]:
            gb = gy.float().sum(0).to(bias_dtype)
        return gx, gw, gb, None, None, None


class FP8Linear(nn.Module):
    """An nn.Linear whose GEMMs run in fp8; it shares the original's fp32 master parameters."""

    def __init__(self, linear: nn.Linear, per_channel: bool, real: bool):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.per_channel, self.real = per_channel, real

    def forward(self, x):
        dev = x.device.type
        out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        with torch.autocast(dev, enabled=False):
            y = _FP8LinearFunction.apply(x.reshape(-1, self.in_features), self.weight, self.bias,
                                         self.per_channel, self.real, out_dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"scaling={'per_channel' if self.per_channel else 'per_tensor'}, "
                f"{'real' if self.real else 'emulated'}")


# ---------------------------------------------------------------- fp8 working memory
#
# The bytes one FP8Linear's GEMMs hold at once, counted from the code above
# allocation by allocation (abl's own accounting; tests/test_fp8_memory.py holds
# it to torch's MemTracker on one layer and on a whole training step). Scales
# (one fp32 number per tensor, or per row or column) are left out: 1/K of an
# operand's copy.


class _Ledger:
    """Bytes live at once over a sequence of allocations and frees."""

    def __init__(self):
        self.live = self.peak = 0

    def alloc(self, n: int) -> int:
        self.live += n
        self.peak = max(self.peak, self.live)
        return n

    def free(self, *sizes: int) -> None:
        self.live -= sum(sizes)


def _pad(n: int) -> int:
    return n + (-n) % 16


def _quantize_ledger(led: _Ledger, numel: int) -> int:
    """fp8_quantize: the fp32 working copy, then the fp8 result; the copy goes. Returns the result's bytes."""
    work = led.alloc(4 * numel)
    q = led.alloc(numel)
    led.free(work)
    return q


def _matmul_ledger(led: _Ledger, m: int, k: int, n: int, out_bytes: int, real: bool,
                   a_row_major: bool, b_col_major: bool) -> int:
    """fp8_matmul of a [m, k] by b [k, n]; the result stays live, its bytes returned."""
    a_q = _quantize_ledger(led, m * k)
    b_q = _quantize_ledger(led, k * n)
    if not real:  # dequantized fp32 copies of both, the fp32 product, then its cast
        a_f, b_f = led.alloc(4 * m * k), led.alloc(4 * k * n)
        out = led.alloc(4 * m * n)
        led.free(a_f, b_f)
        if out_bytes != 4:
            cast = led.alloc(out_bytes * m * n)
            led.free(out)
            out = cast
        led.free(a_q, b_q)
        return out
    # _scaled_mm_real: operands padded to multiples of 16 (torch.cat: a new tensor per padded dim)
    mp, kp, np_ = _pad(m), _pad(k), _pad(n)
    a_tmp = (led.alloc(mp * k) if mp != m else 0)
    a_p = led.alloc(mp * kp) if kp != k else 0
    if a_p:
        led.free(a_tmp)
    else:
        a_p = a_tmp
    b_tmp = led.alloc(kp * n) if kp != k else 0
    b_p = led.alloc(kp * np_) if np_ != n else 0
    if b_p:
        led.free(b_tmp)
    else:
        b_p = b_tmp
    if b_p or not b_col_major:  # b_p.t().contiguous(): a column-major copy
        copy = led.alloc(kp * np_)
        led.free(b_p)
        b_p = copy
    a_c = led.alloc(m * k) if not a_p and not a_row_major else 0  # a_p.contiguous()
    out = led.alloc(2 * mp * np_)  # torch._scaled_mm's bf16 product
    led.free(a_c)
    if out_bytes != 2:  # out[:m, :n].to(out_dtype)
        cast = led.alloc(out_bytes * m * n)
        led.free(out)
        out = cast
    led.free(a_p, b_p, a_q, b_q)
    return out


def fp8_linear_transient_bytes(rows: int, in_features: int, out_features: int, *, real: bool,
                               act_bytes: int, bias: bool = True) -> int:
    """Peak bytes one FP8Linear's forward or backward holds beyond its operands (input, weight, incoming gradient).

    Counted: each operand's fp32 scaling copy and fp8 result (fp8_quantize),
    the padded, transposed and contiguous fp8 copies and the bf16 product of
    torch._scaled_mm (real) or the dequantized fp32 operands and product
    (emulated), the casts of the results, and the results themselves while the
    next GEMM runs (the backward's input gradient during the weight-gradient
    GEMM; the weight gradient is produced in fp32). Activations and their
    gradients are counted at ``act_bytes`` (the cost model's convention: the
    compute dtype).
    """
    m, k, n = rows, in_features, out_features
    fwd = _Ledger()
    y = _matmul_ledger(fwd, m, k, n, act_bytes, real, a_row_major=True, b_col_major=True)  # x2 @ W^T
    if bias:  # y + bias.to(y.dtype) (the fp32 bias cast unless y is fp32): the sum, then the old y goes
        fwd.alloc((act_bytes * n if act_bytes != 4 else 0) + act_bytes * m * n)
        fwd.free(y)
    bwd = _Ledger()
    _matmul_ledger(bwd, m, n, k, act_bytes, real, a_row_major=True, b_col_major=False)  # gx = gy @ W
    _matmul_ledger(bwd, n, m, k, 4, real, a_row_major=False, b_col_major=False)  # gw = gy^T @ x2
    if bias:  # gb = gy.float().sum(0)
        gy_f = bwd.alloc(4 * m * n) if act_bytes != 4 else 0
        bwd.alloc(4 * n)
        bwd.free(gy_f)
    return max(fwd.peak, bwd.peak)


def real_fp8_available(device: torch.device) -> tuple[bool, str]:
    """Whether scaled fp8 GEMMs really run here; the reason when not."""
    if device.type != "cuda":
        return False, f"no fp8 tensor cores on {device.type}"
    cap = torch.cuda.get_device_capability(device)
    if cap < (9, 0):  # pragma: no cover - needs a GPU
        return False, f"{torch.cuda.get_device_name(device)} (sm_{cap[0]}{cap[1]}) is not H100-class (sm_90+)"
    if not hasattr(torch, "_scaled_mm"):  # pragma: no cover
        return False, "this torch has no torch._scaled_mm"
    return True, ""


class FP8(Precision):
    """fp8 GEMMs in every linear layer: E4M3 weights/activations forward, E5M2 gradients backward.

    Micikevicius et al. 2022, "FP8 Formats for Deep Learning", arXiv:2209.05433: fp32 master weights
    (the parameters never change dtype; each forward quantizes a copy);
    ``scaling`` "per_tensor" (one S per operand) or "per_channel" (one S per
    output feature of W and per token of x, and correspondingly in the
    backward GEMMs); S = fp8_max / amax of the current tensor (just-in-time
    scaling, no amax history). Everything that is not a linear layer's GEMM
    runs under autocast to ``compute`` (bf16 by default), the GEMMs' outputs
    have that dtype too. The LM head stays out unless ``lm_head`` (it is the
    layer most sensitive to fp8 and usually kept in higher precision).

    On H100-class GPUs (sm_90+) the GEMMs are real scaled fp8 matmuls
    (torch._scaled_mm). Anywhere else, or with ``mode = "emulate"``, they are
    emulated: quantize -> dequantize around each linear under the same scaling
    rules, matmul in fp32; info() then records ``emulated = True``.
    """

    name = "fp8"
    emulated = True  # until setup() has verified a real fp8 GEMM

    def __init__(self,
                 scaling: Annotated[Literal["per_tensor", "per_channel"],
                                    Arg("one scale per tensor, or per channel (W rows, x rows)")] = "per_tensor",
                 lm_head: Annotated[bool, Arg("also run the LM head in fp8")] = False,
                 mode: Annotated[Literal["auto", "emulate"],
                                 Arg("auto: real fp8 GEMMs on H100-class GPUs, emulated elsewhere; "
                                     "emulate: always emulate")] = "auto",
                 compute: Annotated[Literal["bf16", "fp32"],
                                    Arg("dtype of everything that is not an fp8 GEMM")] = "bf16"):
        self.per_channel = scaling == "per_channel"
        self.scaling, self.lm_head, self.mode, self.compute = scaling, lm_head, mode, compute
        self.n_layers = 0
        self.real: bool | None = None  # the GEMM path setup() chose; None before it
        self.note = "not set up"
        self.compute_dtype = torch.float32 if compute == "fp32" else torch.bfloat16

    def peak_format(self) -> str:
        # real: the GEMMs run on fp8 tensor cores; emulated: they dequantize and run in fp32
        return "fp32" if self.emulated else "fp8"

    def setup(self, model, device):
        real, why = real_fp8_available(device)
        if real and self.mode == "emulate":
            real, why = False, "mode = 'emulate'"
        if real:  # pragma: no cover - needs an H100-class GPU
            real, why = _probe_real(device, self.per_channel)
        targets = [(parent, child_name, child)
                   for parent_name, parent in model.named_modules()
                   for child_name, child in parent.named_children()
                   if isinstance(child, nn.Linear) and self.converts(f"{parent_name}.{child_name}".lstrip("."))]
        for parent, child_name, child in targets:
            setattr(parent, child_name, FP8Linear(child, self.per_channel, real))
        self.n_layers = len(targets)
        self.real = real
        self.emulated = not real or self.n_layers == 0
        self.note = ("torch._scaled_mm on fp8 tensor cores" if not self.emulated else
                     f"emulated (quantize -> dequantize, fp32 matmul): {why or 'no linear layers'}")

    def converts(self, name: str) -> bool:
        """Whether the nn.Linear at qualified name ``name`` runs its GEMMs in fp8."""
        return self.lm_head or name != "lm_head"

    def gemm_transient_bytes(self, linears, rows):
        """The largest working memory of one fp8 linear (``fp8_linear_transient_bytes``), forward or backward.

        Per-GEMM quantization needs an fp32 scaling copy and an fp8 copy of each
        operand, in the forward (E4M3) and again in the backward (E5M2 gradients,
        the saved input re-quantized; Micikevicius et al. 2022, arXiv:2209.05433,
        sec. 4), plus the GEMM's layout copies; the accounting is abl's own. The
        path is the one setup() chose; before setup (a cost prediction knows no
        device) the larger of real and emulated, or emulated with mode "emulate".
        """
        if self.real is not None:
            paths = [self.real]
        else:
            paths = [False] if self.mode == "emulate" else [True, False]
        act = self.compute_dtype.itemsize
        return max([fp8_linear_transient_bytes(rows, k, n, real=real, act_bytes=act, bias=bias)
                    for name, k, n, bias in linears if self.converts(name) for real in paths] + [0])

    def info(self) -> dict[str, Any]:
        return {**super().info(), "fp8_scaling": self.scaling, "fp8_layers": self.n_layers,
                "fp8_lm_head": self.lm_head, "fp8_compute": self.compute, "fp8_gemm": self.note}


def _probe_real(device, per_channel) -> tuple[bool, str]:  # pragma: no cover - needs a GPU
    """Run one small real fp8 GEMM and compare it with the emulation before trusting it."""
    try:
        a = torch.randn(32, 64, device=device)
        b = torch.randn(64, 48, device=device)
        real = fp8_matmul(a, b, E4M3, E4M3, per_channel, torch.float32, True)
        emul = fp8_matmul(a, b, E4M3, E4M3, per_channel, torch.float32, False)
    except Exception as exc:  # an unsupported layout/scale mode on this GPU or torch
        return False, f"torch._scaled_mm failed: {type(exc).__name__}: {exc}"
    err = (real - emul).abs().max().item() / max(1e-6, emul.abs().max().item())
    if not err < 2e-2:
        return False, f"torch._scaled_mm disagrees with the emulation (rel. err {err:.3g})"
    return True, ""


@hookimpl
def register_components(register):
    # each factory's signature declares its parameters (type, default, doc, bounds)
    register("precision", "fp32", FP32)
    register("precision", "tf32", TF32)
    register("precision", "bf16", BF16)
    register("precision", "fp16", FP16)
    register("precision", "fp8", FP8)
