"""The GPU probe's RoPE measurement at the 126M cell's own arguments (run first in stage e).

The probe of 2026-11-28 profiled ``_rope_kernel`` in the 126M cell (docs/gpu.md;
read as 54% of its CUDA time over 80 calls a step, which counts each launch twice: docs/kernels.md
"RoPE"); this times the rewritten kernel where the cell calls it, against the kernel profiled then
and the torch reference, and q and k rotated in one launch (``rope_qk_triton``) against two, so
that the next GPU session measures the change. Like the other stages it takes tiny shapes
(``tiny``) so a test can run every line in the Triton interpreter.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .probe_kernels import Report, error_text, fmt_ms, stage_layernorm, stage_timer

# the kernel the 2026-11-28 probe profiled at 54% of the 126M cell's CUDA time (kept in the working tree)
OLD_ROPE = Path("tests") / "kernels" / "data" / "old_rope_kernel.py"


def _old_rope(device) -> Callable[..., Any] | None:
    """The old RoPE kernel's forward on x [B, H, T, D] (its own launcher's tile), or None without the file."""
    import importlib.util

    import torch

    if not OLD_ROPE.is_file():
        return None
    spec = importlib.util.spec_from_file_location("abl_probe_old_rope", OLD_ROPE)
    if spec is None or spec.loader is None:
        return None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from ..kernels.utils import next_pow2, triton

    def old(x, cos, sin, interleaved):
        b, h, t, d = x.shape
        y = torch.empty(b, h, t, d, dtype=x.dtype, device=x.device)
        c, s = (a[None].expand(b, t, d // 2) for a in (cos, sin))
        block_k = next_pow2(d // 2)
        block_t = max(1, min(next_pow2(t), 4096 // block_k, 64))
        mod._rope_kernel[(b * h, triton.cdiv(t, block_t))](
            x, y, c, s, x.stride(0), x.stride(1), x.stride(2), y.stride(0), y.stride(1), y.stride(2), 0,
            c.stride(1), h, t, d // 2, INTERLEAVED=interleaved, BACKWARD=False, BLOCK_T=block_t, BLOCK_K=block_k,
            num_warps=4)
        return y

    return old


def rope_at_the_cell(report: Report, device, tiny: bool) -> None:
    """RoPE on the 126M cell's own arguments (scripts/gpu_big.toml: B16 T1024, 16 heads of 64, bf16;
    q a transposed view of its [B, T, H, D] projection, k a view of the [B, T, 2, H, D] key/value
    projection, one [T, D/2] fp32 angle table, the default interleaved layout): the Triton op, the old
    kernel (forward), the torch reference eager and compiled; fwd and fwd+bwd (the backward as
    ``torch.autograd.grad`` of the view, no accumulation), each for q and k."""
    import torch

    from ..kernels.rope import rope_reference, rope_triton

    b, t, h, d = (1, 8, 2, 16) if tiny else (16, 1024, 16, 64)
    dt = torch.bfloat16
    torch.manual_seed(0)
    qp = torch.randn(b, t, h, d, device=device, dtype=dt)
    kvp = torch.randn(b, t, 2, h, d, device=device, dtype=dt)
    views = {"q": qp.transpose(1, 2), "k": kvp.permute(2, 0, 3, 1, 4)[0]}
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    ang = torch.outer(torch.arange(t, device=device, dtype=torch.float32), inv_freq)
    cos, sin = ang.cos(), ang.sin()
    nbytes = 2 * b * h * t * d * 2  # read and write x once (the angles are 1/32 of it)
    report.line(f"rope at the 126M cell: B{b} T{t} H{h} D{d} bf16, q {tuple(views['q'].stride())} and k "
                f"{tuple(views['k'].stride())} strided views, [T, D/2] fp32 angles; GB/s of x read + written")
    compiled = torch.compile(rope_reference, backend="aot_eager" if tiny else "inductor", dynamic=False)
    providers: list[tuple[str, Callable[..., Any], bool]] = [
        ("triton interleaved", lambda x: rope_triton(x, cos, sin, "interleaved"), True),
        ("triton half", lambda x: rope_triton(x, cos, sin, "half"), True),
        ("torch reference eager", lambda x: rope_reference(x, cos, sin, "interleaved"), True),
        ("torch reference compiled", lambda x: compiled(x, cos, sin, "interleaved"), True)]
    old = _old_rope(device) if device.type == "cuda" else None
    if old is not None:
        providers.insert(2, ("old kernel interleaved (fwd)", lambda x: old(x, cos, sin, True), False))
    else:
        report.line(f"old kernel: not run ({'no ' + str(OLD_ROPE) if device.type == 'cuda' else 'needs CUDA'})")
    timer = stage_timer()
    ref = {name: rope_reference(x, cos, sin, "interleaved").float() for name, x in views.items()}
    for name, fn, grads in providers:
        for which, view in views.items():
            if report.over(6):
                report.stopped(f"rope {name} {which} and after")
                return
            label = f"rope {name} {which}"
            try:
                x = view.detach().requires_grad_(grads)
                out = fn(x)
                diff = (float((out.detach().float() - ref[which]).abs().max()) / float(ref[which].abs().max())
                        if "half" not in name else None)
                fwd = timer(lambda: fn(x))
                both = None
                if grads:
                    dy = torch.randn_like(out)
                    both = timer(lambda: torch.autograd.grad(fn(x), x, dy))
            except Exception as exc:  # noqa: BLE001 - say so, go on
                report.row(f"{label:<40} not run: {error_text(exc)}", provider=label, error=error_text(exc))
                continue
            report.row(f"{label:<40} fwd {fmt_ms(fwd)} ({nbytes / fwd / 1e6:.0f} GB/s), fwd+bwd {fmt_ms(both)}"
                       + (f" ({2 * nbytes / both / 1e6:.0f} GB/s)" if both else "")
                       + (f"; max |y - ref| / max |ref| {diff:.3g}" if diff is not None else ""),
                       provider=label, fwd_ms=fwd, fwd_bwd_ms=both, rel_diff=diff)


def rope_qk_at_the_cell(report: Report, device, tiny: bool) -> None:
    """q and k of the 126M cell (as ``rope_at_the_cell``) rotated together: ``rope_qk_triton`` (one
    launch, and one for dq and dk) against ``rope_triton`` on q then on k (two launches each way),
    both layouts; fwd and fwd+bwd (``torch.autograd.grad`` of the two views)."""
    import torch

    from ..kernels.rope import rope_qk_reference, rope_qk_triton, rope_triton

    b, t, h, d = (1, 8, 2, 16) if tiny else (16, 1024, 16, 64)
    dt = torch.bfloat16
    torch.manual_seed(0)
    qp = torch.randn(b, t, h, d, device=device, dtype=dt)
    kvp = torch.randn(b, t, 2, h, d, device=device, dtype=dt)
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    ang = torch.outer(torch.arange(t, device=device, dtype=torch.float32), inv_freq)
    cos, sin = ang.cos(), ang.sin()
    nbytes = 2 * 2 * b * h * t * d * 2  # read and write q and k once
    timer = stage_timer()
    for layout in ("interleaved", "half"):
        q = qp.transpose(1, 2).detach().requires_grad_()
        k = kvp.permute(2, 0, 3, 1, 4)[0].detach().requires_grad_()
        refs = [r.detach().float() for r in rope_qk_reference(q, k, cos, sin, layout=layout)]
        dys = [torch.randn_like(r).to(dt) for r in refs]
        providers: list[tuple[str, Callable[..., Any]]] = [
            (f"triton rope_qk {layout} (one launch)", lambda: rope_qk_triton(q, k, cos, sin, layout=layout)),
            (f"triton {layout} q then k (two launches)",
             lambda: (rope_triton(q, cos, sin, layout), rope_triton(k, cos, sin, layout)))]
        for name, fn in providers:
            if report.over(6):
                report.stopped(f"rope {name} and after")
                return
            label = f"rope {name} q+k"
            try:
                outs = fn()
                diff = max(float((o.detach().float() - r).abs().max()) / float(r.abs().max())
                           for o, r in zip(outs, refs))
                fwd = timer(fn)
                both = timer(lambda: torch.autograd.grad(fn(), (q, k), dys))
            except Exception as exc:  # noqa: BLE001 - say so, go on
                report.row(f"{label:<52} not run: {error_text(exc)}", provider=label, error=error_text(exc))
                continue
            report.row(f"{label:<52} fwd {fmt_ms(fwd)} ({nbytes / fwd / 1e6:.0f} GB/s), fwd+bwd {fmt_ms(both)} "
                       f"({2 * nbytes / both / 1e6:.0f} GB/s); max |y - ref| / max |ref| {diff:.3g}",
                       provider=label, fwd_ms=fwd, fwd_bwd_ms=both, rel_diff=diff)


def stage_rope_and_layernorm(report: Report, device, tiny: bool) -> None:
    """Stage e: RoPE at the cell first (the 126M cell's slowest kernel in the last probe; q and k apart,
    then together in one launch), then the layernorm kernels at several num_warps (``stage_layernorm``)."""
    import torch

    rope_at_the_cell(report, device, tiny)
    rope_qk_at_the_cell(report, device, tiny)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    stage_layernorm(report, device, tiny)
