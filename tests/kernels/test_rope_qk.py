"""``rope_qk_triton``: queries and keys rotated in one kernel launch, forward and backward (issue 36).

The attention mixers rotate q and k of a layer together; one launch covers both (the keys may
have fewer heads, GQA, and their own angles), and its backward (the inverse rotation of dq and
dk) is one launch too. The launches are counted through ``wrap_triton``, which every launcher
of ``abl.kernels.rope`` goes through.
"""

import re

import pytest
import torch

import abl.kernels.rope as rope_mod
from abl.kernels.rope import rope_qk_triton, rope_reference

from .helpers import DTYPE_NAMES, assert_close


class Launches:
    """Counts the kernel launches made through ``abl.kernels.rope.wrap_triton``."""

    def __init__(self, monkeypatch):
        self.kernels: list[str] = []
        real = rope_mod.wrap_triton

        def counting(kernel):
            self.kernels.append(getattr(kernel, "__name__", None) or getattr(kernel.fn, "__name__", "?"))
            return real(kernel)
        monkeypatch.setattr(rope_mod, "wrap_triton", counting)


def _angles(b, t, d, per_seq, device, offset=0.0):
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, device=device).float() / d)
    pos = torch.arange(t, device=device).float() + offset
    if per_seq:
        pos = pos + torch.arange(b, device=device)[:, None] * 5.0
    ang = pos[..., None] * inv_freq
    return ang.cos(), ang.sin()


def _qk(kind, b, t, hq, hk, d, dt, device):
    """(q, k) as the mixers hold them, and the leaves their gradients reach."""
    if kind == "fused":  # one [B, T, Hq + 2 Hk, D] projection, q and k strided views of it
        qkv = torch.randn(b, t, hq + 2 * hk, d, device=device).to(dt).requires_grad_()
        x = qkv.transpose(1, 2)
        return x[:, :hq], x[:, hq:hq + hk], (qkv,)
    q = torch.randn(b, hq, t, d, device=device).to(dt).requires_grad_()
    k = torch.randn(b, hk, t, d, device=device).to(dt).requires_grad_()
    return q, k, (q, k)


def test_q_and_k_are_rotated_in_one_launch_forward_and_backward(device, monkeypatch):
    launches = Launches(monkeypatch)
    torch.manual_seed(0)
    q, k, leaves = _qk("fused", 2, 6, 4, 2, 16, torch.float32, device)
    cos, sin = _angles(2, 6, 16, False, device)
    qo, ko = rope_qk_triton(q, k, cos, sin)
    assert len(launches.kernels) == 1, launches.kernels
    torch.autograd.grad((qo, ko), leaves, (torch.randn_like(qo), torch.randn_like(ko)))
    assert len(launches.kernels) == 2, launches.kernels  # the backward: one more, for dq and dk


# (kind, B, T, Hq, Hk, D, dtype, layout, per-sequence angles, keys at their own positions)
CASES = [
    ("fused", 2, 7, 4, 2, 16, torch.bfloat16, "interleaved", False, False),
    ("fused", 1, 9, 3, 1, 24, torch.float32, "half", True, False),
    ("separate", 2, 5, 2, 2, 20, torch.float16, "interleaved", True, True),
    ("separate", 1, 6, 6, 3, 32, torch.float32, "half", False, True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-B{c[1]}-T{c[2]}-Hq{c[3]}-Hk{c[4]}-D{c[5]}-"
                                                      f"{DTYPE_NAMES[c[6]]}-{c[7]}{'-perseq' if c[8] else ''}"
                                                      f"{'-kangles' if c[9] else ''}")
def test_rope_qk_matches_the_reference(case, device, monkeypatch):
    kind, b, t, hq, hk, d, dt, layout, per_seq, own_k = case
    monkeypatch.setattr(rope_mod, "_TILE_ELEMENTS", 2 * d * 2)  # several head and position blocks
    torch.manual_seed(0)
    q, k, leaves = _qk(kind, b, t, hq, hk, d, dt, device)
    cos, sin = _angles(b, t, d, per_seq, device)
    cos_k, sin_k = _angles(b, t, d, per_seq, device, offset=3.0) if own_k else (None, None)
    qo, ko = rope_qk_triton(q, k, cos, sin, cos_k, sin_k, layout=layout)
    refs = (rope_reference(q, cos, sin, layout),
            rope_reference(k, cos if cos_k is None else cos_k, sin if sin_k is None else sin_k, layout))
    for name, o, r in zip("qk", (qo, ko), refs):
        assert o.dtype == dt and o.shape == r.shape
        assert_close(name, r, o, dt)
    dys = [torch.randn_like(r) for r in refs]
    got = torch.autograd.grad((qo, ko), leaves, dys)
    want = torch.autograd.grad(refs, leaves, dys)
    for g, w in zip(got, want):
        assert_close("d" + kind, w, g, dt)


def test_rope_qk_refuses_mismatched_inputs(device):
    q = torch.randn(1, 2, 4, 8, device=device)
    cos, sin = _angles(1, 4, 8, False, device)
    with pytest.raises(ValueError, match="same batch"):
        rope_qk_triton(q, torch.randn(2, 2, 4, 8, device=device), cos, sin)
    with pytest.raises(ValueError, match="head dim"):
        rope_qk_triton(q, torch.randn(1, 2, 4, 6, device=device), cos, sin, *_angles(1, 4, 6, False, device))
    with pytest.raises(ValueError, match="layout"):
        rope_qk_triton(q, q, cos, sin, layout="pairs")


def test_compiled_graph_passes_the_views_to_one_op_without_a_copy(device):
    """torch.compile (inductor) hands abl::rope_qk the projection's buffer as the strided q and k
    views: one call, no clone or contiguous copy in front of it."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    b, t, h, d = 1, 4, 2, 8
    torch.manual_seed(0)
    w = torch.randn(16, 3 * h * d, device=device, requires_grad=True)
    x = torch.randn(b, t, 16, device=device)
    cos, sin = _angles(b, t, d, False, device)

    def f(x, w):
        q, k, v = (x @ w).view(b, t, 3, h, d).permute(2, 0, 3, 1, 4)
        q, k = rope_qk_triton(q, k, cos, sin)
        return ((q * k).sum(-1, keepdim=True) * v).sum()

    torch._dynamo.reset()
    counters.clear()
    try:
        out, codes = run_and_get_code(torch.compile(f), x, w)
        assert not counters["graph_break"], dict(counters["graph_break"])
    finally:
        torch._dynamo.reset()
    assert torch.allclose(out, f(x, w), rtol=1e-5, atol=1e-5)
    forward = codes[0]
    # the op itself (the interpreter keeps it one node), or its kernel's launch (on a GPU)
    calls = re.findall(r"= torch\.ops\.abl\.rope_qk\.default\((.*)|_rope_qk_kernel\w*\.run\((.*)", forward)
    calls = [a or b for a, b in calls]
    assert len(calls) == 1, forward
    assert re.match(r"reinterpret_tensor\(buf\d+.*, reinterpret_tensor\(buf", calls[0]), calls
    assert "clone" not in forward.split("def call", 1)[1].split("return", 1)[0], forward


def test_a_compiled_step_launches_rope_per_rotation_and_as_often_in_the_backward(registry, monkeypatch):
    """The 126M cell's shape class (scripts/gpu_big.toml: MHA, RoPE, pre-norm blocks), compiled as
    ``train.compile`` compiles the training forward, on the Triton backend: one step launches the
    RoPE kernel for each rotation of q/k in the forward (one per block with ``rope_qk``, two while
    q and k are rotated apart) and as many times in the backward; nothing recomputes it. (The GPU
    probe of 2026-11-28 read 80 launches a step off torch.profiler's table for 10 blocks; this trace
    gives 40: the table lists each launch twice, as inductor's CPU-side record of the launch, named
    after the kernel, and as the kernel itself, each with the kernel's CUDA time.)"""
    from torch._dynamo.utils import counters

    from abl import kernels
    from abl.contracts.config import ModelConfig
    from abl.model.decoder import DecoderLM, ForwardContext

    n_layers = 3
    cfg = ModelConfig(d_model=32, n_layers=n_layers, n_heads=2, context=16, vocab_size=40)
    comps = {}
    for axis, name in (("norm", "rmsnorm"), ("block", "pre"), ("position", "rope"), ("mixer", "mha"),
                       ("ffn", "gelu")):
        comps[axis] = {"name": name, "params": {k: p.default for k, p in registry.get(axis, name).params.items()}}
    torch.manual_seed(0)
    model = DecoderLM(cfg, comps, registry, kernel_backend=kernels.KernelBackend("triton"))
    for query in (kernels.active, kernels.use_triton):
        torch.compiler.assume_constant_result(query)
    launches = Launches(monkeypatch)
    idx, targets = torch.randint(0, 40, (2, 16)), torch.randint(0, 40, (2, 16))
    torch._dynamo.reset()
    counters.clear()
    try:
        compiled = torch.compile(model._forward, backend="aot_eager")
        with model.kernel_backend.activate():
            _, loss, _ = compiled(idx, targets, ForwardContext(position=model.position, need_logits=False))
            forward = len(launches.kernels)
            loss.backward()
        assert not counters["graph_break"], dict(counters["graph_break"])
    finally:
        torch._dynamo.reset()
    assert forward in (n_layers, 2 * n_layers), launches.kernels
    assert len(launches.kernels) == 2 * forward, launches.kernels


def test_the_probe_times_the_one_launch_op_in_the_interpreter(tmp_path, probe_on_cpu):
    """The GPU probe's stage e times ``rope_qk_triton`` against q then k: its code runs here at tiny
    sizes, with the CUDA timer swapped for one CPU call."""
    from abl.bench import probe_kernels, probe_rope

    report = probe_kernels.Report(tmp_path / "e.txt", "layernorm", 300)
    probe_rope.rope_qk_at_the_cell(report, torch.device("cpu"), True)
    report.close()
    text = (tmp_path / "e.txt").read_text()
    rows = {r["provider"]: r for r in report.rows}
    for layout in ("interleaved", "half"):
        for name in (f"rope triton rope_qk {layout} (one launch) q+k",
                     f"rope triton {layout} q then k (two launches) q+k"):
            assert name in rows and "error" not in rows[name], text
            assert rows[name]["rel_diff"] < 1e-2 and rows[name]["fwd_bwd_ms"] > 0, rows[name]
