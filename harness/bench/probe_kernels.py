"""The GPU probe's kernel stages (a-e) and its plumbing: each stage's file, the timer.

abl.bench.probe is the command and holds the whole description (docs/gpu.md, "The probe"); the
stages here need CUDA in the probe, and take tiny shapes (``tiny``) so that a test can run every
line of them in the Triton interpreter with ``cuda_ms`` swapped for a CPU timer.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

STAGES = {"determinism": "a", "attention": "b", "lce": "c", "ssd": "d", "layernorm": "e", "profile": "f",
          "torch-cell": "g"}
TITLES = {
    "determinism": "flash attention backward: bitwise repeats per forced tile configuration",
    "attention": "flash attention vs SDPA (each backend forced, and SDPA's own pick), fwd and fwd+bwd",
    "lce": "linear cross-entropy: chunk sizes, Liger, torch; forward+backward",
    "ssd": "ssd_scan: per-launch times, the scan (its Triton backward and the former fp32-vjp one) vs the torch "
           "reference and fla",
    "layernorm": "rope at the 126M cell's own arguments (vs the old kernel and torch); layernorm kernels at several "
                 "num_warps",
    "profile": "the 126M cell (scripts/gpu_big.toml) on the Triton kernels: profile and graph breaks",
    "torch-cell": "the 126M cell on train.kernels = torch: median step",
}
# seconds each stage may run (scripts/gpu_run.sh gives the process these, the stage stops itself 10 s sooner)
LIMITS = {"determinism": 75, "attention": 45, "lce": 40, "ssd": 70, "layernorm": 55, "profile": 120,
          "torch-cell": 90}
GRACE_S = 10


def stage_file(out: Path, stage: str) -> Path:
    return out / f"probe-{STAGES[stage]}-{stage}.txt"


class Report:
    """A stage's file, written a line at a time (flushed: a stage killed at its limit keeps its lines)."""

    def __init__(self, path: Path, stage: str, seconds: float):
        self.path = path
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + seconds
        self.seconds = seconds
        self.rows: list[dict[str, Any]] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(path, "w", buffering=1)
        self.line(f"# probe {STAGES[stage]} {stage}: {TITLES[stage]}")
        self.line(f"# budget {seconds:.0f} s; started {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")

    def line(self, text: str = "") -> None:
        self.f.write(text + "\n")
        self.f.flush()
        print(text, flush=True)

    def row(self, text: str, **data: Any) -> None:
        self.rows.append({"text": text, **data})
        self.line(text)

    def over(self, need: float = 0.0) -> bool:
        """True when ``need`` more seconds would outrun the budget."""
        return time.perf_counter() + need > self.deadline

    def stopped(self, left_out: str) -> None:
        self.line(f"stopped: the stage's budget of {self.seconds:.0f} s is spent; not run: {left_out}")

    def close(self, status: str = "done") -> None:
        self.line(f"json: {json.dumps(self.rows, default=str)}")
        self.line(f"{status} in {time.perf_counter() - self.t0:.1f} s")
        self.f.close()


# ---------------------------------------------------------------- timing


def cuda_ms(fn: Callable[[], Any], leaves: list | None = None, rep: int = 40) -> float:  # pragma: no cover - GPU
    """Median ms of ``fn`` (triton.testing.do_bench, L2 flushed between repetitions)."""
    import triton.testing

    from ..kernels.autoselect import median_of

    return median_of(triton.testing.do_bench(fn, warmup=10, rep=rep, grad_to_none=leaves, quantiles=[0.5]))


def stage_timer() -> Callable[..., float]:
    """The stages' timer (a test swaps ``cuda_ms`` for a CPU one to run the stages in the interpreter)."""
    return cuda_ms


def fwd_and_fwd_bwd(fn: Callable[..., Any], args: list, leaves: list[int],
                    timer: Callable[..., float]) -> tuple[float, float]:
    """(fwd ms, fwd+bwd ms) of ``fn(*args)``; the backward under one fixed output gradient."""
    import torch

    from ..kernels.autoselect import first

    out = first(fn(*args))
    grad = torch.randn_like(out.float()).to(out.dtype) if out.dim() else torch.ones_like(out)
    tensors = [args[i] for i in leaves]

    def both():
        first(fn(*args)).backward(grad)

    return timer(lambda: fn(*args), tensors), timer(both, tensors)


def fmt_ms(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.4g} ms"


def error_text(exc: BaseException) -> str:
    """An exception in one line: its type and the first 200 characters of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"


# ---------------------------------------------------------------- a: determinism per tile


@contextlib.contextmanager
def forced_tile(fa, cfg: tuple, kinds: list[str], q) -> Iterator[list[str]]:
    """Launch kinds ``kinds`` of the attention module ``fa`` with ``cfg`` alone (those whose candidates
    at ``q`` hold it); yields the kinds forced. The chosen-tile cache is emptied before and after."""
    original = fa._candidates
    forced = [k for k in kinds if cfg in (tuple(c) for c in original(k, q))]

    def candidates(kind, q_, *more, **named):
        return (cfg,) if kind in forced else original(kind, q_, *more, **named)

    saved = dict(fa._chosen)
    fa._candidates = candidates
    fa._chosen.clear()
    try:
        yield forced
    finally:
        fa._candidates = original
        fa._chosen.clear()
        fa._chosen.update(saved)


def launch_kinds(fa, kernel: Callable[..., Any], args: list, leaves: list[int]) -> tuple[list[str], list[str], Any]:
    """(forward kinds, backward kinds, a q the launcher saw): ``fa._launch`` watched over one fwd+bwd."""
    import torch

    from ..kernels.autoselect import first

    seen: dict[str, list[str]] = {"fwd": [], "bwd": []}
    phase = ["fwd"]
    qs: list[Any] = []
    original = fa._launch

    def spy(kind, q, launch, *more, **named):
        if kind not in seen[phase[0]]:
            seen[phase[0]].append(kind)
        qs.append(q)
        return original(kind, q, launch, *more, **named)

    fa._launch = spy
    try:
        out = first(kernel(*args))
        phase[0] = "bwd"
        torch.autograd.grad(out, [args[i] for i in leaves], torch.ones_like(out))
    finally:
        fa._launch = original
    return seen["fwd"], seen["bwd"], qs[0] if qs else None


def tile_configs(fa, kinds: list[str], q) -> list[tuple]:
    """Every tile the launcher could pick for these kinds at ``q`` (the union, in the launcher's order)."""
    out: list[tuple] = []
    for kind in kinds:
        for cfg in fa._candidates(kind, q):
            if tuple(cfg) not in out:
                out.append(tuple(cfg))
    return out


def attention_tile_repeats(report: Report, d: int, shape: tuple, device, repeats: int,
                           timer: Callable[..., float] | None) -> None:
    """Stage a for one head dim: the default launch, then every backward tile forced."""
    import torch

    from ..kernels import flash_attention as fa
    from ..kernels.autoselect import first, make_inputs
    from ..kernels.utils import check_error
    from .determinism import repeat_backward

    torch.manual_seed(0)
    inp = make_inputs("flash_attention", shape, torch.bfloat16, device)
    leaves = inp.leaf_tensors()
    out = first(inp.kernel(*inp.args))
    grad = torch.randn_like(out.float()).to(out.dtype)
    truth_args = inp.fp32_args()
    want = torch.autograd.grad(first(inp.reference(*truth_args)), inp.leaf_tensors(truth_args), grad.float())
    lowp = torch.autograd.grad(first(inp.torch_path(*inp.args)), leaves, grad)
    del truth_args, out
    names = ("dq", "dk", "dv")

    def one(label: str, forced: list[str]) -> None:
        got = repeat_backward(inp.kernel, inp.args, inp.leaves, repeats, grad)
        grads = torch.autograd.grad(first(inp.kernel(*inp.args)), leaves, grad)
        checks = {n: check_error(g, w, lw, torch.bfloat16) for n, g, w, lw in zip(names, grads, want, lowp)}
        worst = max(checks, key=lambda n: checks[n].error / max(checks[n].bound, 1e-30))
        ms = None
        if timer is not None:
            ms = timer(lambda: torch.autograd.grad(first(inp.kernel(*inp.args)), leaves, grad), None)
        differing = ",".join(got["differing"]).replace("grad 0", "dq").replace("grad 1", "dk").replace("grad 2", "dv")
        chosen = {k[0]: v for k, v in getattr(fa, "_chosen", {}).items() if isinstance(k, tuple)}
        text = (f"D{d} {label:<28} repeats {repeats}: {'EQUAL' if got['equal'] else 'DIFFER'}"
                + ("" if got["equal"] else f" ({got['runs_differing']} of {repeats - 1} runs; {differing}; "
                                            f"max |diff| {got['max_abs_diff']:.3g})")
                + f"; worst {worst} {checks[worst].error:.4g} (bound {checks[worst].bound:.4g}, torch "
                  f"{checks[worst].torch_error:.4g}) {'ok' if all(c.ok for c in checks.values()) else 'OUT OF BOUNDS'}"
                + f"; fwd+bwd {fmt_ms(ms)}")
        report.row(text, d=d, tile=label, forced=forced, equal=got["equal"], runs_differing=got["runs_differing"],
                   differing=differing, max_abs_diff=got["max_abs_diff"],
                   errors={n: c.error for n, c in checks.items()}, bounds={n: c.bound for n, c in checks.items()},
                   ok=all(c.ok for c in checks.values()), ms=ms, chosen={str(k): v for k, v in chosen.items()})

    if not all(hasattr(fa, a) for a in ("_candidates", "_launch", "_chosen")):
        report.line(f"D{d}: cannot force tiles: abl.kernels.flash_attention has no _candidates/_launch/_chosen; "
                    "the default launch only")
        one("default", [])
        return
    fa._chosen.clear()
    fwd_kinds, bwd_kinds, q = launch_kinds(fa, inp.kernel, inp.args, inp.leaves)
    configs = tile_configs(fa, bwd_kinds, q)
    report.line(f"D{d} {inp.shape} bf16: forward launches {fwd_kinds}, backward launches {bwd_kinds}; "
                f"backward tiles (block_m, block_n, warps, stages) the launcher can pick: {configs}")
    fa._chosen.clear()
    one("default", [])
    report.line(f"D{d}   default picked: " + ", ".join(f"{k[0]} {v}" for k, v in fa._chosen.items()
                                                       if isinstance(k, tuple) and k[0] in bwd_kinds))
    for i, cfg in enumerate(configs):
        if report.over(10):
            report.stopped(f"D{d} tiles {configs[i:]}")
            return
        with forced_tile(fa, cfg, bwd_kinds, q) as forced:
            try:
                one(f"forced {cfg} on {'+'.join(k.removeprefix('bwd_') for k in forced)}", forced)
            except Exception as exc:  # noqa: BLE001 - a tile that does not fit on this GPU: say so, go on
                report.row(f"D{d} forced {cfg}: did not run: {error_text(exc)}", d=d, tile=str(cfg), error=error_text(exc))
        if device.type == "cuda":
            torch.cuda.empty_cache()


def stage_determinism(report: Report, device, tiny: bool) -> None:
    repeats = 5
    timer = stage_timer() if device.type == "cuda" else None
    for d in (128, 64):
        if report.over(15):
            report.stopped(f"D{d}")
            return
        shape = (1, 2, 40, d) if tiny else (2, 16, 2048, d)
        attention_tile_repeats(report, d, shape, device, 3 if tiny else repeats, timer)


# ---------------------------------------------------------------- b: attention vs SDPA


def sdpa_default_backend(q, k, v) -> str:
    """The backend SDPA picks for these inputs (causal), by torch's own chooser."""
    import torch
    from torch.nn.attention import SDPBackend

    try:
        choice = torch._fused_sdp_choice(q, k, v, None, 0.0, True)
        return SDPBackend(choice).name
    except Exception as exc:  # noqa: BLE001 - a private API: say that it could not be asked
        return f"unknown ({error_text(exc)})"


def stage_attention(report: Report, device, tiny: bool) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..kernels.flash_attention import flash_attention_triton

    backends = {"sdpa flash": SDPBackend.FLASH_ATTENTION, "sdpa cudnn": SDPBackend.CUDNN_ATTENTION,
                "sdpa efficient": SDPBackend.EFFICIENT_ATTENTION}
    for d in (64, 128):
        b, h, t = (1, 2, 40) if tiny else (4, 16, 4096)
        torch.manual_seed(0)
        args = [torch.randn(b, h, t, d, device=device, dtype=torch.bfloat16).requires_grad_() for _ in range(3)]
        flops = 4 * b * h * t * t * d / 2
        report.line(f"D{d} B{b} H{h} T{t} causal bf16: SDPA's own pick: {sdpa_default_backend(*args)}")
        providers: dict[str, Callable[..., Any]] = {
            "triton": lambda q, k, v: flash_attention_triton(q, k, v, causal=True),
            "sdpa default": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)}
        for name, be in backends.items():
            def forced(q, k, v, be=be):
                with sdpa_kernel([be]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            providers[name] = forced
        base = None
        for name, fn in providers.items():
            if report.over(5):
                report.stopped(f"D{d} {name} and after")
                return
            try:
                fwd, both = fwd_and_fwd_bwd(fn, args, [0, 1, 2], stage_timer())
            except Exception as exc:  # noqa: BLE001 - a backend that does not take these inputs
                report.row(f"D{d} {name:<15} not run: {error_text(exc)}", d=d, provider=name, error=error_text(exc))
                continue
            base = both if name == "sdpa default" else base
            report.row(f"D{d} {name:<15} fwd {fmt_ms(fwd)} ({flops / fwd / 1e9:.0f} TFLOP/s), fwd+bwd {fmt_ms(both)} "
                       f"({3.5 * flops / both / 1e9:.0f} TFLOP/s)"
                       + (f", {base / both:.2f}x SDPA's pick (fwd+bwd)" if base else ""),
                       d=d, provider=name, fwd_ms=fwd, fwd_bwd_ms=both)
            torch.cuda.empty_cache()


# ---------------------------------------------------------------- c: linear cross-entropy


def stage_lce(report: Report, device, tiny: bool) -> None:
    import torch
    import torch.nn.functional as F

    from ..kernels.autoselect import first
    from ..kernels.cross_entropy import linear_cross_entropy_triton
    from .peers import peer as _peer

    liger = _peer("liger_kernel.transformers.functional")
    for n, d, v in ((64, 32, 300),) if tiny else ((8192, 4096, 65536), (16384, 1024, 32768)):
        torch.manual_seed(0)
        hid = torch.randn(n, d, device=device).to(torch.bfloat16).requires_grad_()
        w = (torch.randn(v, d, device=device) * d ** -0.5).to(torch.bfloat16).requires_grad_()
        y = torch.randint(0, v, (n,), device=device)
        flops = 6 * n * d * v
        providers: dict[str, Callable[..., Any]] = {
            "torch": lambda h_, w_, y_: F.cross_entropy(F.linear(h_, w_).float(), y_),
            "triton default chunk": lambda h_, w_, y_: linear_cross_entropy_triton(h_, w_, y_)}
        for chunk in (16, 32) if tiny else (256, 512, 1024, 2048, 4096, 8192):
            providers[f"triton chunk {chunk}"] = lambda h_, w_, y_, c=chunk: linear_cross_entropy_triton(
                h_, w_, y_, chunk_size=c)
        if liger is not None:
            providers["liger fused"] = lambda h_, w_, y_: liger.liger_fused_linear_cross_entropy(h_, w_, y_)
        else:
            report.line("liger: not installed")
        ref_loss = float(providers["torch"](hid, w, y).detach())
        base = None
        report.line(f"N{n} D{d} V{v} bf16, forward+backward (the fused ops form the gradients in the forward)")
        for name, fn in providers.items():
            if report.over(4):
                report.stopped(f"N{n} {name} and after")
                return
            try:
                loss = float(first(fn(hid, w, y)).detach())
                both = stage_timer()(lambda: first(fn(hid, w, y)).backward(), [hid, w])
            except Exception as exc:  # noqa: BLE001
                report.row(f"N{n} {name:<22} not run: {error_text(exc)}", shape=(n, d, v), provider=name, error=error_text(exc))
                continue
            base = both if name == "torch" else base
            report.row(f"N{n} {name:<22} fwd+bwd {fmt_ms(both)} ({flops / both / 1e9:.0f} TFLOP/s)"
                       + (f", {base / both:.2f}x torch" if base else "") + f"; |loss - torch| {abs(loss - ref_loss):.3g}",
                       shape=(n, d, v), provider=name, fwd_bwd_ms=both, loss_diff=abs(loss - ref_loss))
            torch.cuda.empty_cache()


# ---------------------------------------------------------------- d: ssd_scan


def profile_table(prof, cuda: bool, rows: int = 25) -> list[str]:
    """torch.profiler's table of the top ops (kernels included, with calls and time per call), by
    self CUDA time on a GPU (by self CPU time elsewhere)."""
    keys = ("self_device_time_total", "self_cuda_time_total", "device_time_total") if cuda else ("self_cpu_time_total",)
    averages = prof.key_averages()
    for key in keys:
        try:
            return averages.table(sort_by=key, row_limit=rows, max_name_column_width=70).splitlines()
        except (AttributeError, KeyError, ValueError, TypeError):
            continue
    return averages.table(row_limit=rows).splitlines()


def former_backward_scan(chunk: int) -> Callable[..., Any]:
    """The Triton forward with ssd_scan's former backward (the vector-Jacobian product of
    ``ssd_chunked`` recomputed in fp32, ``ssd_scan_bwd_vjp``): the baseline the Triton backward
    (``abl.kernels.ssd_scan_bwd``) replaced, timed beside it. Takes (x, dt, a, bm, cm), returns y."""
    import torch

    from ..kernels.ssd_scan import ssd_scan_bwd_vjp

    class Former(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, dt, a, bm, cm):
            y, _ = torch.ops.abl.ssd_scan_fwd(x, dt, a, bm, cm, chunk, None)
            ctx.save_for_backward(x, dt, a, bm, cm)
            return y

        @staticmethod
        def backward(ctx, dy):
            x, dt, a, bm, cm = ctx.saved_tensors
            dfinal = x.new_zeros(x.shape[0], x.shape[2], x.shape[3], bm.shape[3])
            return ssd_scan_bwd_vjp(dy, dfinal, x, dt, a, bm, cm, chunk)[:5]

    return Former.apply


def stage_ssd(report: Report, device, tiny: bool) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ..kernels.autoselect import make_inputs
    from .peers import fla_ssd
    from .peers import peer as _peer

    shape = (1, 40, 2, 16, 16, 16) if tiny else (4, 2048, 32, 64, 128, 64)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    inp = make_inputs("ssd_scan", shape, torch.bfloat16, device)
    report.line(f"{inp.shape} bf16")
    fla = _peer("fla.ops.simple_gla")
    providers: dict[str, Callable[..., Any]] = {"triton": inp.kernel, "torch reference (autocast bf16)": inp.torch_path}
    if fla is not None and hasattr(fla, "chunk_simple_gla"):
        providers["fla chunk_simple_gla"] = lambda x, dt, a, bm, cm: fla_ssd(fla.chunk_simple_gla, x, dt, a, bm, cm)
    else:
        report.line("fla: not installed (or no fla.ops.simple_gla.chunk_simple_gla)")
    # the Triton backward (abl.kernels.ssd_scan_bwd) against the former fp32-vjp one (same forward); last,
    # as the least needed if the stage's budget runs out
    providers["triton fwd + former fp32-vjp bwd"] = former_backward_scan(shape[5])
    ref = inp.torch_path(*inp.args).detach().float()
    for name, fn in providers.items():
        if report.over(5):
            report.stopped(f"{name} and after")
            return
        try:
            diff = float((fn(*inp.args).detach().float() - ref).abs().max()) / float(ref.abs().max())
            fwd, both = fwd_and_fwd_bwd(fn, inp.args, inp.leaves, stage_timer())
        except Exception as exc:  # noqa: BLE001
            report.row(f"{name:<32} not run: {error_text(exc)}", provider=name, error=error_text(exc))
            continue
        report.row(f"{name:<32} fwd {fmt_ms(fwd)}, fwd+bwd {fmt_ms(both)}; max |y - torch| / max |torch| {diff:.3g}",
                   provider=name, fwd_ms=fwd, fwd_bwd_ms=both, rel_diff=diff)
    if not report.over(6):  # the Triton backward's gradients against the former fp32 vjp's (same forward)
        grads = {}
        for name in ("triton", "triton fwd + former fp32-vjp bwd"):
            leaves = [inp.args[i] for i in inp.leaves]
            grads[name] = torch.autograd.grad(providers[name](*inp.args).float().square().sum(), leaves)
        diffs = {k: float((a.float() - w.float()).abs().max()) / max(float(w.float().abs().max()), 1e-12)
                 for k, a, w in zip(("dx", "ddt", "dA", "dB", "dC"), *grads.values())}
        report.row("triton bwd vs former fp32-vjp bwd: max |g - g_vjp| / max |g_vjp| "
                   + ", ".join(f"{k} {v:.3g}" for k, v in diffs.items()), provider="bwd vs vjp", **diffs)
    for name in ("triton", "fla chunk_simple_gla"):
        scan = providers.get(name)
        if scan is None or report.over(8):
            continue
        out = scan(*inp.args)
        grad = torch.randn_like(out)
        sync()
        with profile(activities=[ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                scan(*inp.args).backward(grad)
            sync()
        report.line(f"{name}: per launch over 3 fwd+bwd (torch.profiler, by self CUDA time; the kernels' rows "
                    "give calls and time per call)")
        for line in profile_table(prof, device.type == "cuda", 20):
            report.line(line)


# ---------------------------------------------------------------- e: rope at the cell, layernorm num_warps

def _fixed_warps(warps: int) -> Callable[[int], int]:
    def num_warps(block_n: int) -> int:
        return warps

    return num_warps


def stage_layernorm(report: Report, device, tiny: bool) -> None:
    import torch


    from ..kernels import layernorm as ln
    from ..kernels.autoselect import make_inputs
    from .peers import peer as _peer

    m, n = (16, 64) if tiny else (8192, 4096)
    torch.manual_seed(0)
    inp = make_inputs("layernorm", (m, n), torch.bfloat16, device)
    nbytes = {"fwd": 2 * m * n * 2, "fwd+bwd": 5 * m * n * 2}
    liger = _peer("liger_kernel.transformers.functional")
    providers: list[tuple[str, Callable[..., Any], Any]] = [("triton default", inp.kernel, None)]
    if hasattr(ln, "_num_warps"):
        providers += [(f"triton num_warps={w}", inp.kernel, w) for w in (1, 2, 4, 8, 16, 32)]
    else:
        report.line("cannot force num_warps: abl.kernels.layernorm has no _num_warps")
    providers.append(("torch", inp.torch_path, None))
    if liger is not None:
        providers.append(("liger", lambda x, w, b: liger.liger_layer_norm(x, w, b, 1e-5), None))
    report.line(f"M{m} N{n} bf16 (fp32 weight and bias); GB/s of the ideal traffic (fwd 2MN, fwd+bwd 5MN elements)")
    original = getattr(ln, "_num_warps", None)
    for name, fn, warps in providers:
        if report.over(3):
            report.stopped(f"{name} and after")
            break
        if warps is not None:
            setattr(ln, "_num_warps", _fixed_warps(warps))
        try:
            fwd, both = fwd_and_fwd_bwd(fn, inp.args, inp.leaves, stage_timer())
            report.row(f"{name:<22} fwd {fmt_ms(fwd)} ({nbytes['fwd'] / fwd / 1e6:.0f} GB/s), fwd+bwd {fmt_ms(both)} "
                       f"({nbytes['fwd+bwd'] / both / 1e6:.0f} GB/s)", provider=name, fwd_ms=fwd, fwd_bwd_ms=both)
        except Exception as exc:  # noqa: BLE001 - too many warps for the block: say so, go on
            report.row(f"{name:<22} not run: {error_text(exc)}", provider=name, error=error_text(exc))
        finally:
            if original is not None:
                setattr(ln, "_num_warps", original)
