"""``abl selftest``: validate the present device in one command (cf. ``accelerate test``, ``ds_report``).

Sections, each a list of checks (``Check``: passed, failed, skipped with its
reason, or information):

- **environment**: device, compute capability, driver, CUDA, torch and triton
  versions; which precisions are real here; which optional kernel providers
  import (liger-kernel, flash-attn, fla, mamba-ssm);
- **kernels**: every op of abl.kernels forward and backward against its fp32
  ground truth, under the fixed bound and the relative rule
  (abl.bench.selftest_kernels);
- **determinism** (CUDA): each op's backward repeated on the same inputs, the
  gradients bitwise equal for every op whose kernel uses no atomics
  (abl.bench.determinism);
- **auto** (CUDA): what ``train.kernels = "auto"`` chooses per op for a
  representative workload (abl.kernels.autoselect), measured or read from the
  store's choice cache;
- **peaks**: matmul TFLOP/s per number format and copy GB/s measured now,
  beside the figures abl.store.provenance holds (the datasheet's on a GPU, the
  cached measurement of abl.store.cpupeak on a CPU);
- **bench**: ``abl bench kernels`` (abl.bench.kernelbench) for every provider
  present, each figure also as a fraction of the peaks measured above;
- **training**: short cells per precision, kernel backend and compile mode
  (abl.bench.selftest_training).

``run_selftest`` returns the report; ``store_report`` writes its rows to the
store's ``selftest`` table. The GPU-only measurements (``gpu_matmul_tflops``,
``gpu_copy_gbps``) take their timer as an argument so they can be driven on a
CPU in tests.
"""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import torch

from ..analysis.units import TOKENS_PER_S

SECTIONS = ("environment", "kernels", "determinism", "auto", "peaks", "bench", "training")
PROVIDER_MODULES = {"liger-kernel": "liger_kernel", "flash-attn": "flash_attn", "fla": "fla",
                    "mamba-ssm": "mamba_ssm"}
STATUSES = ("pass", "fail", "skip", "info")
# a measured peak above the datasheet's by more than this means the measurement is wrong
PEAK_SLACK = 1.10


@dataclass
class Check:
    """One line of the report."""

    section: str
    name: str
    status: str  # pass, fail, skip (detail says why) or info
    value: float | None = None
    unit: str = ""
    reference: float | None = None  # what the value is compared with (a bound, a datasheet figure)
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    selftest_id: str
    created: datetime
    device: str
    quick: bool
    environment: dict[str, Any]
    checks: list[Check]
    # wall seconds each section took here (environment: from the call to the first check)
    timings_s: dict[str, float] = field(default_factory=dict)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    def as_json(self) -> dict[str, Any]:
        return {"selftest_id": self.selftest_id, "created": self.created.isoformat(), "device": self.device,
                "quick": self.quick, "passed": not self.failed, "failed": len(self.failed),
                "environment": self.environment, "timings_s": self.timings_s,
                "sections": {s: [_check_json(c) for c in self.checks if c.section == s] for s in SECTIONS}}


def _check_json(c: Check) -> dict[str, Any]:
    d = asdict(c)
    d.pop("section")
    for k, v in list(d.items()):
        if isinstance(v, float) and not math.isfinite(v):
            d[k] = None
    return d


# ---------------------------------------------------------------- environment


def driver_version() -> str | None:
    """The NVIDIA driver's version (nvidia-smi), or None where there is none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def provider_status(module: str) -> tuple[str | None, str]:
    """(version, "") when ``module`` imports, else (None, why not)."""
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any failure to import means "not usable here"
        return None, f"does not import: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return str(getattr(mod, "__version__", "unknown version")), ""


def environment(device: torch.device) -> tuple[dict[str, Any], list[Check]]:
    from ..contracts.plugin_manager import get_registry
    from ..kernels.utils import TRITON_VERSION, interpreting
    from ..store.provenance import device_name, package_versions
    from .selftest_training import policies

    env: dict[str, Any] = {"device": device_name(device), "device_type": device.type,
                           "versions": package_versions(("abl", "torch", "triton", "duckdb", "numpy"), missing=None),
                           "cuda": torch.version.cuda, "triton": TRITON_VERSION}
    if device.type == "cuda":
        cap = torch.cuda.get_device_capability(device)
        env["capability"] = f"{cap[0]}.{cap[1]}"
        env["driver"] = driver_version()
        env["memory_gib"] = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
    else:
        env["capability"] = None
        env["driver"] = None
        env["triton_interpreter"] = interpreting()
    checks = [Check("environment", k, "info", detail=str(env[k]))
              for k in ("device", "capability", "driver", "cuda", "triton")]
    checks.append(Check("environment", "torch", "info", detail=torch.__version__))
    env["precisions"] = {}
    for p in policies(device, get_registry()):
        env["precisions"][p.name] = "real" if p.real else p.why
        checks.append(Check("environment", f"precision {p.name}", "info" if p.real else "skip",
                            detail=f"real here (matmuls in {p.format})" if p.real else p.why))
    env["providers"] = {}
    for dist, module in PROVIDER_MODULES.items():
        version, why = provider_status(module)
        env["providers"][dist] = version or why
        checks.append(Check("environment", f"provider {dist}", "info" if version else "skip",
                            detail=f"imports ({version})" if version else why))
    return env, checks


# ---------------------------------------------------------------- measured peaks


def time_cuda_ms(fn: Callable[[], Any]) -> float:  # pragma: no cover - needs a GPU
    """The median of abl bench kernels' CUDA timer (triton.testing.do_bench, L2 flushed)."""
    from .kernelbench import time_cuda

    return time_cuda(fn, None)[1]


def gpu_matmul_tflops(device: torch.device, fmt: str, n: int,
                      timer: Callable[[Callable[[], Any]], float]) -> float:
    """TFLOP/s of an ``n`` x ``n`` matmul in ``fmt`` (fp32 without TF32, tf32, bf16, fp16, fp8 via
    torch._scaled_mm with E4M3 operands and unit scales), timed by ``timer`` (ms per call)."""
    dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
             "fp8": torch.bfloat16}[fmt]
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    if fmt == "fp8":
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()  # column-major B, as cuBLASLt needs
        one = torch.ones((), device=device)

        def fn():
            return torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        def fn():
            return torch.mm(a, b)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = fmt == "tf32"
    try:
        fn()
        ms = timer(fn)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return 2.0 * n**3 / (ms * 1e-3) / 1e12


def gpu_copy_gbps(device: torch.device, nbytes: int, timer: Callable[[Callable[[], Any]], float]) -> float:
    """GB/s of ``dst.copy_(src)`` over ``nbytes`` (read + write counted), timed by ``timer``."""
    src = torch.empty(max(1, nbytes // 4), device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    return 2.0 * src.numel() * 4 / (ms * 1e-3) / 1e9


def measure_peaks(device: torch.device, quick: bool) -> dict[str, Any]:
    """{"tflops": {fmt: TFLOP/s}, "gbps": DRAM/HBM copy, "cache_gbps": (CPU), "skipped": {fmt: why}}."""
    from .selftest_training import format_unreal

    out: dict[str, Any] = {"tflops": {}, "skipped": {}, "cache_gbps": None}
    if device.type == "cuda":  # pragma: no cover - needs a GPU (the parts are tested with a fake timer)
        n = 4096 if quick else 8192
        for fmt in ("fp32", "tf32", "bf16", "fp16", "fp8"):
            why = format_unreal(fmt, device) if fmt in ("tf32", "bf16", "fp8") else None
            if why:
                out["skipped"][fmt] = why
                continue
            out["tflops"][fmt] = gpu_matmul_tflops(device, fmt, n, time_cuda_ms)
        out["gbps"] = gpu_copy_gbps(device, 2**30, time_cuda_ms)
        return out
    from ..store import cpupeak

    burst, count = (0.05, 3) if quick else (cpupeak.BURST_S, cpupeak.BURSTS)
    for fmt in ("fp32", "bf16", "fp16"):
        out["tflops"][fmt] = cpupeak.measure_matmul_flops(fmt, n=256 if quick else None, burst_s=burst,
                                                          count=count).median / 1e12
    out["skipped"]["tf32"] = "no TF32 on a CPU (fp32 above)"
    out["skipped"]["fp8"] = "no fp8 matmuls on a CPU"
    dram = 64 * 2**20 if quick else cpupeak.dram_bytes()
    out["gbps"] = cpupeak.measure_copy_gbps(dram, burst_s=burst, count=count).median
    out["cache_gbps"] = cpupeak.measure_copy_gbps(cpupeak.CACHE_RESIDENT_BYTES, burst_s=burst, count=count).median
    return out


def peak_checks(device: torch.device, measured: dict[str, Any]) -> list[Check]:
    """Each measured figure beside the recorded one; a figure above the datasheet's (by PEAK_SLACK) fails."""
    from ..store.provenance import device_peak

    recorded = device_peak(device)
    on_gpu = device.type == "cuda"
    checks = []

    def one(name, value, unit, ref):
        ok = value is not None and math.isfinite(value) and value > 0
        if ok and on_gpu and ref:
            ok = value <= PEAK_SLACK * ref
        basis = ("datasheet" if on_gpu else "cached measurement") if ref else "no recorded figure"
        detail = f"{value:.4g} {unit} measured; {basis}" + (f" {ref:.4g} ({value / ref:.0%})" if ref else "")
        checks.append(Check("peaks", name, "pass" if ok else "fail", value, unit, ref, detail))

    for fmt, tf in measured["tflops"].items():
        one(f"matmul {fmt}", tf, "TFLOP/s", recorded.tflops.get(fmt))
    for fmt, why in measured["skipped"].items():
        checks.append(Check("peaks", f"matmul {fmt}", "skip", detail=why))
    one("copy (DRAM/HBM)", measured["gbps"], "GB/s", recorded.gbps)
    if measured.get("cache_gbps"):
        one("copy (cache-resident)", measured["cache_gbps"], "GB/s", recorded.cache_gbps)
    return checks


# ---------------------------------------------------------------- kernel bench


def bench_checks(device: torch.device, quick: bool, measured: dict[str, Any],
                 log: Callable[[str], None]) -> list[Check]:
    """``abl bench kernels`` here; each row's figure also as a fraction of the measured peaks."""
    from ..store.cpupeak import last_level_cache_bytes
    from ..store.provenance import Peak
    from .kernelbench import available_providers, bandwidth_peak, peak_fraction, run_bench

    peak = Peak("measured", measured["gbps"], measured["tflops"], "measured by abl selftest",
                cache_gbps=measured.get("cache_gbps"))
    llc = last_level_cache_bytes() if device.type == "cpu" else None
    rows = run_bench(device, passes=["fwd"] if quick else None, size="auto", log=log)
    checks = []
    for r in rows:
        if r["tflops"] is not None:
            pk = peak.tflops.get(r["dtype"])
            frac, why = peak_fraction(r["tflops"] * 1e12, pk * 1e12 if pk else None)
            figure, unit, against = r["tflops"], "TFLOP/s", f"measured {r['dtype']} matmul"
        else:
            nbytes = (r["gbps"] or 0) * r["p50"] * 1e-3 * 1e9
            bw, against = bandwidth_peak(peak, nbytes, llc)
            against = "measured " + against.replace("HBM datasheet", "HBM copy")  # the peak here is measured
            frac, why = peak_fraction(r["gbps"], bw)
            figure, unit = r["gbps"], "GB/s"
        detail = (f"p50 {r['p50']:.4g} ms" + (f", {figure:.3g} {unit}" if figure else "")
                  + (f", {frac:.1%} of {against}" if frac is not None else "") + (f"; {why}" if why else ""))
        checks.append(Check("bench", f"{r['op']} {r['provider']} {r['pass']} {r['shape']} {r['dtype']}", "info",
                            figure, unit, None, detail,
                            {"p50_ms": r["p50"], "fraction_of_measured_peak": frac,
                             "fraction_of_recorded_peak": r["peak_fraction"]}))
    ran = {r["provider"] for r in rows}
    for prov, unavailable in available_providers(device).items():
        if prov == "torch.compile" and device.type != "cuda":
            checks.append(Check("bench", f"provider {prov}", "skip", detail="not run by default on CPU "
                                "(compile time): abl bench kernels --provider torch.compile"))
        elif unavailable:
            checks.append(Check("bench", f"provider {prov}", "skip", detail=unavailable))
        else:
            checks.append(Check("bench", f"provider {prov}", "pass" if prov in ran else "fail",
                                detail="timed" if prov in ran else "available, but no op could be timed"))
    return checks


# ---------------------------------------------------------------- the whole


# the workload the auto section shows choices for: scripts/gpu_big.toml's cell (d_model 1024, 16 heads of
# 64, context 1024, batch 16, bf16) with a GPT-2-sized vocabulary, and a Mamba-2 mixer's scan
AUTO_WORKLOAD: dict[str, Any] = dict(batch=16, context=1024, d_model=1024, n_heads=16, head_dim=64, vocab=50304,
                     dtype="bfloat16", ssd=(64, 32, 64, 64))


def determinism_checks(device: torch.device, quick: bool, log: Callable[[str], None]) -> list[Check]:
    """Each op's backward repeated (abl.bench.determinism) on CUDA; a skip row elsewhere."""
    from ..kernels.utils import HAS_TRITON

    if device.type != "cuda":
        return [Check("determinism", "kernel backward repeats", "skip",
                      detail="needs CUDA (the Triton interpreter runs programs one by one: no race can show)")]
    if not HAS_TRITON:  # pragma: no cover
        return [Check("determinism", "kernel backward repeats", "fail", detail="triton is not installed")]
    from .determinism import REPEATS, check_determinism

    rows = check_determinism(device, repeats=3 if quick else REPEATS, log=log)
    return determinism_rows(rows)


def determinism_rows(rows: list[dict[str, Any]]) -> list[Check]:
    """abl.bench.determinism's rows as checks: pass, fail (runs differ, or it raised), skip (atomics)."""
    return [Check("determinism", f"{r['op']} bwd {r['shape']} {r['dtype']}",
                  "skip" if r["ok"] is None else "pass" if r["ok"] else "fail", r.get("runs_differing"),
                  "runs differing", 0, r["detail"], {k: v for k, v in r.items() if k != "detail"}) for r in rows]


def auto_checks(device: torch.device, cache_dir, log: Callable[[str], None],
                choose: Callable[..., Any] | None = None) -> list[Check]:
    """What ``train.kernels = "auto"`` picks per op here for AUTO_WORKLOAD (information rows)."""
    if device.type != "cuda":
        return [Check("auto", "train.kernels = auto", "info", detail="torch on a CPU: every op takes its torch path")]
    from ..kernels.autoselect import Workload
    from ..kernels.autoselect import choose as real_choose

    backend = (choose or real_choose)(device, Workload(**AUTO_WORKLOAD), cache_dir, log=log)
    checks = []
    for c in backend.choices:
        speedup = c["torch_ms"] / c["triton_ms"] if c.get("torch_ms") and c.get("triton_ms") else None
        checks.append(Check("auto", f"{c['op']} {c.get('shape', '')}".strip(), "info", speedup,
                            "x torch (fwd+bwd)" if speedup is not None else "",
                            None, f"{c['choice']}: {c['why']}" + (" (cached)" if c.get("cached") else ""), dict(c)))
    return checks


def run_selftest(device: torch.device, quick: bool, log: Callable[[str], None] = lambda m: None,
                 cache_dir=None) -> Report:
    """Every section on ``device``; ``quick``: small sizes, fewer shapes and dtypes (CI).
    ``cache_dir``: the store's shape-cache folder, where auto's choices are cached."""
    from ..store.provenance import device_name
    from .selftest_kernels import check_kernels
    from .selftest_training import run_training, training_checks

    timings: dict[str, float] = {}
    clock = [time.perf_counter()]

    def lap(section: str) -> None:  # the section just finished took since the last lap
        now = time.perf_counter()
        timings[section] = round(now - clock[0], 2)
        clock[0] = now

    env, checks = environment(device)
    lap("environment")
    log("kernels: every op against its fp32 ground truth")
    rows, why = check_kernels(device, quick, log)
    if why:
        checks.append(Check("kernels", "triton kernels", "fail" if device.type == "cuda" else "skip", detail=why))
    for r in rows:
        checks.append(Check("kernels", f"{r['op']} {r['pass']} {r['shape']} {r['dtype']}",
                            "pass" if r["ok"] else "fail", r["error"], "rel. error", r["tolerance"], r["detail"],
                            {"op": r["op"], "pass": r["pass"], "shape": r["shape"], "dtype": r["dtype"],
                             "torch_error": r.get("torch_error"), "fixed_bound": r.get("fixed")}))
    lap("kernels")
    log("determinism: each op's backward repeated")
    checks += determinism_checks(device, quick, log)
    lap("determinism")
    log("auto: the kernel choices for train.kernels = auto")
    try:
        checks += auto_checks(device, cache_dir, log)
    except Exception as exc:  # noqa: BLE001 - information: the other sections still run
        checks.append(Check("auto", "train.kernels = auto", "fail", detail=f"raised {type(exc).__name__}: {exc}"))
    lap("auto")
    log("peaks: matmul and copy")
    measured = measure_peaks(device, quick)
    checks += peak_checks(device, measured)
    lap("peaks")
    log("bench: abl bench kernels")
    checks += bench_checks(device, quick, measured, log)
    lap("bench")
    log("training: short cells")
    cells, skipped = run_training(device, quick, log)
    for r in cells:
        unit = TOKENS_PER_S
        detail = (f"val_loss {r['val_loss']:.4f}" if r["val_loss"] is not None else "no val_loss")
        if r["mfu"] is not None:
            detail += f", MFU {r['mfu']:.1%}"
        if r["peak_mem_bytes"]:
            detail += f", peak memory {r['peak_mem_bytes'] / 2**20:.1f} MiB"
        if r["predicted_peak_bytes"]:
            detail += f", predicted training peak {r['predicted_peak_bytes'] / 2**20:.1f} MiB"
        name = f"cell {r['precision']} {r['kernels']} {'compiled' if r['compile'] else 'eager'}"
        checks.append(Check("training", name, "info", r["tokens_per_s"], unit, None, detail, r))
    for c in training_checks(cells):
        status = "info" if c["ok"] is None else "pass" if c["ok"] else "fail"
        checks.append(Check("training", c["name"], status, c["value"], "",
                            c["tolerance"], c["detail"]))
    for combo, reason in skipped:
        checks.append(Check("training", combo, "skip", detail=reason))
    lap("training")
    log("sections took " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    return Report(uuid.uuid4().hex[:16], datetime.now(UTC).replace(tzinfo=None), device_name(device),
                  quick, env, checks, timings)


SELFTEST_COLUMNS = ("selftest_id", "created", "section", "name", "status", "value", "unit", "reference",
                    "detail", "data", "device", "quick", "versions", "git_commit")


def store_report(db_path, report: Report) -> None:
    """One row per check in the store's ``selftest`` table."""
    from ..store import database as store
    from ..store.provenance import git_commit

    versions = json.dumps(report.environment.get("versions", {}), sort_keys=True)
    commit = git_commit()

    def finite(v):
        return v if isinstance(v, (int, float)) and math.isfinite(v) else None

    rows = [[report.selftest_id, report.created, c.section, c.name, c.status, finite(c.value), c.unit,
             finite(c.reference), c.detail, json.dumps(c.data, default=str), report.device, report.quick,
             versions, commit] for c in report.checks]
    store.append_rows(db_path, "selftest", SELFTEST_COLUMNS, rows)
