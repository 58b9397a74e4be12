"""``train.kernels = "auto"``: per op, the faster verified path on this device.

On CUDA, for each op a run will call and the class of shapes it will call it at
(``Workload`` -> ``shape_class``: the widths exact, token counts and sequence
lengths bucketed to powers of two, the compute dtype), ``measure_op``

1. verifies the Triton function against the op's fp32 ground truth under both of
   ``abl.kernels.utils.check_error``'s bounds (the fixed one, and FlashAttention's
   tests' relative rule against torch's own low-precision path), forward and every
   input gradient; a kernel that fails or raises is never chosen;
2. times forward+backward of the kernel and of the op's torch path (what the torch
   backend runs: the reference, and for attention SDPA, as ``abl.model.attention``
   uses) with ``triton.testing.do_bench``.

``decide`` picks the kernel only when it verified and measured faster; every other
op (slower, unverified, failed, or not measured: ``ssd_scan`` in a model without an
SSM mixer) takes its torch path. The choices are cached in ``kernels-auto.json`` in
the store's shape-cache folder (beside abl.model.shapecache's entries), keyed by the
device's name, the torch and triton versions, the op and its shape class; a later
run of the same class reads them and measures nothing. A cache file that cannot be
read is ignored with a warning (and rewritten). ``choose`` returns the triton backend
whose ``torch_ops`` are the ops that go to torch, with the choices attached
(``KernelBackend.info()``: what a run records in its info.json).

The inputs (``make_inputs``) and the checks (``check_op``) are the ones ``abl
selftest``'s kernel section and its determinism check run (abl.bench).
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .utils import ErrorCheck, check_error, dtype_name

CACHE_FILE = "kernels-auto.json"
CACHE_VERSION = 1
# measured shapes stop growing here: a class stands for every larger batch of the same widths
MAX_TOKENS = 16384
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


# ---------------------------------------------------------------- inputs and checks


@dataclass
class Inputs:
    """One op's call at one shape: the kernel, the ground truth and torch's path on the same inputs.

    ``args`` are the call's tensors as a run passes them (16-bit activations, fp32 norm weights);
    ``leaves`` the indices of those whose gradients are checked. ``reference`` is the op's torch
    reference: on fp32 copies of ``args`` it is the ground truth. ``torch_path`` is torch's own path
    in the inputs' precision (the reference on ``args``; for attention FlashAttention's tests'
    low-precision math); ``timed_torch`` what auto times the kernel against (default
    ``torch_path``; SDPA for attention).
    """

    shape: str
    args: list[Any]
    leaves: list[int]
    kernel: Callable[..., Any]
    reference: Callable[..., Any]
    torch_path: Callable[..., Any]
    timed_torch: Callable[..., Any] | None = None
    out_dtype: torch.dtype | None = None  # the forward's fixed bound, when not the inputs' dtype

    def leaf_tensors(self, args=None) -> list[torch.Tensor]:
        args = self.args if args is None else args
        return [args[i] for i in self.leaves]

    def fp32_args(self) -> list[Any]:
        """Detached fp32 copies of the floating-point args (the leaves requiring grad)."""
        out = []
        for i, a in enumerate(self.args):
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                a = a.detach().float().requires_grad_(i in self.leaves)
            out.append(a)
        return out


def first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _rand(shape, dtype, device, scale=1.0, grad=True):
    t = (scale * torch.randn(shape, device=device)).to(dtype)
    return t.requires_grad_(grad)


def attention_lowp(q, k, v, causal=True, scale=None):
    """Attention as FlashAttention's tests compute torch's low-precision path (``attention_ref`` with
    ``upcast=False``): the scores and P @ V in the inputs' dtype, the softmax in fp32 rounded back."""
    tq, tk, d = q.shape[2], k.shape[2], q.shape[3]
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else d ** -0.5)
    if causal:
        rel = torch.arange(tq, device=q.device)[:, None] + (tk - tq) - torch.arange(tk, device=q.device)[None, :]
        s = s.masked_fill(rel < 0, float("-inf"))
    p = torch.softmax(s.float(), dim=-1).nan_to_num(0.0).to(q.dtype)
    return p @ v


def make_inputs(op: str, shape: tuple, dtype: torch.dtype, device: torch.device) -> Inputs:
    """The calls of ``op`` at ``shape`` on fresh random inputs (shapes as abl.bench.selftest_kernels.SHAPES)."""
    from . import load  # at call time: a test can swap the functions

    kernel, ref = load(op)
    if op in ("rmsnorm", "layernorm"):
        m, n = shape
        x = _rand((m, n), dtype, device)
        w = (1 + 0.1 * torch.randn(n, device=device)).requires_grad_()
        b = (0.1 * torch.randn(n, device=device)).requires_grad_()
        eps = 1e-6 if op == "rmsnorm" else 1e-5
        return Inputs(f"M{m}-N{n}", [x, w, b], [0, 1, 2], lambda x, w, b: kernel(x, w, b, eps),
                      lambda x, w, b: ref(x, w, b, eps), lambda x, w, b: ref(x, w, b, eps))
    if op == "rope":
        b_, h, t, d = shape
        x = _rand((b_, t, h, d), dtype, device).transpose(1, 2).detach().requires_grad_()
        inv_freq = 10000.0 ** (-torch.arange(0, d, 2, device=device).float() / d)
        ang = torch.arange(t, device=device).float()[:, None] * inv_freq
        return Inputs(f"B{b_}-H{h}-T{t}-D{d}", [x, ang.cos(), ang.sin()], [0],
                      lambda x, c, s: kernel(x, c, s, "half"), lambda x, c, s: ref(x, c, s, "half"),
                      lambda x, c, s: ref(x, c, s, "half"))
    if op in ("swiglu", "geglu"):
        m, n = shape
        g, u = _rand((m, n), dtype, device, 2.0), _rand((m, n), dtype, device)
        return Inputs(f"M{m}-N{n}", [g, u], [0, 1], kernel, ref, ref)
    if op == "cross_entropy":
        n, v = shape
        x = _rand((n, v), dtype, device, 3.0)
        y = torch.randint(0, v, (n,), device=device)
        y[min(1, n - 1)] = -100  # an ignored row
        # the loss is fp32; 16-bit logits hold its fixed bound at fp16's (as tests/kernels)
        return Inputs(f"N{n}-V{v}", [x, y], [0], kernel, ref, ref,
                      out_dtype=torch.float32 if dtype == torch.float32 else torch.float16)
    if op == "linear_cross_entropy":
        n, d, v = shape
        hid, w = _rand((n, d), dtype, device), _rand((v, d), dtype, device, d ** -0.5)
        y = torch.randint(0, v, (n,), device=device)
        return Inputs(f"N{n}-D{d}-V{v}", [hid, w, y], [0, 1], kernel, ref, ref,
                      out_dtype=torch.float32 if dtype == torch.float32 else torch.float16)
    if op == "flash_attention":
        b_, h, t, d = shape
        q, k, v_ = (_rand((b_, h, t, d), dtype, device) for _ in range(3))
        return Inputs(f"B{b_}-H{h}-T{t}-D{d}-causal", [q, k, v_], [0, 1, 2],
                      lambda q, k, v: kernel(q, k, v, causal=True), lambda q, k, v: ref(q, k, v, causal=True),
                      lambda q, k, v: attention_lowp(q, k, v, causal=True),
                      timed_torch=lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    if op == "ssd_scan":
        b_, t, h, p, n = shape[:5]
        chunk = shape[5] if len(shape) > 5 else (16 if device.type == "cpu" else 64)
        x = _rand((b_, t, h, p), dtype, device)
        dt = F.softplus(torch.randn(b_, t, h, device=device) - 1).requires_grad_()
        a = (-torch.rand(h, device=device) - 0.5).requires_grad_()
        bm, cm = _rand((b_, t, 1, n), dtype, device), _rand((b_, t, 1, n), dtype, device)

        def torch_path(x, dt, a, bm, cm):  # as a run computes it: the reference under the precision's autocast
            if x.dtype == torch.float32:
                return ref(x, dt, a, bm, cm, chunk)[0]
            with torch.autocast(x.device.type, dtype=x.dtype):
                return ref(x, dt, a, bm, cm, chunk)[0]

        return Inputs(f"B{b_}-T{t}-H{h}-P{p}-N{n}-chunk{chunk}", [x, dt, a, bm, cm], [0, 1, 2, 3, 4],
                      lambda x, dt, a, bm, cm: kernel(x, dt, a, bm, cm, chunk)[0],
                      lambda x, dt, a, bm, cm: ref(x, dt, a, bm, cm, chunk)[0], torch_path)
    raise KeyError(f"no inputs for kernel op {op!r}")


def _grads(out, leaves, grad):
    return torch.autograd.grad(out, leaves, grad.to(out.dtype), allow_unused=True)


def check_op(op: str, shape: tuple, dtype: torch.dtype, device: torch.device) -> list[dict[str, Any]]:
    """Forward and backward of one op at one shape and dtype against the fp32 ground truth, under
    both bounds (abl.kernels.utils.check_error): two rows, pass "fwd" and "bwd"."""
    torch.manual_seed(0)
    base: dict[str, Any] = {"op": op, "dtype": DTYPE_NAMES[dtype]}
    fixed = check_error(torch.zeros(1), torch.zeros(1), dtype=dtype).fixed
    try:
        inp = make_inputs(op, shape, dtype, device)
        base["shape"] = inp.shape
        truth_args = inp.fp32_args()
        out = first(inp.kernel(*inp.args))
        truth = first(inp.reference(*truth_args))
        lowp = first(inp.torch_path(*inp.args))
        fwd = check_error(out, truth, lowp, dtype, inp.out_dtype)
        rows = [_row(base, "fwd", fwd, f"output: {fwd.detail()}")]
        # one output gradient for all three, in the kernel's output dtype (the truth gets its exact fp32 value)
        grad = torch.randn_like(out.float()).to(out.dtype).float()
        got = _grads(out, inp.leaf_tensors(), grad)
        want = _grads(truth, inp.leaf_tensors(truth_args), grad)
        ref_lowp = _grads(lowp, inp.leaf_tensors(), grad)
        checks = [(i, check_error(g, w, r, dtype)) for i, (g, w, r) in enumerate(zip(got, want, ref_lowp))
                  if g is not None and w is not None]
        missing = sum(1 for g, w in zip(got, want) if (g is None) != (w is None))
        if checks and not missing:
            i, worst = max(checks, key=lambda c: (not c[1].ok, c[1].error / max(c[1].bound, 1e-30)))
            detail = f"worst of {len(checks)} input gradients (input {inp.leaves[i]}): {worst.detail()}"
            rows.append(_row(base, "bwd", worst, detail, all(c.ok for _, c in checks)))
        else:
            rows.append({**base, "pass": "bwd", "error": math.inf, "torch_error": None, "fixed": fixed,
                         "tolerance": fixed, "ok": False,
                         "detail": f"{missing} gradient(s) missing" if missing else "no gradient to compare"})
        return rows
    except Exception as exc:  # noqa: BLE001 - a kernel that raises fails its check, the others still run
        base.setdefault("shape", "x".join(str(s) for s in shape))
        return [{**base, "pass": p, "error": None, "torch_error": None, "fixed": fixed, "tolerance": fixed,
                 "ok": False, "detail": f"raised {type(exc).__name__}: {exc}"} for p in ("fwd", "bwd")]


def _row(base, pass_, c: ErrorCheck, detail, ok=None) -> dict[str, Any]:
    return {**base, "pass": pass_, "error": c.error, "torch_error": c.torch_error, "fixed": c.fixed,
            "tolerance": c.bound, "ok": c.ok if ok is None else ok, "detail": detail}


# ---------------------------------------------------------------- the run's shapes


def bucket(n: int, least: int = 16) -> int:
    """The power of two at or above ``n`` (at least ``least``)."""
    return max(least, 1 << (max(1, int(n)) - 1).bit_length())


@dataclass(frozen=True)
class Workload:
    """The shapes a run's ops will see (per process): its widths, tokens per step and compute dtype.

    ``ssd``: (heads, head_dim, d_state, chunk) of an SSD mixer, None when the model has none (then
    ssd_scan is not measured and goes to torch). ``ops``: the ops to measure (None: every op of
    ``abl.kernels.OPS``, ssd_scan only with ``ssd``).
    """

    batch: int
    context: int
    d_model: int
    n_heads: int
    head_dim: int
    vocab: int
    dtype: str = "bfloat16"
    ffn: int = 0  # 0: 4 * d_model
    ssd: tuple[int, int, int, int] | None = None
    ops: tuple[str, ...] | None = None

    def measured_ops(self) -> list[str]:
        from . import OPS

        if self.ops is not None:
            return [op for op in self.ops if op in OPS]
        return [op for op in OPS if op != "ssd_scan" or self.ssd is not None]


# the SSD mixer's defaults (plugins/ssm.py, Mamba2: expand 2, head_dim 32, d_state 64, chunk 64): a
# model config names the mixer, not its parameters, so auto measures the scan at these
SSD_DEFAULTS = {"expand": 2, "head_dim": 32, "d_state": 64, "chunk": 64}


def workload_of(model: Any, batch_per_rank: int, dtype: Any) -> Workload:
    """The workload of a model config (``abl.contracts.config.ModelConfig``, read by its fields)
    at ``batch_per_rank`` sequences per step in ``dtype`` (the precision policy's compute dtype)."""
    mixers = model.layer_mixer_names() if hasattr(model, "layer_mixer_names") else [getattr(model, "mixer", "")]
    ssd = None
    if any("mamba2" in m or "ssd" in m for m in mixers):
        e = SSD_DEFAULTS["expand"] * model.d_model
        ssd = (max(1, e // SSD_DEFAULTS["head_dim"]), SSD_DEFAULTS["head_dim"], SSD_DEFAULTS["d_state"],
               SSD_DEFAULTS["chunk"])
    return Workload(batch=int(batch_per_rank), context=int(model.context), d_model=int(model.d_model),
                    n_heads=int(model.n_heads), head_dim=int(model.head_dim or model.d_model // model.n_heads),
                    vocab=int(model.vocab_size), dtype=dtype_name(dtype), ssd=ssd)


def shape_class(op: str, w: Workload) -> tuple[int, ...]:
    """The shape ``op`` is measured at for ``w`` (abl.bench.selftest_kernels.SHAPES' layout): widths
    exact, sequence lengths and token counts bucketed to powers of two, tokens capped at MAX_TOKENS."""
    t = bucket(w.context)
    tokens = min(bucket(w.batch * w.context), MAX_TOKENS)
    seqs = max(1, tokens // t)
    if op in ("rmsnorm", "layernorm"):
        return (tokens, w.d_model)
    if op == "rope":
        return (seqs, w.n_heads, t, w.head_dim)
    if op in ("swiglu", "geglu"):
        return (tokens, w.ffn or 4 * w.d_model)
    if op == "cross_entropy":
        return (tokens, w.vocab)
    if op == "linear_cross_entropy":
        return (tokens, w.d_model, w.vocab)
    if op == "flash_attention":
        return (seqs, w.n_heads, t, w.head_dim)
    if op == "ssd_scan":
        h, p, n, chunk = w.ssd or (w.n_heads, w.head_dim, 64, 64)
        return (seqs, t, h, p, n, chunk)
    raise KeyError(op)


def class_label(op: str, shape: tuple[int, ...], dtype: str) -> str:
    return f"{op} {'x'.join(str(s) for s in shape)} {dtype}"


# ---------------------------------------------------------------- measuring and deciding


@dataclass
class Measurement:
    """What ``measure_op`` found: the verification and the two forward+backward times (ms)."""

    verified: bool
    triton_ms: float | None = None
    torch_ms: float | None = None
    why: str = ""  # the verification's outcome, or why something could not be timed


def time_fwd_bwd_cuda(fn: Callable[[], Any], leaves: list[torch.Tensor]) -> float:  # pragma: no cover - GPU
    """Median ms of ``fn`` (a forward and its backward) by ``triton.testing.do_bench``."""
    import triton.testing

    return median_of(triton.testing.do_bench(fn, warmup=10, rep=40, grad_to_none=leaves, quantiles=[0.5]))


def median_of(q: Any) -> float:
    """do_bench's answer for quantiles=[0.5]: a list of one, or (triton 3.x) the bare number."""
    return float(q[0] if isinstance(q, (list, tuple)) else q)


def fwd_bwd(fn: Callable[..., Any], args: list[Any], leaves: list[int]) -> Callable[[], None]:
    """A closure running ``fn`` on ``args`` and the backward of its first output (a fixed gradient)."""
    out = first(fn(*args))
    grad = torch.randn_like(out.float()).to(out.dtype) if out.dim() else torch.ones_like(out)

    def run():
        for i in leaves:
            args[i].grad = None
        first(fn(*args)).backward(grad)

    return run


def measure_op(op: str, shape: tuple, dtype: torch.dtype, device: torch.device,
               timer: Callable[[Callable[[], Any], list[torch.Tensor]], float] | None = None) -> Measurement:
    """Verify the kernel at ``shape`` (``check_op``), then time it and its torch path, forward+backward."""
    rows = check_op(op, shape, dtype, device)
    bad = [r for r in rows if not r["ok"]]
    if bad:
        return Measurement(False, why="; ".join(f"{r['pass']}: {r['detail']}" for r in bad))
    why = "verified: " + "; ".join(f"{r['pass']} {r['error']:.3g} <= {r['tolerance']:.3g}" for r in rows)
    timer = timer or time_fwd_bwd_cuda
    torch.manual_seed(0)
    inp = make_inputs(op, shape, dtype, device)
    times: dict[str, float | None] = {}
    for name, fn in (("triton", inp.kernel), ("torch", inp.timed_torch or inp.torch_path)):
        try:
            times[name] = timer(fwd_bwd(fn, inp.args, inp.leaves), inp.leaf_tensors())
        except Exception as exc:  # noqa: BLE001 - out of memory, a compile failure: that path is not timed
            times[name] = None
            why += f"; {name} not timed: {type(exc).__name__}: {str(exc)[:200]}"
    return Measurement(True, times["triton"], times["torch"], why)


def decide(m: Measurement) -> tuple[str, str]:
    """("triton" or "torch", why): the kernel only when it verified and timed faster than torch's path."""
    if not m.verified:
        return "torch", f"kernel not verified: {m.why}"
    if m.triton_ms is None:
        return "torch", f"kernel not timed ({m.why})"
    if m.torch_ms is None:
        return "triton", f"verified; torch's path could not be timed ({m.why})"
    verdict = "triton" if m.triton_ms < m.torch_ms else "torch"
    return verdict, (f"fwd+bwd {m.triton_ms:.4g} ms kernel vs {m.torch_ms:.4g} ms torch "
                     f"({m.torch_ms / m.triton_ms:.2f}x)")


# ---------------------------------------------------------------- the cache


def device_key(device: torch.device) -> str:
    """The device's name and the versions a choice depends on."""
    from .utils import TRITON_VERSION

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return f"{name} | torch {torch.__version__} | triton {TRITON_VERSION}"


def cache_key(device: str, op: str, shape: tuple, dtype: str) -> str:
    return f"{device} | {class_label(op, shape, dtype)}"


def read_cache(path: Path | None) -> dict[str, dict[str, Any]]:
    """The cached choices (key -> entry); {} when there is no file, and, with a warning, when it is
    unreadable or not a cache of this version (it is rewritten at the next measurement)."""
    import json

    if path is None or not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        warnings.warn(f"ignoring the kernel choice cache {path.name}: it cannot be read ({type(exc).__name__}: "
                      f"{exc}); the ops are measured again", RuntimeWarning, stacklevel=2)
        return {}
    entries = data.get("entries") if isinstance(data, dict) and data.get("version") == CACHE_VERSION else None
    if not isinstance(entries, dict):
        warnings.warn(f"ignoring the kernel choice cache {path.name}: not a version-{CACHE_VERSION} cache; "
                      "the ops are measured again", RuntimeWarning, stacklevel=2)
        return {}
    return {k: v for k, v in entries.items() if _valid_entry(v)}


def _valid_entry(v: Any) -> bool:
    return isinstance(v, dict) and v.get("choice") in ("triton", "torch") and isinstance(v.get("why", ""), str)


def write_cache(path: Path, new: dict[str, dict[str, Any]]) -> None:
    """Add ``new`` to the file (read again first: another worker's choices stay); a cache that cannot
    be written only costs a measurement next time."""
    from ..files import write_json

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        entries = read_cache(path)
    entries.update(new)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"version": CACHE_VERSION, "entries": entries})
    except OSError:
        pass


# ---------------------------------------------------------------- auto


@dataclass
class Choice:
    op: str
    shape: str  # the class, as class_label
    choice: str  # "triton" or "torch"
    why: str
    triton_ms: float | None = None
    torch_ms: float | None = None
    cached: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"op": self.op, "shape": self.shape, "choice": self.choice, "why": self.why,
                "triton_ms": self.triton_ms, "torch_ms": self.torch_ms, "cached": self.cached}


def choose(device: torch.device, workload: Workload, cache_dir: Path | None,
           measure: Callable[[str, tuple, torch.dtype, torch.device], Measurement] | None = None,
           log: Callable[[str], None] = lambda m: None):
    """The triton backend whose ``torch_ops`` are the ops that lost, failed or were not measured
    (``measure``: how an op is measured, default ``measure_op``)."""
    from . import OPS, KernelBackend

    measure = measure or measure_op
    dkey = device_key(device)
    path = None if cache_dir is None else Path(cache_dir) / CACHE_FILE
    cached = read_cache(path)
    dtype = getattr(torch, workload.dtype)
    choices: list[Choice] = []
    fresh: dict[str, dict[str, Any]] = {}
    # measuring draws random inputs: the run's generators (seeded before) must not see it
    with _rng_kept(device):
        _choose_ops(device, workload, dkey, cached, dtype, measure, log, choices, fresh)
    if fresh and path is not None:
        write_cache(path, fresh)
    measured = {c.op for c in choices}
    unmeasured = [op for op in OPS if op not in measured]
    torch_ops = frozenset([c.op for c in choices if c.choice == "torch"] + unmeasured)
    notes = tuple(c.as_json() for c in choices) + tuple(
        {"op": op, "choice": "torch", "why": "not measured (the run's model does not call it)"} for op in unmeasured)
    return KernelBackend("triton", torch_ops=torch_ops, choices=notes)


@contextlib.contextmanager
def _rng_kept(device: torch.device) -> Iterator[None]:
    """The random generators' states (CPU, and the device's) as they were before the block."""
    cpu, cuda = torch.get_rng_state(), None
    if device.type == "cuda":
        try:
            cuda = torch.cuda.get_rng_state(device)
        except (RuntimeError, AssertionError):  # no CUDA runtime (a test's pretend device)
            cuda = None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, device)


def _choose_ops(device, workload, dkey, cached, dtype, measure, log, choices, fresh) -> None:
    for op in workload.measured_ops():
        shape = shape_class(op, workload)
        key = cache_key(dkey, op, shape, workload.dtype)
        entry = cached.get(key)
        if entry is not None:
            choices.append(Choice(op, class_label(op, shape, workload.dtype), entry["choice"], entry.get("why", ""),
                                  entry.get("triton_ms"), entry.get("torch_ms"), cached=True))
            continue
        log(f"auto: measuring {class_label(op, shape, workload.dtype)}")
        t0 = time.perf_counter()
        try:
            m = measure(op, shape, dtype, device)
        except Exception as exc:  # noqa: BLE001 - the op goes to torch; the run goes on
            m = Measurement(False, why=f"measuring raised {type(exc).__name__}: {exc}")
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        choice, why = decide(m)
        c = Choice(op, class_label(op, shape, workload.dtype), choice, why, m.triton_ms, m.torch_ms)
        choices.append(c)
        fresh[key] = {**c.as_json(), "measured": datetime.now(UTC).isoformat(timespec="seconds"),
                      "measure_s": round(time.perf_counter() - t0, 2), "verification": m.why[:2000]}
