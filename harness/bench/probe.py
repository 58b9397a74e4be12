"""The GPU probe: seven short measurements, each with its own time limit and its own file.

    python -m abl.bench.probe STAGE --out DIR --seconds N [--tiny]

``scripts/gpu_run.sh probe`` runs every stage in turn, each in its own process
under ``timeout`` (docs/gpu.md, "The probe"). A stage writes its file line by
line as it goes, so a stage stopped at its limit still leaves what it measured;
it also watches its own budget (``--seconds``) and stops early, saying what it
left out. Stages, and their files (``probe-<letter>-<stage>.txt``):

a ``determinism``: flash attention's backward repeated on the same inputs
   (B2 H16 T2048, D128 and D64, causal, bf16: where the race was seen) under
   every tile configuration the launchers can pick, each forced in turn (the
   tiles are read from ``abl.kernels.flash_attention`` at run time, the way its
   launcher does: ``_candidates(kind, q)`` for each backward launch kind that
   ``_launch`` is seen to be called with); per tile: bitwise equality over the
   repeats, which gradients differ, the worst error against the fp32 truth
   under both bounds, and the time;
b ``attention``: the Triton kernel against SDPA with each backend forced
   (flash, cuDNN, memory-efficient) and SDPA's own pick named, fwd and
   fwd+bwd, D64 and D128, causal, bf16;
c ``lce``: the fused linear cross-entropy at several chunk sizes, Liger's
   fused linear cross-entropy, and torch's linear + cross-entropy, all
   forward+backward;
d ``ssd``: ssd_scan's Triton kernels per launch (torch.profiler), the
   whole scan fwd and fwd+bwd against the torch reference and fla's chunked
   simple-GLA kernel (abl.bench.kernelbench.fla_ssd);
e ``layernorm``: the layernorm kernels at several num_warps (forced through
   ``abl.kernels.layernorm._num_warps``), against torch and Liger;
f ``profile``: scripts/gpu_big.toml's 126M cell on the Triton kernels,
   compiled: the median step, a torch.profiler table of the top ops by CUDA
   time over a few steps, and torch.compile's graph-break count and reasons;
g ``torch-cell``: the same cell on ``train.kernels = torch``: its median step.

Without CUDA, stages a-e write "skipped: no CUDA"; f and g run the cell shrunk
to a CPU-sized fp32 one under ``--tiny`` (or ``ABL_GPU_TINY=1``), which is how
tests/test_gpu_scripts.py runs the whole probe on a CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

STAGES = {"determinism": "a", "attention": "b", "lce": "c", "ssd": "d", "layernorm": "e", "profile": "f",
          "torch-cell": "g"}
TITLES = {
    "determinism": "flash attention backward: bitwise repeats per forced tile configuration",
    "attention": "flash attention vs SDPA (each backend forced, and SDPA's own pick), fwd and fwd+bwd",
    "lce": "linear cross-entropy: chunk sizes, Liger, torch; forward+backward",
    "ssd": "ssd_scan: per-launch times, the scan vs the torch reference and fla",
    "layernorm": "layernorm kernels at several num_warps",
    "profile": "the 126M cell (scripts/gpu_big.toml) on the Triton kernels: profile and graph breaks",
    "torch-cell": "the 126M cell on train.kernels = torch: median step",
}
# seconds each stage may run (scripts/gpu_run.sh gives the process these, the stage stops itself 10 s sooner)
LIMITS = {"determinism": 75, "attention": 45, "lce": 40, "ssd": 40, "layernorm": 25, "profile": 120,
          "torch-cell": 90}
GRACE_S = 10
# the 126M cell: --cell, else scripts/gpu_big.toml of the working tree (an installed abl has no scripts/)
CELL_FILE = Path("scripts") / "gpu_big.toml"
# the big cell shrunk to a CPU-sized fp32 one (as scripts/gpu_run.sh's tiny big stage)
TINY_CELL = ["train.steps=4", "train.eval_every=4", "train.eval_batches=1", "train.batch_size=2", "model.context=32",
             "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "train.compile=false", "train.precision=fp32",
             "train.device=cpu"]


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


def _timer() -> Callable[..., float]:
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


def _fmt(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.4g} ms"


def _err(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"


# ---------------------------------------------------------------- a: determinism per tile


@contextlib.contextmanager
def forced_tile(fa, cfg: tuple, kinds: list[str], q) -> Iterator[list[str]]:
    """Launch kinds ``kinds`` of the attention module ``fa`` with ``cfg`` alone (those whose candidates
    at ``q`` hold it); yields the kinds forced. The chosen-tile cache is emptied before and after."""
    original = fa._candidates
    forced = [k for k in kinds if cfg in (tuple(c) for c in original(k, q))]

    def candidates(kind, q_):
        return (cfg,) if kind in forced else original(kind, q_)

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
                + f"; fwd+bwd {_fmt(ms)}")
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
                report.row(f"D{d} forced {cfg}: did not run: {_err(exc)}", d=d, tile=str(cfg), error=_err(exc))
        if device.type == "cuda":
            torch.cuda.empty_cache()


def stage_determinism(report: Report, device, tiny: bool) -> None:
    repeats = 5
    timer = _timer() if device.type == "cuda" else None
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
        return f"unknown ({_err(exc)})"


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
                fwd, both = fwd_and_fwd_bwd(fn, args, [0, 1, 2], _timer())
            except Exception as exc:  # noqa: BLE001 - a backend that does not take these inputs
                report.row(f"D{d} {name:<15} not run: {_err(exc)}", d=d, provider=name, error=_err(exc))
                continue
            base = both if name == "sdpa default" else base
            report.row(f"D{d} {name:<15} fwd {_fmt(fwd)} ({flops / fwd / 1e9:.0f} TFLOP/s), fwd+bwd {_fmt(both)} "
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
    from .kernelbench import _peer

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
                both = _timer()(lambda: first(fn(hid, w, y)).backward(), [hid, w])
            except Exception as exc:  # noqa: BLE001
                report.row(f"N{n} {name:<22} not run: {_err(exc)}", shape=(n, d, v), provider=name, error=_err(exc))
                continue
            base = both if name == "torch" else base
            report.row(f"N{n} {name:<22} fwd+bwd {_fmt(both)} ({flops / both / 1e9:.0f} TFLOP/s)"
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


def stage_ssd(report: Report, device, tiny: bool) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ..kernels.autoselect import make_inputs
    from .kernelbench import _peer, fla_ssd

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
    ref = inp.torch_path(*inp.args).detach().float()
    for name, fn in providers.items():
        if report.over(5):
            report.stopped(f"{name} and after")
            return
        try:
            diff = float((fn(*inp.args).detach().float() - ref).abs().max()) / float(ref.abs().max())
            fwd, both = fwd_and_fwd_bwd(fn, inp.args, inp.leaves, _timer())
        except Exception as exc:  # noqa: BLE001
            report.row(f"{name:<32} not run: {_err(exc)}", provider=name, error=_err(exc))
            continue
        report.row(f"{name:<32} fwd {_fmt(fwd)}, fwd+bwd {_fmt(both)}; max |y - torch| / max |torch| {diff:.3g}",
                   provider=name, fwd_ms=fwd, fwd_bwd_ms=both, rel_diff=diff)
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


# ---------------------------------------------------------------- e: layernorm num_warps


def _fixed_warps(warps: int) -> Callable[[int], int]:
    def num_warps(block_n: int) -> int:
        return warps

    return num_warps


def stage_layernorm(report: Report, device, tiny: bool) -> None:
    import torch

    from ..kernels import layernorm as ln
    from ..kernels.autoselect import make_inputs
    from .kernelbench import _peer

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
            fwd, both = fwd_and_fwd_bwd(fn, inp.args, inp.leaves, _timer())
            report.row(f"{name:<22} fwd {_fmt(fwd)} ({nbytes['fwd'] / fwd / 1e6:.0f} GB/s), fwd+bwd {_fmt(both)} "
                       f"({nbytes['fwd+bwd'] / both / 1e6:.0f} GB/s)", provider=name, fwd_ms=fwd, fwd_bwd_ms=both)
        except Exception as exc:  # noqa: BLE001 - too many warps for the block: say so, go on
            report.row(f"{name:<22} not run: {_err(exc)}", provider=name, error=_err(exc))
        finally:
            if original is not None:
                setattr(ln, "_num_warps", original)


# ---------------------------------------------------------------- f, g: the 126M cell


def cell_file() -> Path:
    """The cell's grid file: ABL_PROBE_CELL (set from --cell), scripts/gpu_big.toml here, or beside
    this source tree's harness/."""
    given = os.environ.get("ABL_PROBE_CELL")
    if given:
        return Path(given)
    if CELL_FILE.exists():
        return CELL_FILE
    return Path(__file__).resolve().parents[2] / CELL_FILE


def load_cell(kernels: str, tiny: bool):
    from ..contracts.plugin_manager import get_registry
    from ..grid.gridfile import load_grid

    registry = get_registry()
    overrides = [f"train.kernels={kernels}"] + (TINY_CELL if tiny else [])
    grid = load_grid(cell_file(), registry, overrides)
    return grid.cells[0], registry


def step_times(run, steps: int, report: Report, reserve: float) -> list[float]:
    """Wall seconds of up to ``steps`` training steps (stopping ``reserve`` s before the budget's end)."""
    from ..run.train import train_step
    from ..store.rundir import NullSink

    import inspect

    times: list[float] = []
    # (run, x, y), or the older (run, x, y, step, lr, sink): the step as the trainer runs it either way
    step_fn: Any = train_step
    extra = (run.cell.train.lr, NullSink()) if len(inspect.signature(train_step).parameters) > 3 else None
    for step in range(1, steps + 1):
        if report.over(reserve + (max(times) if times else 0)):
            break
        t0 = time.perf_counter()
        x, y = run.next_batch()
        if extra is None:
            step_fn(run, x, y)
        else:
            step_fn(run, x, y, step, *extra)
        run.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def prepared(report: Report, kernels: str, tiny: bool):
    """The cell prepared as a worker prepares it, compiled when it is, with what it took."""
    from ..run.compiled import compile_warmup
    from ..run.train import prepare

    cell, registry = load_cell(kernels, tiny)
    t0 = time.perf_counter()
    run = prepare(cell, registry)
    tc, mc = cell.train, cell.model
    report.line(f"cell: d_model {mc.d_model}, {mc.n_layers} blocks, {mc.n_heads} heads, context {mc.context}, "
                f"batch {tc.batch_size}, {cell.components['precision']['name']}, compile {tc.compile}, "
                f"train.kernels {tc.kernels} ({run.kernels.name}"
                + (f", torch for {sorted(run.kernels.torch_ops)}" if run.kernels.torch_ops else "") + f"), "
                f"{run.core.n_params(non_embedding=True) / 1e6:.1f}M parameters without the embedding; "
                f"prepared in {time.perf_counter() - t0:.1f} s on {run.device}")
    run.model.train()
    if tc.compile:
        report.line(f"compile warm-up: {compile_warmup(run):.1f} s")
    return run


def _median_line(report: Report, run, times: list[float], label: str) -> dict[str, Any]:
    tokens = run.cell.train.batch_size * run.cell.model.context
    med = statistics.median(times) if times else math.nan
    report.line(f"{label}: median step {med * 1e3:.1f} ms over {len(times)} steps ({tokens / med:,.0f} tokens/s)"
                if times else f"{label}: no step finished inside the budget")
    return {"median_step_s": med, "steps": len(times), "tokens_per_s": tokens / med if times else None}


def stage_profile(report: Report, device, tiny: bool) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    counters: Any = None
    try:
        from torch._dynamo import utils as dynamo_utils

        counters = dynamo_utils.counters
        counters.clear()
    except Exception:  # noqa: BLE001 - the counts are then not known
        counters = None
    run = prepared(report, "triton", tiny)
    warm = step_times(run, 1 if tiny else 3, report, 40)  # after compiling: the first steps may still recompile
    timed = step_times(run, 2 if tiny else 10, report, 35)
    report.rows.append(_median_line(report, run, warm[1:] + timed, "steps (unprofiled)"))
    cuda = run.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if report.over(15):
        report.stopped("the profile")
    else:
        with profile(activities=activities) as prof:
            step_times(run, 1 if tiny else 3, report, 10)
        report.line(f"torch.profiler, {1 if tiny else 3} step(s), top ops by self {'CUDA' if cuda else 'CPU'} time:")
        for line in profile_table(prof, cuda):
            report.line(line)
    if counters is not None:
        breaks = dict(counters.get("graph_break", {}))
        stats = dict(counters.get("stats", {}))
        report.row(f"graph breaks: {sum(breaks.values())} ({len(breaks)} distinct reasons); "
                   f"unique graphs {stats.get('unique_graphs', '-')}, frames {stats.get('calls_captured', '-')}",
                   graph_breaks=sum(breaks.values()), unique_graphs=stats.get("unique_graphs"))
        for reason, n in sorted(breaks.items(), key=lambda kv: -kv[1])[:15]:
            report.line(f"  {n:4d} x {str(reason)[:300]}")
    else:
        report.line("graph breaks: torch._dynamo.utils.counters not available")
    del run
    if cuda:
        torch.cuda.empty_cache()


def stage_torch_cell(report: Report, device, tiny: bool) -> None:
    run = prepared(report, "torch", tiny)
    times = step_times(run, 5 if tiny else 40, report, 5)
    report.rows.append(_median_line(report, run, times[2:] if len(times) > 4 else times, "steps (the first two left out)"))


# ---------------------------------------------------------------- main

NEEDS_CUDA = ("determinism", "attention", "lce", "ssd", "layernorm")
RUNNERS = {"determinism": stage_determinism, "attention": stage_attention, "lce": stage_lce, "ssd": stage_ssd,
           "layernorm": stage_layernorm, "profile": stage_profile, "torch-cell": stage_torch_cell}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m abl.bench.probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("stage", choices=list(STAGES))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=None, help="this stage's budget (default: its LIMITS - 10 s)")
    ap.add_argument("--cell", type=Path, default=None,
                    help="the grid file of stages f and g (default: scripts/gpu_big.toml of the working tree)")
    ap.add_argument("--tiny", action="store_true", default=os.environ.get("ABL_GPU_TINY", "0") == "1",
                    help="CPU-sized cells (also ABL_GPU_TINY=1)")
    args = ap.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else LIMITS[args.stage] - GRACE_S
    if args.cell is not None:
        os.environ["ABL_PROBE_CELL"] = str(args.cell.resolve())
    import torch

    cuda = torch.cuda.is_available()
    if not cuda:
        from ..kernels import enable_interpreter

        enable_interpreter()  # before triton is imported: the tiny cells' kernels run in it
    report = Report(stage_file(args.out, args.stage), args.stage, seconds)
    if args.stage in NEEDS_CUDA and not cuda:
        report.line("skipped: no CUDA")
        report.close("skipped")
        return 0
    if not cuda and not args.tiny:
        report.line("skipped: no CUDA (the full-size cell needs a GPU; --tiny runs a CPU-sized one)")
        report.close("skipped")
        return 0
    device = torch.device("cuda") if cuda else torch.device("cpu")
    if cuda:
        report.line(f"# device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    try:
        RUNNERS[args.stage](report, device, args.tiny)
    except Exception as exc:  # noqa: BLE001 - written to the stage's file, then a non-zero exit
        report.line(f"FAILED: {_err(exc)}")
        for line in traceback.format_exc().splitlines()[-15:]:
            report.line(f"  {line}")
        report.close("failed")
        return 1
    report.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
