"""``abl selftest``'s training section: short cells per precision, kernel backend and compile mode.

One small grid is run the way ``abl run`` runs it (abl.run.runner, a worker
per cell, in a scratch store), over ``train.precision`` x ``train.kernels`` x
``train.compile``; a combination that cannot be real on this device is left
out with the reason (TF32 needs an sm_80+ GPU, fp8 an sm_90+ one; on CPU the
Triton backend runs in the interpreter and compiling takes minutes, so
``quick`` keeps fp32 for it and compiles nothing). Each cell reports its
tokens/s, MFU, peak memory and the cost model's predicted training peak
beside the tensor peak it measured.

Checks:
- every cell completes;
- the loss curves agree: the final validation loss of each precision against
  its reference, same backend and compile mode (``LOSS_TOLERANCE``: tf32 and
  bf16 and fp16 against fp32, fp8 against bf16, the relative difference), and
  the Triton backend and the compiled model against eager torch at the same
  precision;
- predicted vs measured memory within the cost model's band
  (abl.model.costmodel.MEMORY_BAND) on the eager cells (a compiled step's
  memory is inductor's, not the model's the cost model predicts).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# relative difference of the final validation loss allowed against the reference cell
LOSS_TOLERANCE = {"fp32": 0.005, "tf32": 0.01, "bf16": 0.03, "fp16": 0.03, "fp8": 0.05}
# which cell a precision is compared with (fp8 against bf16: Micikevicius et al. 2022, arXiv:2209.05433, sec. 5)
LOSS_REFERENCE = {"tf32": "fp32", "bf16": "fp32", "fp16": "fp32", "fp8": "bf16"}
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")


def sizes(device: torch.device, quick: bool) -> dict[str, Any]:
    """The cell's model and schedule: tiny on CPU (every step also runs in the interpreter)."""
    if device.type == "cuda":
        return {"model": {"d_model": 256, "n_layers": 4, "n_heads": 4, "context": 256},
                "train": {"steps": 30 if quick else 60, "batch_size": 16, "warmup_steps": 5}}
    return {"model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32},
            "train": {"steps": 6 if quick else 20, "batch_size": 4, "warmup_steps": 2}}


def plan(device: torch.device, quick: bool) -> tuple[list[tuple[str, str, bool]], list[tuple[str, str]]]:
    """(precision, kernels, compile) of every cell to run, and (combination, why not) of those left out."""
    from ..kernels.utils import HAS_TRITON

    skipped: list[tuple[str, str]] = []
    precisions = []
    for p in PRECISIONS:
        why = precision_unreal(p, device)
        if why:
            skipped.append((f"{p} (every backend)", why))
        else:
            precisions.append(p)
    cells = []
    for p in precisions:
        for kernels in ("torch", "triton"):
            for compiled in (False, True):
                why = None
                if kernels == "triton" and not HAS_TRITON:
                    why = "triton is not installed"
                elif device.type == "cpu" and compiled and quick:
                    why = "--quick on CPU: compiling a model takes minutes here; run without --quick"
                elif device.type == "cpu" and quick and p == "fp16":
                    why = "--quick on CPU: fp16 (slow CPU matmuls) is left to the full run"
                elif device.type == "cpu" and kernels == "triton" and compiled:
                    why = "the Triton interpreter cannot run inside a compiled graph"
                elif device.type == "cpu" and kernels == "triton" and p != "fp32":
                    why = "on CPU the Triton backend runs in the interpreter (slow): fp32 only"
                elif device.type == "cuda" and quick and compiled and p != "bf16":
                    why = "--quick: compiled cells in bf16 only (compile time per cell)"
                elif device.type == "cpu" and compiled and p != "fp32":
                    why = "on CPU one compiled cell (fp32) stands for the rest (compile time per cell)"
                if why:
                    skipped.append((f"{p} {kernels} {'compiled' if compiled else 'eager'}", why))
                else:
                    cells.append((p, kernels, compiled))
    return cells, skipped


def precision_unreal(name: str, device: torch.device) -> str | None:
    """Why ``name`` would not be what it says on ``device`` (None: it is real here)."""
    if device.type != "cuda":
        if name == "tf32":
            return "no TF32 on a CPU (the policy would run fp32)"
        if name == "fp8":
            return "no fp8 matmuls on a CPU (the policy would emulate them)"
        return None
    cap = torch.cuda.get_device_capability(device)
    if name in ("tf32", "bf16") and cap < (8, 0):
        return f"needs compute capability 8.0 (this GPU: {cap[0]}.{cap[1]})"
    if name == "fp8" and cap < (8, 9):
        return f"no fp8 tensor cores before compute capability 8.9 (this GPU: {cap[0]}.{cap[1]})"
    if name == "fp8" and not hasattr(torch, "_scaled_mm"):
        return "this torch has no torch._scaled_mm"
    return None


def grid_raw(device: torch.device, quick: bool, cells: list[tuple[str, str, bool]]) -> dict[str, Any]:
    """A grid over the three axes with every combination not in ``cells`` excluded."""
    s = sizes(device, quick)
    precisions = sorted({c[0] for c in cells}, key=PRECISIONS.index)
    kernels = sorted({c[1] for c in cells})
    compiled = sorted({c[2] for c in cells})
    wanted = set(cells)
    exclude = [{"train.precision": p, "train.kernels": k, "train.compile": c}
               for p in precisions for k in kernels for c in compiled if (p, k, c) not in wanted]
    train = {**s["train"], "lr": 3e-3, "device": str(device), "eval_every": s["train"]["steps"],
             "eval_batches": 2}
    grid: dict[str, Any] = {"train.precision": precisions, "train.kernels": kernels, "train.compile": compiled}
    if exclude:
        grid["exclude"] = exclude
    return {"experiment": {"name": "selftest", "seeds": [0]}, "model": s["model"], "train": train, "grid": grid}


def _final(con, run_id: str) -> dict[str, float]:
    rows = con.execute("SELECT name, arg_max(value, step) FROM metrics WHERE run_id = ? GROUP BY name",
                       [run_id]).fetchall()
    return {str(n): float(v) for n, v in rows if v is not None}


def run_training(device: torch.device, quick: bool,
                 log: Callable[[str], None] = lambda m: None) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Train the planned cells; one row per cell (with its checks) and the combinations left out."""
    from rich.console import Console

    from ..contracts.plugin_manager import get_registry
    from ..grid.gridfile import expand
    from ..model.costmodel import MEMORY_BAND, agreement, predict
    from ..run.runner import run_grid
    from ..store import database as store

    cells, skipped = plan(device, quick)
    if not cells:
        return [], skipped
    registry = get_registry()
    grid = expand(grid_raw(device, quick, cells), registry, source="abl selftest")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="abl-selftest-") as tmp:
        db, runs = Path(tmp) / "selftest.duckdb", Path(tmp) / "runs"
        log(f"training: {len(grid.cells)} cells ({', '.join(c.label for c in grid.cells)})")
        run_grid(grid, registry, db, runs, console=Console(quiet=True))
        con = store.connect(db, read_only=True)
        try:
            for c in grid.cells:
                status = con.execute("SELECT status, error, env FROM runs WHERE run_id = ?", [c.run_id]).fetchone()
                m = _final(con, c.run_id)
                vocab = (json.loads(status[2]) if status and status[2] else {}).get("vocab_size")
                try:
                    predicted = float(predict(c, registry, vocab_size=vocab or None)["train_peak_bytes"])
                except Exception:  # noqa: BLE001 - no prediction is reported as such, never raised
                    predicted = None
                measured = m.get("peak_tensor_bytes")
                ratio, verdict = agreement(predicted, measured, MEMORY_BAND)
                rows.append({"precision": c.train.precision, "kernels": c.train.kernels, "compile": c.train.compile,
                             "status": status[0] if status else "missing",
                             "error": (status[1] if status else None) or None,
                             "val_loss": m.get("val_loss"), "train_loss": m.get("train_loss"),
                             "tokens_per_s": m.get("train_tokens_per_s"), "mfu": m.get("mfu"),
                             "peak_mem_bytes": m.get("peak_mem_bytes"), "predicted_peak_bytes": predicted,
                             "measured_peak_tensor_bytes": measured, "memory_ratio": ratio,
                             "memory_verdict": verdict})
        finally:
            con.close()
    return rows, skipped


def training_checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """name, ok, value, tolerance and detail of every training check over the cell rows."""
    out = []
    by = {(r["precision"], r["kernels"], r["compile"]): r for r in rows}

    def tag(p, k, c):
        return f"{p} {k} {'compiled' if c else 'eager'}"

    for r in rows:
        key = (r["precision"], r["kernels"], r["compile"])
        done = r["status"] == "completed"
        out.append({"name": f"{tag(*key)}: completes", "ok": done, "value": None, "tolerance": None,
                    "detail": r["status"] + (f": {r['error']}" if r["error"] else "")})
        if not done:
            continue
        comparisons = []
        if r["precision"] in LOSS_REFERENCE:
            comparisons.append((LOSS_REFERENCE[r["precision"]], r["kernels"], r["compile"]))
        if r["kernels"] != "torch":
            comparisons.append((r["precision"], "torch", r["compile"]))
        if r["compile"]:
            comparisons.append((r["precision"], r["kernels"], False))
        for ref_key in comparisons:
            ref = by.get(ref_key)
            if ref is None or ref["status"] != "completed" or ref["val_loss"] is None or r["val_loss"] is None:
                continue
            tol = max(LOSS_TOLERANCE[r["precision"]], LOSS_TOLERANCE[ref_key[0]])
            diff = abs(r["val_loss"] - ref["val_loss"]) / abs(ref["val_loss"])
            out.append({"name": f"{tag(*key)}: loss vs {tag(*ref_key)}", "ok": diff <= tol, "value": diff,
                        "tolerance": tol, "detail": f"final val_loss {r['val_loss']:.4f} vs {ref['val_loss']:.4f}: "
                                                   f"{100 * diff:.2f}% apart, bound {100 * tol:g}%"})
        if not r["compile"] and r["memory_ratio"] is not None:
            # the cost model predicts the torch path's saved activations; the fused Triton kernels
            # save fewer, so their ratio is shown, not held to the band
            checked = r["kernels"] == "torch"
            out.append({"name": f"{tag(*key)}: memory predicted vs measured", "ok": "DISAGREES" not in
                        r["memory_verdict"] if checked else None, "value": r["memory_ratio"], "tolerance": None,
                        "detail": f"tensor peak {r['measured_peak_tensor_bytes'] / 2**20:.2f} MiB measured, "
                                  f"{r['predicted_peak_bytes'] / 2**20:.2f} MiB predicted: " + (r["memory_verdict"] if checked else
                                  "not held to the band (the cost model predicts the torch path)")})
    return out
