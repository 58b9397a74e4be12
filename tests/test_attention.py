"""Every attention mixer against a separately written reference (per-head loops, explicit T x T).

The references below share no code with plugins/attention.py: they read the
modules' weights and recompute everything position by position. Inputs are
fp64; the comparisons use fp32 tolerances (rtol = atol = 1e-5) because RoPE
computes its rotation in fp32 by design.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from abl.contracts.config import ConfigError, ModelConfig
from abl.grid.gridfile import expand
from abl.model.decoder import ForwardContext, PositionEncoding
from abl.plugins.attention import (
    LinearAttention,
    MultiHeadAttention,
    MultiHeadLatentAttention,
    grouped_query_attention,
    multi_query_attention,
    sliding_window_attention,
)
from abl.plugins.positions import ALiBiPosition, RotaryPosition, T5RelativeBias


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # tiny ops on a shared 2-core machine: threading costs far more than it gives
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def rms(x, w, eps=1e-6):
    return x / torch.sqrt((x * x).mean() + eps) * w


def ref_rotate(x, p, theta=10000.0):
    """One vector x [d] at position p, interleaved pairs, by 2x2 rotations (Su et al. 2021, RoFormer, arXiv:2104.09864, sec. 3.2)."""
    out = x.clone()
    d = x.numel()
    for k in range(d // 2):
        a = p * theta ** (-2 * k / d)
        c, s = math.cos(a), math.sin(a)
        out[2 * k] = x[2 * k] * c - x[2 * k + 1] * s
        out[2 * k + 1] = x[2 * k] * s + x[2 * k + 1] * c
    return out


def ref_bias(kind, h, n_heads, i, j, pos):
    """The additive score bias of query position i on key position j, written out per pair."""
    if kind == "alibi":
        slope = pos.slopes[h].item()
        return -slope * (i - j)
    if kind == "t5":
        n = max(i - j, 0)
        if n < 16:
            bucket = n
        else:
            bucket = min(31, 16 + int(math.log(n / 16) / math.log(128 / 16) * 16))
        return pos.bias.weight[bucket, h]
    return 0.0


def reference_softmax(attn, x, rope=False, bias_kind=None, pos=None, window=0):
    """Per batch row, per head, per (i, j) pair: q.k / sqrt(d) (+ cap, + bias), softmax, @ v."""
    b, t, d = x.shape
    hq, hk, dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    wq, wkv = attn.q_proj.weight, attn.kv_proj.weight
    bq = attn.q_proj.bias if attn.q_proj.bias is not None else torch.zeros(hq * dh, dtype=x.dtype)
    bkv = attn.kv_proj.bias if attn.kv_proj.bias is not None else torch.zeros(2 * hk * dh, dtype=x.dtype)
    out = torch.zeros(b, t, hq * dh, dtype=x.dtype)
    for bi in range(b):
        for h in range(hq):
            g = h // (hq // hk)  # the KV group query head h reads
            qs, ks, vs = (slice(n * dh, (n + 1) * dh) for n in (h, g, hk + g))
            q = x[bi] @ wq[qs].T + bq[qs]
            k = x[bi] @ wkv[ks].T + bkv[ks]
            v = x[bi] @ wkv[vs].T + bkv[vs]
            if attn.q_norm is not None:
                q = torch.stack([rms(q[i], attn.q_norm.weight) for i in range(t)])
                k = torch.stack([rms(k[i], attn.k_norm.weight) for i in range(t)])
            if rope:
                q = torch.stack([ref_rotate(q[i], i) for i in range(t)])
                k = torch.stack([ref_rotate(k[i], i) for i in range(t)])
            scores = torch.full((t, t), float("-inf"), dtype=x.dtype)
            for i in range(t):
                for j in range(i + 1):
                    if window and j <= i - window:
                        continue
                    s = (q[i] @ k[j]) / math.sqrt(dh)
                    if attn.softcap:
                        s = attn.softcap * torch.tanh(s / attn.softcap)
                    scores[i, j] = s + ref_bias(bias_kind, h, hq, i, j, pos)
            out[bi, :, h * dh:(h + 1) * dh] = torch.softmax(scores, dim=-1) @ v
    y = out @ attn.out_proj.weight.T
    return y if attn.out_proj.bias is None else y + attn.out_proj.bias


CFG = ModelConfig(d_model=32, n_heads=4, context=7)
FP32 = {"rtol": 1e-5, "atol": 1e-5}


def run(mod, x, pos):
    return mod(x, ForwardContext(position=pos))


def close(a, b):
    torch.testing.assert_close(a, b, **FP32)


@pytest.mark.parametrize("n_kv", [4, 2, 1], ids=["mha", "gqa2", "mqa"])
@pytest.mark.parametrize("use_rope", [False, True], ids=["nope", "rope"])
def test_attention_matches_reference(n_kv, use_rope):
    torch.manual_seed(0)
    pos = RotaryPosition(CFG) if use_rope else PositionEncoding()
    attn = MultiHeadAttention(CFG, pos, n_kv_heads=n_kv).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    close(run(attn, x, pos), reference_softmax(attn, x, rope=use_rope))


@pytest.mark.parametrize("factory,n_kv", [(multi_query_attention, 1), (grouped_query_attention, 2)],
                         ids=["mqa", "gqa"])
def test_registered_mqa_gqa_are_the_grouped_attention(factory, n_kv):
    torch.manual_seed(1)
    pos = PositionEncoding()
    attn = factory(CFG, pos).double()
    assert attn.n_kv_heads == n_kv
    x = torch.randn(1, 7, 32, dtype=torch.float64)
    close(run(attn, x, pos), reference_softmax(attn, x))


@pytest.mark.parametrize("window", [1, 3, 7])
@pytest.mark.parametrize("n_kv", [4, 2])
def test_sliding_window_matches_reference(window, n_kv):
    torch.manual_seed(2)
    pos = RotaryPosition(CFG)
    attn = sliding_window_attention(CFG, pos, window=window, n_kv_heads=n_kv).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    close(run(attn, x, pos), reference_softmax(attn, x, rope=True, window=window))


@pytest.mark.parametrize("kind", ["alibi", "t5"])
@pytest.mark.parametrize("window", [0, 3])
def test_score_bias_positions_match_reference(kind, window):
    torch.manual_seed(3)
    pos = (ALiBiPosition(CFG) if kind == "alibi" else T5RelativeBias(CFG)).double()
    if kind == "t5":
        torch.nn.init.normal_(pos.bias.weight, std=1.0)
    attn = MultiHeadAttention(CFG, pos, n_kv_heads=2, window=window).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    close(run(attn, x, pos),
                               reference_softmax(attn, x, bias_kind=kind, pos=pos, window=window))


def test_t5_far_distances_reach_the_log_buckets():
    """Past 16 tokens T5 uses the log-spaced buckets; the reference above covers them too."""
    torch.manual_seed(4)
    cfg = ModelConfig(d_model=16, n_heads=2, context=40)
    pos = T5RelativeBias(cfg).double()
    torch.nn.init.normal_(pos.bias.weight, std=1.0)
    attn = MultiHeadAttention(cfg, pos).double()
    x = torch.randn(1, 40, 16, dtype=torch.float64)
    close(run(attn, x, pos), reference_softmax(attn, x, bias_kind="t5", pos=pos))


@pytest.mark.parametrize("qk_norm,softcap,bias", [(True, 0.0, False), (False, 0.5, False), (True, 0.7, True)],
                         ids=["qknorm", "softcap", "both+bias"])
def test_optional_extras_match_reference(qk_norm, softcap, bias):
    torch.manual_seed(5)
    pos = RotaryPosition(CFG)
    attn = MultiHeadAttention(CFG, pos, n_kv_heads=2, qk_norm=qk_norm, softcap=softcap, bias=bias).double()
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # norm gains and biases away from their 1 / 0 init
    x = torch.randn(2, 7, 32, dtype=torch.float64) * 3
    close(run(attn, x, pos), reference_softmax(attn, x, rope=True))


def test_attention_is_causal():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_heads=2)
    pos = PositionEncoding()
    attn = MultiHeadAttention(cfg, pos)
    x = torch.randn(1, 6, 16)
    x2 = x.clone()
    x2[:, 4:] = torch.randn(1, 2, 16)
    y, y2 = attn(x, ForwardContext(position=pos)), attn(x2, ForwardContext(position=pos))
    torch.testing.assert_close(y[:, :4], y2[:, :4])
    assert not torch.allclose(y[:, 4:], y2[:, 4:])


class TinyBias(PositionEncoding):
    def score_bias(self, n_heads, q_len, k_len, q_start, k_start, device):
        i = torch.arange(q_len)[:, None]
        j = torch.arange(k_len)[None, :]
        return (-(i - j).abs().float() * torch.arange(1, n_heads + 1).float()[:, None, None])


def test_score_bias_interface_reaches_the_scores():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_heads=2)
    attn = MultiHeadAttention(cfg, PositionEncoding())
    x = torch.randn(1, 5, 16)
    plain = attn(x, ForwardContext(position=PositionEncoding()))
    biased = attn(x, ForwardContext(position=TinyBias()))
    assert not torch.allclose(plain, biased)
    assert torch.allclose(plain[:, 0], biased[:, 0], atol=1e-6)  # first token sees only itself


# ------------------------------------------------------------ linear attention


def reference_linear(attn, x, rope=False):
    """Katharopoulos et al. eq. (9), one position at a time; with RoPE as RoFormer eq. (19)."""
    b, t, _ = x.shape
    h, dh = attn.n_heads, attn.head_dim
    w = attn.qkv_proj.weight
    out = torch.zeros(b, t, h * dh, dtype=x.dtype)
    phi = lambda z: torch.where(z > 0, z + 1, torch.exp(z))  # noqa: E731  elu(z) + 1
    for bi in range(b):
        for hh in range(h):
            q = phi(x[bi] @ w[hh * dh:(hh + 1) * dh].T)
            k = phi(x[bi] @ w[(h + hh) * dh:(h + hh + 1) * dh].T)
            v = x[bi] @ w[(2 * h + hh) * dh:(2 * h + hh + 1) * dh].T
            for i in range(t):
                num = torch.zeros(dh, dtype=x.dtype)
                den = 0.0
                for j in range(i + 1):
                    qi, kj = (ref_rotate(q[i], i), ref_rotate(k[j], j)) if rope else (q[i], k[j])
                    num = num + (qi @ kj) * v[j]
                    den = den + q[i] @ k[j]
                out[bi, i, hh * dh:(hh + 1) * dh] = num / (den + attn.eps)
    return out @ attn.out_proj.weight.T


@pytest.mark.parametrize("chunk", [1, 3, 4, 64])
@pytest.mark.parametrize("use_rope", [False, True], ids=["nope", "rope"])
def test_linear_attention_matches_reference(chunk, use_rope):
    torch.manual_seed(6)
    pos = RotaryPosition(CFG) if use_rope else PositionEncoding()
    attn = LinearAttention(CFG, pos, chunk_size=chunk).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    close(run(attn, x, pos), reference_linear(attn, x, rope=use_rope))


def test_linear_recurrent_decode_equals_chunked_training_form():
    torch.manual_seed(7)
    pos = RotaryPosition(CFG)
    attn = LinearAttention(CFG, pos, chunk_size=3).double()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    full = run(attn, x, pos)
    cache = {}
    steps = [attn(x[:, :4], ForwardContext(position=pos, cache=cache, start=0))]
    for i in range(4, 9):
        steps.append(attn(x[:, i:i + 1], ForwardContext(position=pos, cache=cache, start=i)))
        assert set(cache[0]) == {"S", "z"} and cache[0]["S"].shape == (2, 4, 8, 8)  # O(1) state
    close(torch.cat(steps, dim=1), full)


def test_linear_attention_refuses_a_score_bias():
    pos = ALiBiPosition(CFG)
    with pytest.raises(ValueError, match="no score matrix"):
        run(LinearAttention(CFG, pos), torch.randn(1, 4, 32), pos)


@pytest.mark.parametrize("position", ["alibi", "t5"])
def test_config_check_rejects_linear_with_a_score_bias(registry, position):
    raw = {"experiment": {"name": "x"}, "model": {"mixer": "linear", "position": position}}
    with pytest.raises(ConfigError, match="linear attention does not form"):
        expand(raw, registry)


# ------------------------------------------------------------ MLA


def reference_mla(attn, x, rope):
    """DeepSeek-V2 eqs. (9)-(19), per head and per (i, j) pair, from the module's weights."""
    b, t, _ = x.shape
    h, dn, dr, dv, r = attn.n_heads, attn.nope_dim, attn.rope_dim, attn.v_dim, attn.kv_rank
    wq = attn.q_up.weight.view(h, dn + dr, -1)
    wdkv = attn.kv_down.weight
    wuk = attn.kv_up.weight.view(h, dn + dv, r)[:, :dn]
    wuv = attn.kv_up.weight.view(h, dn + dv, r)[:, dn:]
    out = torch.zeros(b, t, h * dv, dtype=x.dtype)
    for bi in range(b):
        cq = [x[bi, i] for i in range(t)]
        if not isinstance(attn.q_down, torch.nn.Identity):
            cq = [rms(attn.q_down.weight @ x[bi, i], attn.q_norm.weight) for i in range(t)]
        ckv = [rms(wdkv[:r] @ x[bi, i], attn.kv_norm.weight) for i in range(t)]
        kr = [wdkv[r:] @ x[bi, i] for i in range(t)]
        if rope:
            kr = [ref_rotate(kr[i], i) for i in range(t)]
        for hh in range(h):
            scores = torch.full((t, t), float("-inf"), dtype=x.dtype)
            for i in range(t):
                q = wq[hh] @ cq[i]
                qc, qr = q[:dn], ref_rotate(q[dn:], i) if rope else q[dn:]
                for j in range(i + 1):
                    kc = wuk[hh] @ ckv[j]
                    scores[i, j] = (qc @ kc + qr @ kr[j]) / math.sqrt(dn + dr)
            p = torch.softmax(scores, dim=-1)
            for i in range(t):
                out[bi, i, hh * dv:(hh + 1) * dv] = sum(p[i, j] * (wuv[hh] @ ckv[j]) for j in range(i + 1))
    return out @ attn.out_proj.weight.T


@pytest.mark.parametrize("q_rank", [0, 12], ids=["no_q_compression", "q_rank12"])
@pytest.mark.parametrize("use_rope", [False, True], ids=["nope", "rope"])
def test_mla_matches_reference(q_rank, use_rope):
    torch.manual_seed(8)
    pos = RotaryPosition(CFG) if use_rope else PositionEncoding()
    attn = MultiHeadLatentAttention(CFG, pos, kv_rank=10, q_rank=q_rank, rope_dim=4).double()
    with torch.no_grad():
        for m in (attn.kv_norm, attn.q_norm):
            if hasattr(m, "weight"):
                m.weight.add_(torch.randn_like(m.weight) * 0.3)
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    close(run(attn, x, pos), reference_mla(attn, x, use_rope))


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_mla_absorbed_decoding_equals_the_expanded_form(position):
    """Decoding attends over the cached latent with W_UK / W_UV absorbed (DeepSeek-V2 sec. 2.1.2)."""
    torch.manual_seed(9)
    pos = (RotaryPosition(CFG) if position == "rope" else ALiBiPosition(CFG)).double()
    attn = MultiHeadLatentAttention(CFG, pos, kv_rank=10, rope_dim=4).double()
    x = torch.randn(2, 8, 32, dtype=torch.float64)
    full = run(attn, x, pos)
    cache = {}
    steps = [attn(x[:, :3], ForwardContext(position=pos, cache=cache, start=0))]
    for i in range(3, 8):
        steps.append(attn(x[:, i:i + 1], ForwardContext(position=pos, cache=cache, start=i)))
    assert set(cache[0]) == {"c_kv", "k_r", "start"}
    assert cache[0]["c_kv"].shape == (2, 1, 8, 10) and cache[0]["k_r"].shape == (2, 1, 8, 4)
    close(torch.cat(steps, dim=1), full)


# ------------------------------------------------------------ registered costs


def _flops_math_backend(mod, x, pos):
    """FLOPs as torch.utils.flop_counter counts them, with SDPA's math decomposition made visible."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc, torch.no_grad():
        mod(x, ForwardContext(position=pos))
    return fc.get_total_flops()


@pytest.mark.parametrize("name,params", [
    ("mha", {}), ("mha", {"n_kv_heads": 2, "bias": True, "qk_norm": True}), ("mqa", {}), ("gqa", {}),
    ("sliding_window", {"window": 5}), ("linear", {"chunk_size": 4}), ("linear", {"chunk_size": 5}),
    ("mla", {}), ("mla", {"q_rank": 12, "kv_rank": 10, "rope_dim": 4}),
])
def test_registered_cost_matches_the_module(registry, name, params):
    cfg = ModelConfig(d_model=32, n_heads=4, context=16)
    comp = registry.get("mixer", name)
    full, _ = comp.resolve_params(params, name)
    pos = RotaryPosition(cfg)
    mod = comp.factory(cfg, pos, **full)
    cost = comp.cost(cfg, **full)
    assert cost.params == sum(p.numel() for p in mod.parameters())
    measured = _flops_math_backend(mod, torch.randn(1, 16, 32), pos)
    assert cost.flops_per_token == pytest.approx(measured / 16)
    assert cost.useful <= cost.flops_per_token


def test_kv_state_elements_follow_the_heads(registry):
    cfg = ModelConfig(d_model=32, n_heads=4, context=16)
    per_tok = {n: registry.get("mixer", n).cost(cfg, **registry.get("mixer", n).resolve_params({}, n)[0])
               for n in ("mha", "gqa", "mqa", "mla", "linear")}
    assert per_tok["mha"].state_elements_per_token == 2 * 4 * 8
    assert per_tok["mqa"].state_elements_per_token == per_tok["mha"].state_elements_per_token / 4
    assert per_tok["gqa"].state_elements_per_token == per_tok["mha"].state_elements_per_token / 2
    assert per_tok["mla"].state_elements_per_token == 4 * 8 + 4  # kv_rank + rope_dim
    assert per_tok["linear"].state_elements_per_token == 0
    assert per_tok["linear"].state_elements_per_sequence == 4 * (8 * 8 + 8)  # S and z per head
    sw = registry.get("mixer", "sliding_window").cost(cfg, window=5, n_kv_heads=0, bias=False,
                                                      qk_norm=False, softcap=0.0)
    assert sw.state_elements_per_token == 0 and sw.state_elements_per_sequence == 2 * 4 * 8 * 5


# ------------------------------------------------------------ what the plugin reaches for


def test_the_host_hands_cost_and_check_functions_the_configured_position(registry):
    """The attention plugin once asked the plugin manager for the position; now the host hands it in."""
    assert registry.position_class(ModelConfig(position="alibi")) is ALiBiPosition
    assert registry.position_class(ModelConfig(position="no-such-position")) is None
    seen = []

    def cost(cfg, position=None):
        seen.append(position)

    def no_position(cfg, **params):  # a function that does not name it gets no stray keyword
        seen.append(params)

    registry.call_with_position(cost, ModelConfig(position="rope"))
    registry.call_with_position(no_position, ModelConfig(position="rope"), a=1)
    assert seen == [RotaryPosition, {"a": 1}]
    mha = registry.get("mixer", "mha")
    params = mha.resolve_params({}, "mha")[0]
    rope, nope = (registry.call_with_position(mha.cost, ModelConfig(position=p), **params)
                  for p in ("rope", "nope"))
    assert rope.activation_elements_per_token > nope.activation_elements_per_token  # rotated q and k kept
    alibi = registry.call_with_position(mha.cost, ModelConfig(position="alibi"), **params)
    assert alibi.activation_elements_per_token > nope.activation_elements_per_token  # probabilities kept
    linear = registry.get("mixer", "linear")
    lp = linear.resolve_params({}, "linear")[0]
    assert registry.call_with_position(linear.check, ModelConfig(position="alibi"), lp)
    assert not registry.call_with_position(linear.check, ModelConfig(position="rope"), lp)
