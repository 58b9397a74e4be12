"""``abl bench kernels``: every op of harness/kernels x every available provider, side by side.

Providers, all timed in one process on the same inputs:
- ``triton``: the kernel set (CUDA only: the Triton interpreter is a
  correctness tool, its timings would mean nothing);
- ``torch``: the eager torch path the plugins take with ``train.kernels = "torch"``;
- ``torch.compile``: the same function through ``torch.compile`` (on CPU only
  when asked for with ``--provider``: compiling every op takes longer than
  timing them all);
- installed peers, when importable on CUDA: ``liger`` (liger-kernel),
  ``flash-attn``, ``mamba-ssm``, ``fla`` (fla-core: its chunked simple-GLA
  kernel, which is the SSD scan: q = C, k = dt B, v = x, log-decay g = dt A).

Timing:
- CUDA: ``triton.testing.do_bench`` (warm-up, then repetitions each preceded
  by an L2 flush), quantiles p20/p50/p80;
- CPU: pytest-benchmark's method: a warm-up (several calls), a number of
  calls per round calibrated on warmed calls so a round outlasts the timer's
  resolution, rounds repeated for a fixed minimum time per case, quantiles
  (p20/p50/p80) over the per-call times.
Passes: ``fwd``, ``bwd`` (backward of a retained graph) and ``fwd+bwd``. A
fused op whose forward already forms the gradients (the LM-head loss: abl's
and liger's) is timed forward+backward only, for every provider, whatever
passes were asked for: its forward against torch's forward alone would
compare a forward+backward with a forward.

Figures per row: effective GB/s for the memory-bound ops (the bytes an ideal
kernel must move: each input read once, each output written once), TFLOP/s
for attention counted as the FlashAttention papers do (4 B H S^2 D forward,
halved when causal; backward 2.5x the forward) and for the fused LM-head
cross-entropy (2 N D V per GEMM), and the fraction of the device's peak: from
the datasheet table for known GPUs, measured on CPU (abl.store.cpupeak: sustained
matmuls in the case's dtype; copy bandwidth stated twice, cache-resident and
DRAM, and a case is compared with the one its working set fits). A fraction
is never above 1: a case faster than its peak gets no fraction and a note
saying so. Times are milliseconds.
"""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..store.provenance import Peak, device_peak, git_commit, package_versions
from .peers import fla_ssd
from .peers import peer as _peer

PASSES = ("fwd", "bwd", "fwd+bwd")
PROVIDERS = ("triton", "torch", "torch.compile", "liger", "flash-attn", "mamba-ssm", "fla")

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# ---------------------------------------------------------------- timing


def time_cuda(fn: Callable[[], Any], grad_to_none) -> tuple[float, float, float]:  # pragma: no cover
    import triton.testing

    q = triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none,
                                quantiles=[0.2, 0.5, 0.8])
    return float(q[0]), float(q[1]), float(q[2])


def time_cpu(fn: Callable[[], Any], grad_to_none, min_time: float = 0.2, min_rounds: int = 7,
             min_round_time: float = 2e-4, warmup_time: float = 0.05,
             warmup_calls: int = 3) -> tuple[float, float, float]:
    """Warm up, calibrate calls per round on warmed calls, then time rounds for at least
    ``min_time`` seconds (and ``min_rounds`` rounds); ms per call at p20, p50, p80.

    The warm-up runs at least ``warmup_calls`` calls and ``warmup_time`` seconds:
    calibrating on one cold call (allocations, first-call dispatch) once gave a
    forward 60x slower than the same op's forward+backward.
    """
    def call():
        if grad_to_none:
            for t in grad_to_none:
                t.grad = None
        fn()

    warm: list[float] = []
    end = time.perf_counter() + warmup_time
    while len(warm) < warmup_calls or time.perf_counter() < end:
        t0 = time.perf_counter()
        call()
        warm.append(time.perf_counter() - t0)
    single = max(statistics.median(warm[-warmup_calls:]), 1e-7)
    per_round = max(1, math.ceil(min_round_time / single))
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < min_rounds or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        for _ in range(per_round):
            call()
        samples.append((time.perf_counter() - t0) / per_round * 1e3)
        if len(samples) >= 10_000:
            break
    q = statistics.quantiles(samples, n=10, method="inclusive")
    return q[1], statistics.median(samples), q[7]


def bandwidth_peak(peak: Peak, working_set: float, llc: int | None) -> tuple[float | None, str]:
    """The bandwidth a memory-bound case is measured against, and which one it is.

    On a CPU a working set that fits in the last-level cache runs at cache speed,
    several times the DRAM copy rate: such a case is compared with the
    cache-resident copy peak, a larger one with the DRAM peak. On a GPU the
    datasheet HBM figure.
    """
    if peak.cache_gbps is not None and llc is not None and working_set <= llc:
        return peak.cache_gbps, f"cache-resident copy {peak.cache_gbps:.1f} GB/s"
    label = "DRAM copy" if peak.cache_gbps is not None else "HBM datasheet"
    return peak.gbps, f"{label} {peak.gbps:.1f} GB/s" if peak.gbps else "no bandwidth peak"


def peak_fraction(achieved: float | None, peak: float | None) -> tuple[float | None, str]:
    """achieved / peak, or None with the reason when it would exceed 1 (a peak that does not hold)."""
    if achieved is None:
        return None, ""
    if not peak:  # a CPU too busy to measure one (abl.store.cpupeak: contended), or a GPU not in the table
        return None, "no peak to compare with (on a CPU: the machine was too busy to measure one)"
    frac = achieved / peak
    if frac > 1:
        return None, f"faster than the measured peak ({frac:.2f}x): no fraction given"
    return frac, ""


# ---------------------------------------------------------------- ops


@dataclass
class Case:
    """One op at one shape and dtype: inputs, the function of each provider, and its cost."""

    op: str
    shape: str
    dtype: str
    # (args, grad leaves); None when the op is unavailable (its notes say why)
    make: Callable[[torch.device], tuple[list[torch.Tensor], list[torch.Tensor]]] | None
    providers: dict[str, Callable]
    bytes: Callable[[str], float | None] = lambda p: None
    flops: Callable[[str], float | None] = lambda p: None
    notes: dict[str, str] = field(default_factory=dict)
    # the fused kernels form the gradients in the forward: only fwd+bwd compares like with like
    fused: bool = False


def _sizes(device: torch.device, size: str) -> dict[str, Any]:
    if size == "small" or (size == "auto" and device.type != "cuda"):
        return dict(rows=1024, dim=512, rope=(2, 8, 256, 64), glu=(1024, 1024), ce=(512, 8192),
                    lce=(512, 256, 8192), attn=(1, 4, 512, 64), ssd=(1, 256, 4, 32, 32))
    return dict(rows=8192, dim=4096, rope=(4, 32, 2048, 128), glu=(8192, 8192), ce=(8192, 65536),
                lce=(8192, 4096, 65536), attn=(4, 16, 4096, 128), ssd=(4, 2048, 32, 64, 128))


def build_cases(device: torch.device, dtypes: list[str], size: str, ops: list[str]) -> list[Case]:
    from ..kernels import load

    s = _sizes(device, size)
    cases: list[Case] = []
    for dname in dtypes:
        dt = _DTYPES[dname]
        es = torch.finfo(dt).bits // 8
        for op in ops:
            try:
                triton_fn, ref_fn = load(op)
            except (ImportError, AttributeError) as exc:
                cases.append(Case(op, "-", dname, None, {}, notes={"*": f"op unavailable: {exc}"}))
                continue
            cases.append(_case(op, triton_fn, ref_fn, s, dt, dname, es))
    return cases


def _rand(shape, dt, device, grad=True, scale=1.0):
    t = torch.randn(shape, device=device, dtype=torch.float32).mul_(scale).to(dt)
    return t.requires_grad_(grad)


def _case(op, triton_fn, ref_fn, s, dt, dname, es) -> Case:  # noqa: C901 - one table of ops
    liger = _peer("liger_kernel.transformers.functional")
    prov: dict[str, Callable[..., Any]]
    if op in ("rmsnorm", "layernorm"):
        m, n = s["rows"], s["dim"]

        def make(device):
            x, w = _rand((m, n), dt, device), _rand((n,), torch.float32, device)
            b = _rand((n,), torch.float32, device)
            return [x, w, b], [x, w, b]

        if op == "rmsnorm":
            prov = {"triton": lambda x, w, b: triton_fn(x, w, None, 1e-6),
                    "torch": lambda x, w, b: ref_fn(x, w, None, 1e-6)}
            if liger is not None:
                prov["liger"] = lambda x, w, b: liger.liger_rms_norm(x, w, 1e-6)
        else:
            prov = {"triton": lambda x, w, b: triton_fn(x, w, b, 1e-5),
                    "torch": lambda x, w, b: ref_fn(x, w, b, 1e-5)}
            if liger is not None:
                prov["liger"] = lambda x, w, b: liger.liger_layer_norm(x, w, b, 1e-5)
        return Case(op, f"M{m}-N{n}", dname, make, prov,
                    bytes=lambda p: {"fwd": 2 * m * n * es, "bwd": 3 * m * n * es,
                                     "fwd+bwd": 5 * m * n * es}[p])
    if op == "rope":
        b, h, t, d = s["rope"]

        def make(device):
            x = _rand((b, h, t, d), dt, device)
            ang = torch.outer(torch.arange(t, device=device, dtype=torch.float32),
                              torch.rand(d // 2, device=device))
            return [x, ang.cos(), ang.sin()], [x]

        prov = {"triton": lambda x, c, si: triton_fn(x, c, si, "half"),
                "torch": lambda x, c, si: ref_fn(x, c, si, "half")}
        if liger is not None:
            prov["liger"] = lambda x, c, si: liger.liger_rope(
                x, x, torch.cat([c, c], -1)[None], torch.cat([si, si], -1)[None])[0]
        return Case(op, f"B{b}-H{h}-T{t}-D{d}", dname, make, prov,
                    bytes=lambda p: {"fwd": 2, "bwd": 2, "fwd+bwd": 4}[p] * b * h * t * d * es,
                    notes={"liger": "liger_rope rotates q and k together; half layout"})
    if op in ("swiglu", "geglu"):
        m, n = s["glu"]

        def make(device):
            g, u = _rand((m, n), dt, device), _rand((m, n), dt, device)
            return [g, u], [g, u]

        prov = {"triton": triton_fn, "torch": ref_fn}
        if liger is not None:
            prov["liger"] = (liger.liger_swiglu if op == "swiglu" else liger.liger_geglu)
        return Case(op, f"M{m}-N{n}", dname, make, prov,
                    bytes=lambda p: {"fwd": 3, "bwd": 5, "fwd+bwd": 8}[p] * m * n * es,
                    notes={"liger": "liger_geglu uses the tanh GELU"} if op == "geglu" else {})
    if op == "cross_entropy":
        n, v = s["ce"]

        def make(device):
            x = _rand((n, v), dt, device)
            y = torch.randint(0, v, (n,), device=device)
            return [x, y], [x]

        prov = {"triton": triton_fn, "torch": lambda x, y: F.cross_entropy(x.float(), y)}
        if liger is not None:
            prov["liger"] = lambda x, y: liger.liger_cross_entropy(x, y)
        return Case(op, f"N{n}-V{v}", dname, make, prov,
                    bytes=lambda p: {"fwd": 1, "bwd": 2, "fwd+bwd": 3}[p] * n * v * es)
    if op == "linear_cross_entropy":
        n, d, v = s["lce"]

        def make(device):
            h, w = _rand((n, d), dt, device), _rand((v, d), dt, device, scale=d ** -0.5)
            y = torch.randint(0, v, (n,), device=device)
            return [h, w, y], [h, w]

        prov = {"triton": lambda h, w, y: triton_fn(h, w, y),
                "torch": lambda h, w, y: F.cross_entropy(F.linear(h, w).float(), y)}
        if liger is not None:
            prov["liger"] = lambda h, w, y: liger.liger_fused_linear_cross_entropy(h, w, y)
        return Case(op, f"N{n}-D{d}-V{v}", dname, make, prov,
                    flops=lambda p: {"fwd": 2, "bwd": 4, "fwd+bwd": 6}[p] * n * d * v,
                    notes={"*": "fused (abl, liger: the gradients are formed in the forward): timed fwd+bwd "
                                "for every provider"}, fused=True)
    if op == "flash_attention":
        b, h, t, d = s["attn"]

        def make(device):
            q, k, v = (_rand((b, h, t, d), dt, device) for _ in range(3))
            return [q, k, v], [q, k, v]

        prov = {"triton": lambda q, k, v: triton_fn(q, k, v, causal=True),
                "torch": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)}
        fa = _peer("flash_attn")
        if fa is not None:
            prov["flash-attn"] = lambda q, k, v: fa.flash_attn_func(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True).transpose(1, 2)
        fwd = 4 * b * h * t * t * d / 2
        return Case(op, f"B{b}-H{h}-T{t}-D{d}-causal", dname, make, prov,
                    flops=lambda p: {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}[p] * fwd,
                    notes={"torch": "scaled_dot_product_attention (the plugin's torch path)"})
    if op == "ssd_scan":
        b, t, h, p_, n = s["ssd"]
        chunk = 64

        def make(device):
            x = _rand((b, t, h, p_), dt, device)
            dt_ = F.softplus(_rand((b, t, h), torch.float32, device, grad=False) - 1).requires_grad_()
            a = (-torch.rand(h, device=device) - 0.5).requires_grad_()
            bm, cm = _rand((b, t, 1, n), dt, device), _rand((b, t, 1, n), dt, device)
            return [x, dt_, a, bm, cm], [x, dt_, a, bm, cm]

        prov = {"triton": lambda x, d_, a, bm, cm: triton_fn(x, d_, a, bm, cm, chunk)[0],
                "torch": lambda x, d_, a, bm, cm: ref_fn(x.float(), d_, a, bm.float(), cm.float(), chunk)[0]}
        mamba = _peer("mamba_ssm.ops.triton.ssd_combined")
        if mamba is not None:
            prov["mamba-ssm"] = lambda x, d_, a, bm, cm: mamba.mamba_chunk_scan_combined(
                x, d_, a, bm, cm, chunk)
        fla = _peer("fla.ops.simple_gla")
        if fla is not None and hasattr(fla, "chunk_simple_gla"):
            prov["fla"] = lambda x, d_, a, bm, cm: fla_ssd(fla.chunk_simple_gla, x, d_, a, bm, cm)
        io = (2 * b * t * h * p_ + 2 * b * t * n) * es + b * t * h * 4
        return Case(op, f"B{b}-T{t}-H{h}-P{p_}-N{n}-chunk{chunk}", dname, make, prov,
                    bytes=lambda p: {"fwd": 1, "bwd": 2, "fwd+bwd": 3}[p] * io)
    raise KeyError(op)


# ---------------------------------------------------------------- runner


def available_providers(device: torch.device) -> dict[str, str | None]:
    """provider -> None when it can run here, else why not."""
    from ..kernels.utils import HAS_TRITON

    out: dict[str, str | None] = {"torch": None, "torch.compile": None}
    if device.type != "cuda":
        out["triton"] = "needs CUDA (on CPU the Triton interpreter checks correctness; it is not timed)"
    elif not HAS_TRITON:  # pragma: no cover
        out["triton"] = "triton is not installed"
    else:  # pragma: no cover
        out["triton"] = None
    for name, mod in (("liger", "liger_kernel"), ("flash-attn", "flash_attn"), ("mamba-ssm", "mamba_ssm"),
                      ("fla", "fla")):
        if device.type != "cuda":
            out[name] = "peer kernels need CUDA"
        elif importlib.util.find_spec(mod) is None:  # pragma: no cover
            out[name] = "not installed"
        else:  # pragma: no cover
            out[name] = None
    return out


def _compiled(fn):
    return torch.compile(fn, dynamic=False)


def _measure(fn, args, leaves, device, pass_):
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    timer = time_cuda if device.type == "cuda" else time_cpu

    def first_output(out):
        return out[0] if isinstance(out, (tuple, list)) else out

    if pass_ == "fwd":  # with autograd recording, as in training
        return timer(lambda: fn(*args), leaves)
    out = first_output(fn(*args))
    grad = torch.randn_like(out) if out.dim() else torch.ones_like(out)
    if pass_ == "bwd":
        def run():
            out.backward(grad, retain_graph=True)
        r = timer(run, leaves)
    else:
        def run():
            first_output(fn(*args)).backward(grad)
        r = timer(run, leaves)
    sync()
    return r


def _max_err(a, b) -> float:
    a = a[0] if isinstance(a, (tuple, list)) else a
    b = b[0] if isinstance(b, (tuple, list)) else b
    return float((a.float() - b.float()).abs().max())


def run_bench(device: torch.device | None = None, ops: list[str] | None = None,
              providers: list[str] | None = None, dtypes: list[str] | None = None,
              passes: list[str] | None = None, size: str = "auto",
              log: Callable[[str], None] | None = None, threads: int = 0) -> list[dict[str, Any]]:
    """Time the cases; returns one row per (op, provider, shape, dtype, pass).

    On a CPU the cases run on the threads abl.run.threads' rule gives one cell now (``threads``: 0,
    from the cores and the load; N > 0: N; -1: torch's default), named in each row's ``timing``:
    at torch's default (a thread per core) on a 2-core CPU that other jobs kept busy, every call
    waited for a descheduled thread, in whole 4 ms scheduler ticks (layernorm's fwd 8.0 ms against
    0.09 ms, rope's fwd+bwd 160 ms against 64 + 0.2), and fwd+bwd stopped agreeing with fwd + bwd.
    """
    from ..kernels import OPS

    log = log or (lambda msg: None)
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ops = list(ops or OPS)
    dtypes = list(dtypes or (["bf16"] if device.type == "cuda" else ["fp32"]))
    passes = list(passes or PASSES)
    avail = available_providers(device)
    if providers:
        wanted = list(providers)
    elif device.type == "cuda":  # pragma: no cover - needs a GPU
        wanted = list(PROVIDERS)
    else:
        # compiling every op's forward and backward with inductor takes about a minute
        # of CPU, far longer than timing them: on CPU torch.compile runs when asked for
        wanted = [p for p in PROVIDERS if p != "torch.compile"]
        log("provider torch.compile: not run by default on CPU (compile time); "
            "add --provider torch --provider torch.compile")
    for p in wanted:
        if avail.get(p):
            log(f"provider {p}: skipped, {avail[p]}")
    run_providers = [p for p in wanted if avail.get(p, "unknown") is None]
    if "torch.compile" in run_providers:
        import torch._functorch.config as functorch_config

        # timing a backward repeatedly needs retain_graph, which donated buffers forbid
        functorch_config.donated_buffer = False

    cpu_threads, previous_threads = "", torch.get_num_threads()
    if device.type == "cpu":
        from ..run import threads as thread_rule

        n, cpu_threads = thread_rule.choose(threads, thread_rule.usable_cores(), 1, thread_rule.load_average())
        if n is not None:
            torch.set_num_threads(n)
        log(f"CPU threads: {cpu_threads}")
    try:
        return _run_cases(device, ops, dtypes, passes, size, run_providers, cpu_threads, log)
    finally:
        torch.set_num_threads(previous_threads)


def _run_cases(device: torch.device, ops: list[str], dtypes: list[str], passes: list[str], size: str,
               run_providers: list[str], cpu_threads: str, log: Callable[[str], None]) -> list[dict[str, Any]]:
    peak = device_peak(device)
    llc = None
    if device.type == "cpu":
        from ..store.cpupeak import last_level_cache_bytes

        llc = last_level_cache_bytes()
    versions = json.dumps(package_versions(("abl", "torch", "triton", "liger-kernel", "flash-attn", "mamba-ssm",
                                            "fla-core"), missing=None), sort_keys=True)
    common = {"bench_id": uuid.uuid4().hex[:16], "created": datetime.now(timezone.utc).replace(tzinfo=None),
              "device": peak.device, "versions": versions, "git_commit": git_commit(),
              "timing": "triton.testing.do_bench (L2 flushed)" if device.type == "cuda"
              else f"cpu rounds (pytest-benchmark style), {cpu_threads}"}
    rows: list[dict[str, Any]] = []
    torch.manual_seed(0)
    for case in build_cases(device, dtypes, size, ops):
        if case.make is None:
            log(f"{case.op}: {case.notes.get('*')}")
            continue
        args, leaves = case.make(device)
        reference_out = None
        for prov in run_providers:
            fn = case.providers.get("torch" if prov == "torch.compile" else prov)
            if fn is None:
                continue
            if prov == "torch.compile":
                fn = _compiled(fn)
            note = "; ".join(x for x in (case.notes.get("*", ""), case.notes.get(prov, "")) if x)
            try:
                out = fn(*args)  # with autograd on, as it is timed (no extra compile for no_grad)
                out = [o.detach() for o in out] if isinstance(out, (tuple, list)) else out.detach()
                if prov == "torch":
                    reference_out = out
                elif reference_out is not None:
                    note = "; ".join(x for x in (note, f"max |out - torch| = {_max_err(out, reference_out):.3g}") if x)
                for pass_ in (["fwd+bwd"] if case.fused else passes):
                    if pass_ != "fwd" and not leaves:
                        continue
                    p20, p50, p80 = _measure(fn, args, leaves, device, pass_)
                    nbytes, nflops = case.bytes(pass_), case.flops(pass_)
                    gbps = nbytes / (p50 * 1e-3) / 1e9 if nbytes else None
                    tflops = nflops / (p50 * 1e-3) / 1e12 if nflops else None
                    if tflops is not None:
                        pk = peak.tflops.get(case.dtype)
                        frac, why = peak_fraction(tflops, pk)  # both in TFLOP/s
                        against = f"{pk:g} TFLOP/s {case.dtype}" if pk else "no FLOP/s peak"
                    else:
                        bw, against = bandwidth_peak(peak, nbytes or 0, llc)
                        frac, why = peak_fraction(gbps, bw)
                    row_note = "; ".join(x for x in (note, why) if x)
                    rows.append({**common, "op": case.op, "provider": prov, "shape": case.shape,
                                 "dtype": case.dtype, "pass": pass_, "p20": p20, "p50": p50, "p80": p80,
                                 "gbps": gbps, "tflops": tflops, "peak_fraction": frac,
                                 "peak_basis": f"{against} ({peak.basis})", "notes": row_note or None})
                    log(f"{case.op} {prov} {pass_}: p50 {p50:.3f} ms")
            except Exception as exc:  # noqa: BLE001 - one provider failing must not hide the others
                log(f"{case.op} {prov}: failed: {type(exc).__name__}: {exc}")
            finally:
                for t in leaves:
                    t.grad = None
    return rows


BENCH_COLUMNS = ("bench_id", "created", "op", "provider", "shape", "dtype", "pass", "p20", "p50", "p80",
                 "gbps", "tflops", "peak_fraction", "peak_basis", "device", "versions", "git_commit",
                 "timing", "notes")


def store_rows(db_path, rows: list[dict[str, Any]]) -> None:
    from ..store import database as store

    store.append_rows(db_path, "bench", BENCH_COLUMNS, [[r.get(c) for c in BENCH_COLUMNS] for r in rows])
