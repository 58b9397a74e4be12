"""Determinism of the kernels' backward: the same inputs, backward several times, bitwise-equal gradients.

A kernel without atomics (every output element written by one program, in one
order) computes the same bits every time; two runs that differ mean a race (a
read before the write it depends on, a shared buffer reused too early) or a
miscompile. The error bounds cannot tell those from rounding: a race can stay
within them on some runs (flash attention's backward at head_dim 128 on an H100
did, four runs of six failing; docs/gpu.md). Ops whose kernels use atomics
(``tl.atomic_*``) sum in whatever order programs finish, so they are left out,
and say so.

``abl selftest`` runs ``determinism_plan`` on CUDA (the attention shapes the race
was seen at, every other op at its first selftest shape, bf16);
``abl.bench.probe`` repeats the attention backward per forced tile configuration.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from ..kernels.autoselect import DTYPE_NAMES, first, make_inputs

REPEATS = 5
# where the nondeterminism was seen (docs/gpu.md, "Still failing"), and its D64 twin
ATTENTION_SHAPES = [(2, 16, 2048, 128), (2, 16, 2048, 64)]


def uses_atomics(op: str) -> bool:
    """Whether the op's kernel module, or a kernel module of its own beside it (``ssd_scan_bwd`` beside
    ``ssd_scan``), calls a Triton atomic (its sums then depend on program order)."""
    import importlib
    import pkgutil

    from .. import kernels
    from ..kernels import module_of

    base = module_of(op)
    stem = base.__name__.rpartition(".")[2]
    mods = [base] + [importlib.import_module(f"{kernels.__name__}.{m.name}")
                     for m in pkgutil.iter_modules(kernels.__path__) if m.name.startswith(stem + "_")]
    return any("atomic_" in inspect.getsource(mod) for mod in mods)


def repeat_backward(kernel: Callable[..., Any], args: list[Any], leaves: list[int], repeats: int = REPEATS,
                    grad: torch.Tensor | None = None) -> dict[str, Any]:
    """Run ``kernel(*args)`` and its backward ``repeats`` times under one output gradient; compare the
    output and every input gradient bitwise with the first run's.

    Returns {"equal", "repeats", "differing": ["out", "grad 0", ...] of the first run that differed,
    "runs_differing": how many runs differed, "max_abs_diff": the largest difference seen}.
    """
    torch.manual_seed(1)
    first_out = None
    first_grads: list[torch.Tensor | None] = []
    differing: list[str] = []
    runs_differing, max_diff = 0, 0.0
    for _ in range(repeats):
        out = first(kernel(*args))
        if grad is None:
            grad = torch.randn_like(out.float()).to(out.dtype) if out.dim() else torch.ones_like(out)
        grads = torch.autograd.grad(out, [args[i] for i in leaves], grad, allow_unused=True)
        out = out.detach()
        if first_out is None:
            first_out, first_grads = out, list(grads)
            continue
        names = []
        for name, a, b in [("out", out, first_out)] + [(f"grad {leaves[i]}", g, f)
                                                        for i, (g, f) in enumerate(zip(grads, first_grads))]:
            if a is None or b is None:
                continue
            if not torch.equal(a, b):
                names.append(name)
                max_diff = max(max_diff, float((a.float() - b.float()).abs().max()))
        if names:
            runs_differing += 1
            differing = differing or names
    return {"equal": runs_differing == 0, "repeats": repeats, "differing": differing,
            "runs_differing": runs_differing, "max_abs_diff": max_diff}


def determinism_plan(device: torch.device) -> list[tuple[str, tuple, torch.dtype]]:
    """(op, shape, dtype): flash attention at ATTENTION_SHAPES, every other op at its first selftest shape; bf16."""
    from ..kernels import OPS
    from .selftest_kernels import SHAPES

    where = "cuda" if device.type == "cuda" else "cpu"
    plan: list[tuple[str, tuple, torch.dtype]] = []
    for op in OPS:
        shapes = ATTENTION_SHAPES if op == "flash_attention" and where == "cuda" else SHAPES[op][where][:1]
        plan += [(op, shape, torch.bfloat16) for shape in shapes]
    return plan


def check_determinism(device: torch.device, repeats: int = REPEATS,
                      plan: list[tuple[str, tuple, torch.dtype]] | None = None,
                      log: Callable[[str], None] = lambda m: None) -> list[dict[str, Any]]:
    """One row per (op, shape, dtype): ``ok`` True when every run matched the first bit for bit,
    None (skipped) for an op whose kernel uses atomics, False when runs differ or the kernel raised."""
    rows = []
    for op, shape, dtype in plan if plan is not None else determinism_plan(device):
        row: dict[str, Any] = {"op": op, "dtype": DTYPE_NAMES[dtype], "repeats": repeats}
        try:
            if uses_atomics(op):
                rows.append({**row, "shape": "x".join(map(str, shape)), "ok": None,
                             "detail": "its kernel uses atomics: the sums' order is not fixed, so neither are the bits"})
                continue
            torch.manual_seed(0)
            inp = make_inputs(op, shape, dtype, device)
            row["shape"] = inp.shape
            got = repeat_backward(inp.kernel, inp.args, inp.leaves, repeats)
            row.update(got)
            row["ok"] = got["equal"]
            row["detail"] = (f"{repeats} runs, output and gradients bitwise equal" if got["equal"] else
                             f"{got['runs_differing']} of {repeats - 1} repeats differ from the first "
                             f"({', '.join(got['differing'])}; max |diff| {got['max_abs_diff']:.3g})")
        except Exception as exc:  # noqa: BLE001 - a kernel that raises fails its check, the others still run
            row.setdefault("shape", "x".join(map(str, shape)))
            row.update(ok=False, detail=f"raised {type(exc).__name__}: {exc}")
        log(f"determinism {op} {row['shape']} {row['dtype']}: "
            + ("skipped" if row["ok"] is None else "ok" if row["ok"] else f"FAILED ({row['detail']})"))
        rows.append(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows
