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
   simple-GLA kernel (abl.bench.peers.fla_ssd);
e ``layernorm``: first RoPE at the 126M cell's own arguments (strided q/k views,
   interleaved; the old kernel, the torch reference eager and compiled), then the
   layernorm kernels at several num_warps (forced through
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
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .probe_kernels import (GRACE_S, LIMITS, STAGES, TITLES, Report, error_text, profile_table, stage_attention,
                            stage_determinism, stage_file, stage_lce, stage_ssd)
from .probe_rope import stage_rope_and_layernorm

__all__ = ["GRACE_S", "LIMITS", "RUNNERS", "STAGES", "TITLES", "Report", "main"]

# the 126M cell: --cell, else scripts/gpu_big.toml of the working tree (an installed abl has no scripts/)
CELL_FILE = Path("scripts") / "gpu_big.toml"
# the big cell shrunk to a CPU-sized fp32 one (as scripts/gpu_run.sh's tiny big stage)
TINY_CELL = ["train.steps=4", "train.eval_every=4", "train.eval_batches=1", "train.batch_size=2", "model.context=32",
             "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "train.compile=false", "train.precision=fp32",
             "train.device=cpu"]


# ---------------------------------------------------------------- f, g: the 126M cell


def kernel_table(prof, rows: int = 25) -> list[str]:
    """The GPU kernels alone, by their own time, with each one's share of all kernel time. torch.profiler's
    table also holds the CPU-side record inductor opens around each launch, named after the kernel
    (``_rope_kernel_0``, ...) and given that kernel's CUDA time, so summing its rows by name counts every
    compiled launch twice; device events count each once."""
    from torch.autograd import DeviceType

    kernels = [a for a in prof.key_averages() if getattr(a, "device_type", None) == DeviceType.CUDA]
    total = sum(a.self_device_time_total for a in kernels)
    if not kernels or total <= 0:
        return ["GPU kernels: none recorded"]
    kernels.sort(key=lambda a: -a.self_device_time_total)
    out = [f"GPU kernels alone ({len(kernels)} distinct, {total / 1e3:.2f} ms in all):",
           f"{'share':>6} {'ms':>9} {'calls':>6} {'us/call':>9}  kernel"]
    for a in kernels[:rows]:
        t = a.self_device_time_total
        out.append(f"{100 * t / total:5.1f}% {t / 1e3:9.3f} {a.count:6d} {t / max(1, a.count):9.1f}  {a.key[:90]}")
    return out


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
    from ..train.loop import train_step
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
    from ..train.compiled import compile_warmup
    from ..train.loop import prepare

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
        if cuda:  # each launch once: the table above counts a compiled launch twice (kernel_table)
            for line in kernel_table(prof):
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
           "layernorm": stage_rope_and_layernorm, "profile": stage_profile, "torch-cell": stage_torch_cell}


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
        report.line(f"FAILED: {error_text(exc)}")
        for line in traceback.format_exc().splitlines()[-15:]:
            report.line(f"  {line}")
        report.close("failed")
        return 1
    report.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
