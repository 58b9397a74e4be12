"""ssd_scan: the Triton forward against the step-by-step recurrence and the chunked reference, forward
and backward; the op under torch.compile; every shipped configuration compiled for sm_90 without spills."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from abl.kernels.ssd_scan import ssd_chunked, ssd_scan_triton, ssd_sequential

from .helpers import DTYPE_NAMES, assert_close

# (B, T, H, P, G, N, chunk, initial state): T not a multiple of the chunk (masked tail), P and N
# not powers of two, grouped B/C (1 < G < H), H not a multiple of the interpreter's block of
# heads; chunk 32 and 64 take several 16-row blocks, so the causal bound skips tiles.
SHAPES = [
    (1, 40, 2, 16, 1, 16, 16, False),
    (2, 37, 4, 24, 2, 20, 16, True),
    (1, 50, 6, 32, 1, 32, 32, False),
    (2, 70, 4, 20, 2, 24, 32, True),
    (1, 64, 2, 16, 2, 16, 64, True),
]
CASES = [(*s, d) for s in SHAPES for d in (torch.float32, torch.bfloat16)] + [(*SHAPES[1], torch.float16)]


def _id(c):
    b, t, h, p, g, n, chunk, init, dt = c
    return f"B{b}-T{t}-H{h}-P{p}-G{g}-N{n}-chunk{chunk}{'-init' if init else ''}-{DTYPE_NAMES[dt]}"


def _inputs(case, device):
    """Inputs exactly representable in the case's dtype (dt and A too, which the kernel takes in
    fp32), so a reference run in that dtype starts from the very same values."""
    b, t, h, p, g, n, chunk, init, dtype = case
    torch.manual_seed(0)

    def rep(v):  # rounded to the dtype, held in fp32
        return v.to(dtype).float()

    x = rep(torch.randn(b, t, h, p, device=device))
    dt = rep(F.softplus(torch.randn(b, t, h, device=device) - 1))
    A = rep(-torch.rand(h, device=device) - 0.5)
    Bm = rep(torch.randn(b, t, g, n, device=device))
    Cm = rep(torch.randn(b, t, g, n, device=device))
    s0 = rep(torch.randn(b, h, p, n, device=device)) if init else None
    return x, dt, A, Bm, Cm, s0


def _grads(fn, inputs, dy, dfinal):
    leaves = [v.detach().requires_grad_() if v is not None else None for v in inputs]
    y, final = fn(*leaves)
    wanted = [v for v in leaves if v is not None]
    grads = torch.autograd.grad((y.float() * dy).sum() + (final.float() * dfinal).sum(), wanted)
    return y, final, grads


NAMES = ("dx", "ddt", "dA", "dB", "dC", "dinitial")


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_ssd_scan(case, device):
    """fp32: within TOLERANCE of the recurrence. 16-bit: (as FlashAttention's tests) the kernel's error
    against an fp64 ground truth is at most twice the error of the torch reference run in that dtype
    on the same inputs, plus a small floor; and within the dtype's TOLERANCE of the truth."""
    b, t, h, p, g, n, chunk, init, dtype = case
    x, dt, A, Bm, Cm, s0 = _inputs(case, device)
    low = (x.to(dtype), dt, A, Bm.to(dtype), Cm.to(dtype), s0)  # what the kernel gets: x, B, C in dtype

    def kernel(x_, dt_, a_, b_, c_, s_):
        return ssd_scan_triton(x_, dt_, a_, b_, c_, chunk, s_)

    torch.manual_seed(1)
    dy, dfinal = torch.randn(b, t, h, p, device=device), torch.randn(b, h, p, n, device=device)
    y, final, got = _grads(kernel, low, dy, dfinal)
    assert y.dtype == dtype and final.dtype == dtype and final.shape == (b, h, p, n)
    if dtype == torch.float32:
        y_ref, final_ref, want = _grads(lambda *a: ssd_sequential(*a), (x, dt, A, Bm, Cm, s0), dy, dfinal)
        assert_close("y", y_ref, y, dtype)
        assert_close("final_state", final_ref, final, dtype)
        for name, g_, r in zip(NAMES, got, want):
            assert_close(name, r, g_, dtype)
        return

    def chunked(*a):
        return ssd_chunked(*a[:5], chunk, initial_state=a[5])

    truth = [v.double() if v is not None else None for v in (x, dt, A, Bm, Cm, s0)]
    y_ref, final_ref, want = _grads(chunked, truth, dy.double(), dfinal.double())
    lowp = [v.to(dtype) if v is not None else None for v in (x, dt, A, Bm, Cm, s0)]
    y_pt, final_pt, torch_low = _grads(chunked, lowp, dy.to(dtype), dfinal.to(dtype))

    def check(name, ref, out, pt):
        ref, out, pt = ref.double(), out.double(), pt.double()
        err, err_pt = (out - ref).abs().max().item(), (pt - ref).abs().max().item()
        floor = 1e-3 * ref.abs().max().item()
        assert err <= 2 * err_pt + floor, \
            f"{name}: kernel error {err:.3g} > 2 x torch's {DTYPE_NAMES[dtype]} error {err_pt:.3g} + {floor:.2g}"
        assert_close(name, ref, out, dtype)

    check("y", y_ref, y, y_pt)
    check("final_state", final_ref, final, final_pt)
    for name, g_, r, pt in zip(NAMES, got, want, torch_low):
        check(name, r, g_, pt)


def test_ssd_scan_rejects_bad_chunk(device):
    x = torch.randn(1, 8, 2, 16, device=device)
    with pytest.raises(ValueError, match="power of two"):
        ssd_scan_triton(x, torch.rand(1, 8, 2, device=device), -torch.rand(2, device=device),
                        torch.randn(1, 8, 1, 16, device=device), torch.randn(1, 8, 1, 16, device=device), 24)


def test_ssd_scan_compiles_without_graph_breaks(device):
    """torch.compile traces ssd_scan_triton forward and backward as the two custom ops."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    case = (2, 37, 4, 24, 2, 20, 16, True, torch.float32)
    inputs = _inputs(case, device)

    def fn(x, dt, A, Bm, Cm, s0):
        y, final = ssd_scan_triton(x, dt, A, Bm, Cm, 16, s0)
        return y.square().sum() + final.sum()

    def run(f):
        leaves = [v.detach().requires_grad_() for v in inputs]
        loss = f(*leaves)
        return loss, torch.autograd.grad(loss, leaves)

    want = run(fn)
    torch._dynamo.reset()
    counters.clear()
    got = run(torch.compile(fn, backend="aot_eager", fullgraph=False))
    assert not counters["graph_break"], dict(counters["graph_break"])
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    for g_, w in zip(got[1], want[1]):
        torch.testing.assert_close(g_, w, rtol=0, atol=0)
    torch._dynamo.reset()


# ---------------------------------------------------------------- compiled for sm_90

_SM90_SCRIPT = """
import json
from abl.kernels import compilecheck
from abl.kernels.ssd_scan import compile_check_cases
compilecheck.register_cases("ssd_scan", compile_check_cases)
for launch in compilecheck.launches(["ssd_scan"]):
    r = compilecheck.check(launch)
    print(json.dumps(dict(label=r.label, registers=r.registers, spills=r.spill_store_bytes, error=r.error,
                          hazards=r.hazards)), flush=True)
"""


def _sm90_unavailable():
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.backends.nvidia.compiler import get_ptxas

        get_ptxas(90)
        import abl.kernels.compilecheck  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any reason means: cannot compile for sm_90 here
        return f"cannot compile for sm_90 with this triton: {exc!r}"[:300]
    return None


def test_ssd_scan_configurations_compile_for_sm90_without_spills():
    """Every configuration the launchers ship (per dtype class and tile class), forward and backward,
    compiled for an H100 without a GPU (``abl.kernels.compilecheck``, in a process without the
    interpreter): 0 bytes of spill stores, no asynchronous-MMA buffer hazard."""
    reason = _sm90_unavailable()
    if reason:
        pytest.skip(reason)
    out = _compiler_process(_SM90_SCRIPT, 1800)
    assert out.returncode == 0, out.stderr[-3000:]
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    kernels = {r["label"].split("[")[0] for r in results}
    assert kernels == {"_ssd_chunk_cumsum_kernel", "_ssd_bmm_chunk_kernel", "_ssd_chunk_state_kernel",
                       "_ssd_state_passing_kernel", "_ssd_chunk_scan_kernel",
                       # the backward's (abl.kernels.ssd_scan_bwd)
                       "_ssd_bwd_dstates_kernel", "_ssd_bwd_passing_kernel", "_ssd_bwd_dx_kernel",
                       "_ssd_bwd_dcb_kernel", "_ssd_bwd_dc_kernel", "_ssd_bwd_db_kernel",
                       "_ssd_bwd_ddt_kernel"}, kernels
    bad = [r for r in results if r["error"] or r["spills"] != 0 or r["hazards"]]
    assert not bad, "\n".join(f"{r['label']}: {r['spills']} B spill stores, {r['registers']} registers "
                              f"{r['hazards'] or ''} {r['error'] or ''}" for r in bad)


_TRACE_SCRIPT = """
import json
import torch
from functorch.compile import aot_function
from abl.kernels.utils import compile_check
import abl.kernels.ssd_scan  # noqa: F401 - registers the ops

class Traced(Exception):
    pass

def compiler(gm, inputs):
    print(json.dumps([str(n.target) for n in gm.graph.nodes if n.op == "call_function"]))
    raise Traced

def fwd(x, dt, A, Bm, Cm, s0):
    return torch.ops.abl.ssd_scan_fwd(x, dt, A, Bm, Cm, 64, s0)

def bwd(x, dt, A, Bm, Cm, s0):
    return torch.ops.abl.ssd_scan_bwd(x, s0, x, dt, A, Bm, Cm, 64, s0)

x, bm = torch.zeros(1, 100, 4, 64, dtype=torch.bfloat16), torch.zeros(1, 100, 2, 128, dtype=torch.bfloat16)
with compile_check():
    try:
        aot_function(OP, fw_compiler=compiler)(x, torch.zeros(1, 100, 4), -torch.ones(4), bm, bm,
                                               torch.zeros(1, 4, 64, 128, dtype=torch.bfloat16))
    except Traced:
        pass
"""


def _compiler_process(script, timeout):
    """Run ``script`` in a process where Triton compiles (no interpreter)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("op, launches", [("fwd", 5), ("bwd", 11)])
def test_ssd_scan_ops_open_into_their_kernels_when_traced(op, launches):
    """Where Triton compiles (not the interpreter) both ops are triton_ops: AOTAutograd's trace
    holds their kernel launches (what Inductor schedules), not an opaque op: the forward's five;
    the backward's four recomputed forward kernels and its seven. Traced only (CPU tensors, the
    launchers' CUDA configurations): nothing runs."""
    reason = _sm90_unavailable()
    if reason:
        pytest.skip(reason)
    out = _compiler_process(_TRACE_SCRIPT.replace("OP", op), 600)
    assert out.returncode == 0, out.stderr[-3000:]
    targets = json.loads([line for line in out.stdout.splitlines() if line.startswith("[")][-1])
    assert sum("triton_kernel_wrapper_functional" in t for t in targets) == launches, targets
    assert not any(f"ssd_scan_{op}" in t for t in targets), targets
