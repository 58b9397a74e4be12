"""``torch.compile`` traces the Triton ops without a graph break.

Each op's launchers are custom ops (``torch.library.triton_op``, fake and autograd
registered), so dynamo keeps a call in the graph instead of falling back to Python
around it. Here each op, and a whole small model on the Triton backend, is compiled
with the ``aot_eager`` backend (the graph is traced through AOTAutograd, forward and
backward, and run eagerly: the kernels run in the Triton interpreter on CPU) and must
give no graph break and the eager values. The backend queries are constants to
dynamo, as ``abl.train.compiled.Compiled`` makes them: a compiled cell's backend is
fixed for its whole run.
"""

import pytest
import torch
import torch.nn.functional as F

from abl import kernels

from .helpers import assert_close

TRITON = kernels.KernelBackend("triton", interpreted=True)


@pytest.fixture
def compiling():
    """A fresh dynamo (no cached graphs, no counts) with the queries constant, as Compiled does."""
    from torch._dynamo.utils import counters

    for query in (kernels.active, kernels.use_triton):
        torch.compiler.assume_constant_result(query)
    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


def _angles(t, d, batch=None):
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2).float() / d)
    pos = torch.arange(t).float()
    if batch:
        pos = pos + torch.arange(batch)[:, None] * 3.0
    ang = pos[..., None] * inv_freq
    return ang.cos(), ang.sin()


def _case(name):
    """(function of the inputs giving the op's outputs, the inputs: leaves that require grad or not)."""
    op = kernels.op(name)
    torch.manual_seed(0)
    grad = dict(requires_grad=True)

    def leaf(t):
        return t.detach().requires_grad_()
    if name == "rmsnorm":
        return (lambda x, w, b: op(x, w, b, 1e-6)), (torch.randn(2, 5, 48, **grad), leaf(1 + torch.randn(48) / 10),
                                                    leaf(torch.randn(48) / 10))
    if name == "layernorm":
        def fn(x, w, b):
            return op(x, w, b, 1e-5, "inside") + op(x, w, None, 1e-5, "outside")
        return fn, (torch.randn(2, 5, 40, **grad), leaf(1 + torch.randn(40) / 10), leaf(torch.randn(40) / 10))
    if name == "rope":
        cos, sin = _angles(9, 16)
        cos_b, sin_b = _angles(9, 16, batch=2)

        def fn(x):  # q read in place from a [B, T, H, D] projection; both layouts; per-sequence angles
            q = x.transpose(1, 2)
            return op(q, cos, sin, "interleaved") + op(q, cos_b, sin_b, "half")
        return fn, (torch.randn(2, 9, 3, 16, **grad),)
    if name in ("swiglu", "geglu"):
        def fn(gu, g2, u2):
            gate, up = gu.chunk(2, dim=-1)
            if name == "swiglu":
                return op(gate, up), op(g2, u2)
            return op(gate, up), op(g2, u2, "tanh")
        return fn, (leaf(2 * torch.randn(3, 7, 2 * 24)), torch.randn(4, 24, **grad), torch.randn(4, 24, **grad))
    if name == "cross_entropy":
        targets = torch.randint(0, 70, (12,))
        targets[3] = -100
        return (lambda logits: op(logits, targets)), (torch.randn(12, 70, **grad),)
    if name == "linear_cross_entropy":
        targets = torch.randint(0, 70, (12,))
        return (lambda h, w: op(h, w, targets)), (torch.randn(12, 32, **grad), leaf(torch.randn(70, 32) / 6))
    if name == "flash_attention":
        return (lambda q, k, v: op(q, k, v, causal=True)), tuple(torch.randn(1, 2, 20, 16, **grad) for _ in range(3))
    if name == "ssd_scan":
        b, t, h, p, g, n = 1, 40, 2, 16, 1, 16
        dt = leaf(F.softplus(torch.randn(b, t, h) - 1))
        return (lambda x, dt, A, Bm, Cm: op(x, dt, A, Bm, Cm, 16)), (
            torch.randn(b, t, h, p, **grad), dt, leaf(-torch.rand(h) - 0.5),
            torch.randn(b, t, g, n, **grad), torch.randn(b, t, g, n, **grad))
    raise AssertionError(name)


def _outputs_and_grads(fn, inputs):
    """fn's outputs and the gradients of a fixed random projection of them (the backward)."""
    for t in inputs:
        t.grad = None
    with TRITON.activate():
        outs = fn(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    gen = torch.Generator().manual_seed(1)
    loss = sum((o.float() * torch.randn(o.shape, generator=gen)).sum() for o in outs)
    loss.backward()
    return [o.detach() for o in outs], [t.grad for t in inputs]


OPS = ["rmsnorm", "layernorm", "rope", "swiglu", "geglu", "cross_entropy", "linear_cross_entropy",
       "flash_attention", "ssd_scan"]


@pytest.mark.parametrize("name", OPS)
def test_the_op_compiles_without_a_graph_break(compiling, name):
    fn, inputs = _case(name)
    want, want_grads = _outputs_and_grads(fn, inputs)
    got, got_grads = _outputs_and_grads(torch.compile(fn, backend="aot_eager"), inputs)
    assert not compiling["graph_break"], dict(compiling["graph_break"])
    assert compiling["stats"]["unique_graphs"] == 1, dict(compiling["stats"])
    for i, (w, g) in enumerate(zip(want, got)):
        assert_close(f"{name} output {i}", w, g)
    for i, (w, g) in enumerate(zip(want_grads, got_grads)):
        assert (w is None) == (g is None), i
        if w is not None:
            assert_close(f"{name} grad {i}", w, g)


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_a_model_on_the_triton_backend_compiles_to_one_graph(compiling, registry, monkeypatch, norm):
    """Norms, RoPE, a SwiGLU FFN, flash attention and the fused LM-head loss, all on their
    kernels (each counted), compiled as ``train.compile`` compiles the training forward."""
    from abl.model.decoder import ForwardContext

    from .test_kernels_wiring import Calls, build

    model = build(registry, "mha", "rope", norm=norm, backend="triton")
    idx = torch.randint(0, 50, (2, 24))
    targets = torch.randint(0, 50, (2, 24))

    def step(forward):
        model.zero_grad(set_to_none=True)
        with model.kernel_backend.activate():
            _, loss, _ = forward(idx, targets, ForwardContext(position=model.position, need_logits=False))
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    want, want_grads = step(model._forward)
    calls = Calls(monkeypatch, f"{norm}.{norm}_triton", "rope.rope_qk_triton", "swiglu.swiglu_triton",
                  "flash_attention.flash_attention_triton", "cross_entropy.linear_cross_entropy_triton")
    got, got_grads = step(torch.compile(model._forward, backend="aot_eager"))
    assert not compiling["graph_break"], dict(compiling["graph_break"])
    assert all(calls.counts.values()), calls.counts  # traced through every kernel
    assert_close("loss", want, got)
    assert set(got_grads) == set(want_grads)
    for name, g in want_grads.items():
        assert_close(f"grad {name}", g, got_grads[name])


def test_a_compiled_model_is_not_compiled_again_on_its_next_steps(compiling, registry):
    """Python state a module fills in its forward (RoPE's angle cache) fails the next call's guards:
    every compiled cell then compiled twice. Three steps, one graph."""
    from abl.model.decoder import ForwardContext

    from .test_kernels_wiring import build

    model = build(registry, "mha", "rope", backend="triton")
    idx = torch.randint(0, 50, (2, 24))
    targets = torch.randint(0, 50, (2, 24))
    forward = torch.compile(model._forward, backend="aot_eager")
    for _ in range(3):
        with model.kernel_backend.activate():
            _, loss, _ = forward(idx, targets, ForwardContext(position=model.position, need_logits=False))
        loss.backward()
    assert not compiling["graph_break"], dict(compiling["graph_break"])
    assert compiling["stats"]["unique_graphs"] == 1, dict(compiling["stats"])
