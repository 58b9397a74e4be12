"""Mamba and Mamba-2: parallel / chunked scans against the sequential recurrence, the blocks
against step-by-step references written here, cached decoding against full recomputation."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from abl.contracts.config import ConfigError, ModelConfig
from abl.grid.gridfile import expand
from abl.kernels.ssd_scan import segsum, ssd_chunked, ssd_sequential, ssd_step
from abl.model.decoder import DecoderLM, ForwardContext, PositionEncoding
from abl.plugins.ssm import LinearScan, Mamba, Mamba2, selective_scan, selective_scan_sequential
from tests.kernels.helpers import triton_device

f64 = torch.float64


def _grads(out, inputs, seed=1):
    """Gradients of <out, random> w.r.t. inputs (a random output gradient, as fla's tests do)."""
    gen = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() for o in out)
    return torch.autograd.grad(loss, inputs)


# ---------------------------------------------------------------- Mamba-2 SSD scan


def ssd_inputs(b=2, t=37, h=4, p=3, g=2, n=5, seed=0):
    torch.manual_seed(seed)
    x = torch.randn(b, t, h, p, dtype=f64)
    dt = F.softplus(torch.randn(b, t, h, dtype=f64))
    A = -torch.rand(h, dtype=f64) * 2
    Bm, Cm = torch.randn(b, t, g, n, dtype=f64), torch.randn(b, t, g, n, dtype=f64)
    h0 = torch.randn(b, h, p, n, dtype=f64)
    return [v.requires_grad_() for v in (x, dt, A, Bm, Cm, h0)]


def test_segsum_is_the_sum_between_positions():
    a = torch.randn(2, 6, dtype=f64)
    out = segsum(a)
    for i in range(6):
        for j in range(6):
            want = a[:, j + 1:i + 1].sum(-1) if i >= j else torch.full((2,), float("-inf"), dtype=f64)
            torch.testing.assert_close(out[:, i, j], want)


@pytest.mark.parametrize("chunk", [1, 4, 8, 16, 37, 64], ids=lambda c: f"L{c}")
@pytest.mark.parametrize("with_state", [False, True], ids=["h0=0", "h0"])
def test_chunked_ssd_equals_sequential_recurrence(chunk, with_state):
    """B2-T37-H4-P3-G2-N5: T = 37 is a multiple of none of the chunk lengths but 1 and 37."""
    x, dt, A, Bm, Cm, h0 = ssd_inputs()
    init = h0 if with_state else None
    y, last = ssd_chunked(x, dt, A, Bm, Cm, chunk, init)
    y_ref, last_ref = ssd_sequential(x, dt, A, Bm, Cm, init)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(last, last_ref)
    inputs = [x, dt, A, Bm, Cm] + ([h0] if with_state else [])
    for g, g_ref in zip(_grads((y, last), inputs), _grads((y_ref, last_ref), inputs)):
        torch.testing.assert_close(g, g_ref)


def test_ssd_step_is_one_step_of_the_recurrence():
    x, dt, A, Bm, Cm, h0 = ssd_inputs(t=1, g=1)
    y, h = ssd_step(x[:, 0], dt[:, 0], A, Bm[:, 0], Cm[:, 0], h0)
    want_h = torch.exp(dt[:, 0] * A)[..., None, None] * h0 + \
        (dt[:, 0, :, None] * x[:, 0])[..., None] * Bm[:, 0, :, None, :]
    torch.testing.assert_close(h, want_h)
    torch.testing.assert_close(y, (want_h * Cm[:, 0, :, None, :]).sum(-1))


# ---------------------------------------------------------------- Mamba-1 selective scan


@pytest.mark.parametrize("t", [1, 2, 7, 37, 64])
def test_mamba_parallel_scan_equals_the_loop(t):
    torch.manual_seed(t)
    b, e, n = 2, 6, 4
    u, dt = torch.randn(b, t, e, dtype=f64), F.softplus(torch.randn(b, t, e, dtype=f64))
    A = -torch.rand(e, n, dtype=f64)
    Bm, Cm = torch.randn(b, t, n, dtype=f64), torch.randn(b, t, n, dtype=f64)
    h0 = torch.randn(b, e, n, dtype=f64)
    inputs = [v.requires_grad_() for v in (u, dt, A, Bm, Cm, h0)]
    y, last = selective_scan(*inputs)
    y_ref, last_ref = selective_scan_sequential(*inputs)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(last, last_ref)
    for g, g_ref in zip(_grads((y, last), inputs), _grads((y_ref, last_ref), inputs)):
        torch.testing.assert_close(g, g_ref)


def test_linear_scan_gradcheck():
    a = torch.rand(2, 11, 3, dtype=f64, requires_grad=True)
    b = torch.randn(2, 11, 3, dtype=f64, requires_grad=True)
    assert torch.autograd.gradcheck(LinearScan.apply, (a, b))


# ---------------------------------------------------------------- the blocks vs step-by-step references

CFG = ModelConfig(d_model=16, n_heads=2, context=12)


def _conv_loop(xs, conv):
    """Causal depthwise conv, one tap at a time: c_t = b + sum_k w_k x_{t-K+1+k}, x_{<0} = 0."""
    k, t = conv.kernel_size[0], xs.size(1)
    out = torch.zeros_like(xs) + (0 if conv.bias is None else conv.bias)
    for i in range(t):
        for j in range(k):
            src = i - (k - 1) + j
            if src >= 0:
                out[:, i] += conv.weight[:, 0, j] * xs[:, src]
    return out


def reference_mamba(m, x):
    """Seeds 003 algorithms 4 and 5, the recurrence (5.1) one position at a time."""
    e, n, r = m.d_inner, m.d_state, m.dt_rank
    w = m.in_proj.weight
    x1, x0 = x @ w[:e].T, x @ w[e:].T             # conv branch, gate branch
    x3 = F.silu(_conv_loop(x1, m.conv))
    proj = x3 @ m.x_proj.weight.T
    dt = F.softplus(proj[..., :r] @ m.dt_proj.weight.T + m.dt_proj.bias)
    Bm, Cm = proj[..., r:r + n], proj[..., r + n:]
    A = -torch.exp(m.A_log)
    h = torch.zeros(x.size(0), e, n, dtype=x.dtype)
    ys = []
    for t in range(x.size(1)):
        h = torch.exp(dt[:, t, :, None] * A) * h + (dt[:, t] * x3[:, t])[:, :, None] * Bm[:, t, None, :]
        ys.append((h * Cm[:, t, None, :]).sum(-1) + m.D * x3[:, t])
    y = torch.stack(ys, 1) * F.silu(x0)
    return y @ m.out_proj.weight.T


def reference_mamba2(m, x):
    """Seeds 003 algorithms 6 and 7, one position and one head at a time, then the gated RMSNorm."""
    e, g, n, hds, p = m.d_inner, m.n_groups, m.d_state, m.n_heads, m.head_dim
    proj = x @ m.in_proj.weight.T
    z, xbc, dt = proj[..., :e], proj[..., e:2 * e + 2 * g * n], proj[..., 2 * e + 2 * g * n:]
    xbc = F.silu(_conv_loop(xbc, m.conv))
    xs, Bm, Cm = xbc[..., :e], xbc[..., e:e + g * n], xbc[..., e + g * n:]
    dt = F.softplus(dt + m.dt_bias)
    A = -torch.exp(m.A_log)
    b, T = x.shape[:2]
    y = torch.zeros(b, T, e, dtype=x.dtype)
    for a in range(hds):
        grp = a // (hds // g)
        h = torch.zeros(b, p, n, dtype=x.dtype)
        for t in range(T):
            xa = xs[:, t, a * p:(a + 1) * p]
            Bt, Ct = Bm[:, t, grp * n:(grp + 1) * n], Cm[:, t, grp * n:(grp + 1) * n]
            decay = torch.exp(dt[:, t, a] * A[a])[:, None, None]
            h = decay * h + dt[:, t, a, None, None] * xa[:, :, None] * Bt[:, None, :]
            y[:, t, a * p:(a + 1) * p] = (h * Ct[:, None, :]).sum(-1) + m.D[a] * xa
    yz = y * F.silu(z)
    groups = yz.view(b, T, g, e // g)
    normed = groups / torch.sqrt(groups.pow(2).mean(-1, keepdim=True) + m.norm.eps)
    return (normed.view(b, T, e) * m.norm.weight) @ m.out_proj.weight.T


def test_mamba_block_matches_reference():
    torch.manual_seed(0)
    m = Mamba(CFG, d_state=4).double()
    x = torch.randn(2, 9, 16, dtype=f64)
    torch.testing.assert_close(m(x), reference_mamba(m, x))


@pytest.mark.parametrize("groups", [1, 2])
def test_mamba2_block_matches_reference(groups):
    torch.manual_seed(0)
    m = Mamba2(CFG, d_state=4, head_dim=8, n_groups=groups, chunk_size=4).double()
    with torch.no_grad():
        m.norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 10, 16, dtype=f64)  # 10 is not a multiple of the chunk
    torch.testing.assert_close(m(x), reference_mamba2(m, x))


def _blocks():
    torch.manual_seed(0)
    return [Mamba(CFG, d_state=4).double(), Mamba2(CFG, d_state=4, head_dim=8, chunk_size=4).double()]


@pytest.mark.parametrize("block", _blocks(), ids=["mamba", "mamba2"])
def test_blocks_are_causal(block):
    x = torch.randn(1, 10, 16, dtype=f64)
    x2 = x.clone()
    x2[:, 6:] = torch.randn(1, 4, 16, dtype=f64)
    c = ForwardContext(position=PositionEncoding())
    torch.testing.assert_close(block(x, c)[:, :6], block(x2, c)[:, :6])


@pytest.mark.parametrize("block", _blocks(), ids=["mamba", "mamba2"])
def test_cached_steps_and_chunks_equal_the_full_sequence(block):
    x = torch.randn(2, 11, 16, dtype=f64)
    full = block(x, ForwardContext(position=PositionEncoding()))
    cache = {}

    def at(start):
        return ForwardContext(position=PositionEncoding(), cache=cache, start=start, layer=3)

    outs = [block(x[:, :4], at(0))]  # prefill
    shapes = {k: v.shape for k, v in cache[3].items()}
    for i in range(4, 7):  # one token at a time
        outs.append(block(x[:, i:i + 1], at(i)))
        assert {k: v.shape for k, v in cache[3].items()} == shapes  # O(1) state
    outs.append(block(x[:, 7:], at(7)))  # a chunk of several tokens continues from the state
    torch.testing.assert_close(torch.cat(outs, 1), full)


def _components(registry, pattern, ffn="gelu"):
    def spec(axis, name):
        return {"name": name, "params": {k: p.default for k, p in registry.get(axis, name).params.items()}}

    comps = {axis: spec(axis, name) for axis, name in (("norm", "rmsnorm"), ("block", "pre"),
                                                       ("position", "rope"), ("mixer", "mha"), ("ffn", ffn))}
    comps["layer_mixers"] = [spec("mixer", n) for n in pattern]
    return comps


def test_cached_greedy_decoding_equals_full_recomputation(registry):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2, context=32, vocab_size=48)
    model = DecoderLM(cfg, _components(registry, ["mamba", "mamba2"]), registry).double().eval()
    prompt = torch.randint(0, 48, (2, 5))
    with torch.no_grad():
        full = prompt
        for _ in range(8):  # recompute everything every step
            full = torch.cat([full, model(full)[0][:, -1].argmax(-1, keepdim=True)], 1)
        cache = {}
        logits, _, _ = model(prompt, ctx=ForwardContext(position=model.position, cache=cache, start=0))
        cached = prompt
        for _ in range(8):  # prefill once, then one token at a time from the recurrent state
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            ref_logits = model(cached)[0][:, -1]
            torch.testing.assert_close(logits[:, -1], ref_logits)
            cached = torch.cat([cached, nxt], 1)
            logits, _, _ = model(nxt, ctx=ForwardContext(position=model.position, cache=cache,
                                                         start=cached.size(1) - 1))
    assert torch.equal(cached, full)


# ---------------------------------------------------------------- registry, cost, hybrids


def test_dt_init_survives_the_model_init(registry):
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2, context=8, vocab_size=16)
    model = DecoderLM(cfg, _components(registry, ["mamba"]), registry)
    dt = F.softplus(model.blocks[0].mixer.dt_proj.bias)
    assert dt.min() >= 1e-4 - 1e-7 and dt.max() <= 0.1 + 1e-6  # log-uniform in [dt_min, dt_max]


@pytest.mark.parametrize("name,params", [("mamba", {}), ("mamba", {"bias": True, "d_conv": 3}),
                                         ("mamba2", {"chunk_size": 8}),
                                         ("mamba2", {"n_groups": 2, "head_dim": 16, "bias": True})])
def test_cost_matches_module_flop_counter_and_cache(registry, name, params):
    comp = registry.get("mixer", name)
    cfg = ModelConfig(d_model=32, n_heads=4, context=20)  # 20: not a multiple of the chunk (8)
    p = {k: v.default for k, v in comp.params.items()} | params
    m = comp.factory(cfg, None, **p)
    cost = comp.cost(cfg, **p)
    assert cost.params == sum(q.numel() for q in m.parameters())
    x = torch.randn(2, 20, 32)
    with FlopCounterMode(display=False) as fc:
        m(x)
    assert cost.flops_per_token == pytest.approx(fc.get_total_flops() / 40)
    cache = {}
    m(x[:1], ForwardContext(position=PositionEncoding(), cache=cache))
    state = cache[0].values()
    assert cost.state_elements_per_sequence == sum(v.numel() for v in state)
    # nothing else is kept alive: the stored tensors own exactly their elements
    assert sum(v.untyped_storage().nbytes() for v in state) == 4 * cost.state_elements_per_sequence


def test_hybrid_layer_pattern_builds_and_trains(registry):
    raw = {"model": {"d_model": 32, "n_layers": 3, "n_heads": 2, "context": 16, "vocab_size": 40,
                     "layer_pattern": "mamba2,mamba2,mha"},
           "mixer": {"mamba2": {"head_dim": 16, "d_state": 8}}}
    cell = expand(raw, registry).cells[0]
    model = DecoderLM(cell.model, cell.components, registry)
    assert [type(b.mixer).__name__ for b in model.blocks] == ["Mamba2", "Mamba2", "MultiHeadAttention"]
    idx = torch.randint(0, 40, (2, 16))
    _, loss, _ = model(idx, idx)
    assert abs(float(loss.detach()) - math.log(40)) < 0.5
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_mamba2_uses_the_triton_ssd_scan_under_the_triton_backend():
    """The wiring only (the kernel itself: tests/kernels/test_kernels_ssd_scan.py). Runs where the
    kernels can: CUDA, or the interpreter (set up when tests/kernels is collected first)."""
    from abl import kernels

    device = triton_device()
    if device is None:
        pytest.skip("no CUDA device and the Triton interpreter is not active in this process")
    torch.manual_seed(0)
    m = Mamba2(CFG, d_state=16, head_dim=8, chunk_size=16).to(device)
    x = torch.randn(2, 37, 16, device=device, requires_grad=True)
    outs = []
    for name in ("torch", "triton"):
        with kernels.KernelBackend(name).activate():
            y = m(x, ForwardContext(position=PositionEncoding()))
        outs.append((y, *torch.autograd.grad(y.square().sum(), x)))
    for ref, got in zip(*outs):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_mamba2_head_dim_must_divide_the_inner_width(registry):
    with pytest.raises(ConfigError, match="not divisible by head_dim=48"):
        expand({"model": {"d_model": 32, "mixer": "mamba2"}, "mixer": {"mamba2": {"head_dim": 48}}}, registry)


def test_ssm_grid_compares_attention_mamba_mamba2_and_a_hybrid(registry):
    from conftest import ROOT

    from abl.grid.gridfile import load_grid

    grid = load_grid(ROOT / "ablations" / "ssm.toml", registry)
    layers = {tuple(s["name"] for s in c.components["layer_mixers"]) for c in grid.cells}
    assert {("mha",) * 4, ("mamba",) * 4, ("mamba2",) * 4} <= layers
    assert any({"mamba2", "mha"} == set(ls) for ls in layers)
