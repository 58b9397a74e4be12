"""``abl selftest``'s training section: short cells per precision, kernel backend and compile mode.

One small grid is run the way ``abl run`` runs it (abl.run.runner, a worker
per cell, in a scratch store), over ``train.precision`` x ``train.kernels`` x
``train.compile``; a combination that cannot be real on this device is left
out with the reason (TF32 needs an sm_80+ GPU, fp8 an sm_89+ one; on CPU the
Triton backend runs in the interpreter and compiling takes minutes, so
``quick`` keeps fp32 for it and compiles nothing; on a GPU the compiled cells
are fp32 and bf16, in ``quick`` bf16 alone). Each cell reports its
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

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..contracts.status import COMPLETED

# relative difference of the final validation loss allowed against the reference cell
# relative difference of the final validation loss allowed against the reference cell, by the number
# format a policy's matmuls run in (its ``peak_format`` after setup on this device)
LOSS_TOLERANCE = {"fp32": 0.005, "tf32": 0.01, "bf16": 0.03, "fp16": 0.03, "fp8": 0.05}
# the format a cell is compared with: reduced-precision formats against fp32; fp8 GEMMs against the
# policy's own compute format without them (Micikevicius et al. 2022, arXiv:2209.05433, sec. 5: fp8
# training is judged against 16-bit training)
LOSS_REFERENCE = {"tf32": "fp32", "bf16": "fp32", "fp16": "fp32", "fp8": "compute"}
FORMAT_OF_DTYPE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class Policy:
    """A registered precision policy as it sets itself up on this device."""

    name: str
    real: bool
    why: str  # why it is not real here ("" when it is)
    format: str  # the number format its matmuls run in here (``peak_format``)
    compute: str  # the format of its activations (``compute_dtype``)


def policies(device: torch.device, registry) -> list[Policy]:
    """Every registered precision policy, set up for ``device`` on a one-layer model.

    Real here: not ``emulated`` and, where its info() names an ``effective_precision``,
    that is the policy itself (TF32 on a device without it runs as fp32). The
    float32 matmul precision and cuDNN's TF32 switch are put back afterwards.
    """
    out = []
    for name in registry.names("precision"):
        matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
        try:
            policy = registry.get("precision", name).factory()
            # the probe model stays on the CPU: only the policy's decisions for ``device`` matter here
            policy.setup(torch.nn.Sequential(torch.nn.Linear(16, 16)), device)
            info = policy.info()
        except Exception as exc:  # noqa: BLE001 - a policy that cannot be set up is reported, not raised
            out.append(Policy(name, False, f"cannot be set up here: {type(exc).__name__}: {exc}", "fp32", "fp32"))
            continue
        finally:
            torch.set_float32_matmul_precision(matmul)
            torch.backends.cudnn.allow_tf32 = cudnn
        effective = info.get("effective_precision", name)
        note = str(getattr(policy, "note", "") or "")
        why = ("" if not policy.emulated and effective == name else
               note or ("emulated here" if policy.emulated else f"runs as {effective} here"))
        out.append(Policy(name, not why, why, policy.peak_format(),
                          FORMAT_OF_DTYPE.get(policy.compute_dtype, "fp32")))
    return out


def sizes(device: torch.device, quick: bool) -> dict[str, Any]:
    """The cell's model, schedule and evaluations: tiny on CPU (the Triton cell runs every step in the
    interpreter, whose cost is per program launched, so per row of batch x context).

    ``quick`` on CPU is the smallest cell that is still a real one: one block of every kind the
    default model has (a 2-head attention mixer with RoPE, SwiGLU, RMSNorm, the fused linear
    cross-entropy), 2 steps (the second is the one the memory tracker measures, after the first
    has made the optimizer state), 2 sequences of 24 tokens (two of the interpreter's 16-token
    attention tiles, the second masked), one validation batch, and no post-training decoding
    benchmark (its figures are not checked here). The final evaluation still scores val_bpb on
    one fixed byte span (abl.train.spanscore) through the same kernels: about 1,000 tokens of
    forward passes, most of the cell's interpreter time. Each kernel's forward and backward at
    shapes with masked tails, in fp32 and bf16, is the kernel section's work, not this cell's.
    """
    if device.type == "cuda":
        return {"model": {"d_model": 256, "n_layers": 4, "n_heads": 4, "context": 256},
                "train": {"steps": 30 if quick else 60, "batch_size": 16, "warmup_steps": 5}}
    if quick:
        return {"model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 24},
                "train": {"steps": 2, "batch_size": 2, "warmup_steps": 1, "eval_batches": 1},
                "eval": {"decode": False}}
    return {"model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32},
            "train": {"steps": 20, "batch_size": 4, "warmup_steps": 2}}


def why_not(p: Policy, kernels: str, compiled: bool, device: torch.device, quick: bool) -> str | None:
    """Why one (policy, backend, compile mode) is left out here; None: it runs."""
    from ..kernels.utils import HAS_TRITON

    cpu = device.type == "cpu"
    if kernels == "triton" and not HAS_TRITON:
        return "triton is not installed"
    if cpu and compiled and quick:
        return "--quick on CPU: compiling a model takes minutes here; run without --quick"
    if cpu and quick and p.format == "fp16":
        return "--quick on CPU: fp16 (slow CPU matmuls) is left to the full run"
    if cpu and kernels == "triton" and compiled:
        return "the Triton interpreter cannot run inside a compiled graph"
    if cpu and kernels == "triton" and p.format != "fp32":
        return "on CPU the Triton backend runs in the interpreter (slow): fp32 only"
    if not cpu and quick and compiled and p.format != "bf16":
        return "--quick: compiled cells in bf16 only (compile time per cell)"
    if not cpu and compiled and p.format not in ("fp32", "bf16"):
        return ("compiled cells in fp32 and bf16 only (compile time per cell: the selftest fits one "
                "10-minute call); the eager cells cover every precision")
    if cpu and compiled and p.format != "fp32":
        return "on CPU one compiled cell (fp32) stands for the rest (compile time per cell)"
    return None


def plan(device: torch.device, quick: bool, registry=None) -> tuple[list[tuple[str, str, bool]],
                                                                    list[tuple[str, str]]]:
    """(precision, kernels, compile) of every cell to run, and (combination, why not) of those left out."""
    if registry is None:
        from ..contracts.plugin_manager import get_registry

        registry = get_registry()
    skipped: list[tuple[str, str]] = []
    cells = []
    for p in policies(device, registry):
        if not p.real:
            skipped.append((f"{p.name} (every backend)", p.why))
            continue
        for kernels in ("torch", "triton"):
            for compiled in (False, True):
                why = why_not(p, kernels, compiled, device, quick)
                if why:
                    skipped.append((f"{p.name} {kernels} {'compiled' if compiled else 'eager'}", why))
                else:
                    cells.append((p.name, kernels, compiled))
    return cells, skipped


def format_unreal(fmt: str, device: torch.device) -> str | None:
    """Why matmuls in number format ``fmt`` do not run on ``device``'s hardware (None: they do)."""
    if device.type != "cuda":
        return {"tf32": "no TF32 on a CPU", "fp8": "no fp8 matmuls on a CPU"}.get(fmt)
    cap = torch.cuda.get_device_capability(device)
    if fmt in ("tf32", "bf16") and cap < (8, 0):
        return f"needs compute capability 8.0 (this GPU: {cap[0]}.{cap[1]})"
    if fmt == "fp8" and cap < (8, 9):
        return f"no fp8 tensor cores before compute capability 8.9 (this GPU: {cap[0]}.{cap[1]})"
    if fmt == "fp8" and not hasattr(torch, "_scaled_mm"):
        return "this torch has no torch._scaled_mm"
    return None


def grid_raw(device: torch.device, quick: bool, cells: list[tuple[str, str, bool]]) -> dict[str, Any]:
    """A grid over the three axes with every combination not in ``cells`` excluded."""
    s = sizes(device, quick)
    precisions = list(dict.fromkeys(c[0] for c in cells))
    kernels = sorted({c[1] for c in cells})
    compiled = sorted({c[2] for c in cells})
    wanted = set(cells)
    exclude = [{"train.precision": p, "train.kernels": k, "train.compile": c}
               for p in precisions for k in kernels for c in compiled if (p, k, c) not in wanted]
    train = {"eval_batches": 2, **s["train"], "lr": 3e-3, "device": str(device), "eval_every": s["train"]["steps"]}
    grid: dict[str, Any] = {"train.precision": precisions, "train.kernels": kernels, "train.compile": compiled}
    if exclude:
        grid["exclude"] = exclude
    raw: dict[str, Any] = {"experiment": {"name": "selftest", "seeds": [0]}, "model": s["model"], "train": train,
                           "grid": grid}
    if "eval" in s:
        raw["eval"] = s["eval"]
    return raw


def run_training(device: torch.device, quick: bool,
                 log: Callable[[str], None] = lambda m: None) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Train the planned cells; one row per cell (with its checks) and the combinations left out."""
    from rich.console import Console

    from ..contracts.plugin_manager import get_registry
    from ..grid.gridfile import expand
    from ..model.costmodel import MEMORY_BAND, agreement, predict
    from ..run.runner import run_grid
    from ..store import reader

    registry = get_registry()
    cells, skipped = plan(device, quick, registry)
    if not cells:
        return [], skipped
    formats = {p.name: p for p in policies(device, registry)}
    grid = expand(grid_raw(device, quick, cells), registry, source="abl selftest")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="abl-selftest-") as tmp:
        from ..store.workspace import Workspace

        ws = Workspace.at(Path(tmp) / "selftest.duckdb")  # a scratch store and its folders
        db, runs = ws.db, ws.runs
        log(f"training: {len(grid.cells)} cells ({', '.join(c.label for c in grid.cells)})")
        # the runner's start/end lines go to stderr with the selftest's progress
        run_grid(grid, registry, db, runs, console=Console(stderr=True, width=120))
        stored = {r.run_id: r for r in reader.read_runs(db, run_ids=[c.run_id for c in grid.cells])}
        for c in grid.cells:
            run = stored.get(c.run_id)
            m = {str(n): float(v) for n, v in (run.final if run else {}).items() if v is not None}
            vocab = (run.env if run else {}).get("vocab_size")
            try:
                predicted = float(predict(c, registry, vocab_size=vocab or None)["train_peak_bytes"])
            except Exception:  # noqa: BLE001 - no prediction is reported as such, never raised
                predicted = None
            measured = m.get("peak_tensor_bytes")
            ratio, verdict = agreement(predicted, measured, MEMORY_BAND)
            policy = formats[c.train.precision]
            rows.append({"precision": c.train.precision, "format": policy.format, "compute": policy.compute,
                         "kernels": c.train.kernels, "compile": c.train.compile,
                         "status": run.status if run else "missing",
                         "error": (run.error if run else None) or None,
                         "val_loss": m.get("val_loss"), "train_loss": m.get("train_loss"),
                         "tokens_per_s": m.get("train_tokens_per_s"), "mfu": m.get("mfu"),
                         "peak_mem_bytes": m.get("peak_mem_bytes"), "predicted_peak_bytes": predicted,
                         "measured_peak_tensor_bytes": measured, "memory_ratio": ratio,
                         "memory_verdict": verdict})
    return rows, skipped


def training_checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """name, ok, value, tolerance and detail of every training check over the cell rows."""
    out = []
    by = {(r["precision"], r["kernels"], r["compile"]): r for r in rows}

    def tag(p, k, c):
        return f"{p} {k} {'compiled' if c else 'eager'}"

    for r in rows:
        key = (r["precision"], r["kernels"], r["compile"])
        done = r["status"] == COMPLETED
        out.append({"name": f"{tag(*key)}: completes", "ok": done, "value": None, "tolerance": None,
                    "detail": r["status"] + (f": {r['error']}" if r["error"] else "")})
        if not done:
            continue
        comparisons = []
        ref_format = LOSS_REFERENCE.get(r["format"])
        if ref_format == "compute":
            ref_format = r["compute"]
        reference = next((q for q in rows if ref_format and q["format"] == ref_format and q["compute"] in
                          (ref_format, "fp32") and q["precision"] != r["precision"]), None)
        if reference is not None:
            comparisons.append((reference["precision"], r["kernels"], r["compile"]))
        if r["kernels"] != "torch":
            comparisons.append((r["precision"], "torch", r["compile"]))
        if r["compile"]:
            comparisons.append((r["precision"], r["kernels"], False))
        for ref_key in comparisons:
            ref = by.get(ref_key)
            if ref is None or ref["status"] != COMPLETED or ref["val_loss"] is None or r["val_loss"] is None:
                continue
            tol = max(LOSS_TOLERANCE.get(r["format"], LOSS_TOLERANCE["fp8"]),
                      LOSS_TOLERANCE.get(ref["format"], LOSS_TOLERANCE["fp8"]))
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
                                  f"{r['predicted_peak_bytes'] / 2**20:.2f} MiB predicted: "
                                  + (r["memory_verdict"] if checked else
                                     "not held to the band (the cost model predicts the torch path)")})
    return out
