import dataclasses
import itertools

import pytest
import torch

from abl.contracts.config import ModelConfig
from abl.contracts.hookspecs import hookimpl
from abl.contracts.plugin_manager import build_registry, pm
from abl.model.decoder import DecoderLM, ForwardContext


def components(norm="rmsnorm", block="pre", position="rope", mixer="mha", ffn="gelu", registry=None):
    out = {}
    for axis, name in (("norm", norm), ("block", block), ("position", position), ("mixer", mixer),
                       ("ffn", ffn)):
        comp = registry.get(axis, name)
        out[axis] = {"name": name, "params": {k: p.default for k, p in comp.params.items()}}
    return out


@pytest.mark.parametrize("norm,block,position,ffn", list(itertools.product(
    ["layernorm", "rmsnorm", "scalenorm", "none"], ["pre", "post", "sandwich", "post_branch"],
    ["rope", "learned"], ["gelu", "swiglu"]))[::3])
def test_every_combination_builds_and_backprops(registry, tiny_model_config, norm, block, position, ffn):
    torch.manual_seed(0)
    # a small init keeps the logits near uniform (the default 1/sqrt(d_model) starts them at std ~1)
    cfg = dataclasses.replace(tiny_model_config, init_std=0.02)
    model = DecoderLM(cfg, components(norm, block, position, "mha", ffn, registry), registry)
    idx, targets = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    logits, loss, _ = model(idx, targets)
    assert logits.shape == (2, 16, 64)
    assert abs(float(loss) - torch.log(torch.tensor(64.0)).item()) < 0.5  # near-uniform at init
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_weight_tying_and_param_counts(registry, tiny_model_config):
    comps = components(registry=registry)
    tied = DecoderLM(tiny_model_config, comps, registry)
    assert tied.lm_head.weight is tied.embed.weight
    untied_cfg = ModelConfig(**{**tiny_model_config.__dict__, "tie_embeddings": False})
    untied = DecoderLM(untied_cfg, comps, registry)
    assert untied.n_params() - tied.n_params() == 64 * 32
    assert tied.n_params(non_embedding=True) == untied.n_params(non_embedding=True)


def test_post_layout_has_no_final_norm(registry, tiny_model_config):
    m = DecoderLM(tiny_model_config, components(block="post", registry=registry), registry)
    assert isinstance(m.final_norm, torch.nn.Identity)
    m = DecoderLM(tiny_model_config, components(block="pre", registry=registry), registry)
    assert not isinstance(m.final_norm, torch.nn.Identity)


def test_model_is_causal(registry, tiny_model_config):
    torch.manual_seed(0)
    m = DecoderLM(tiny_model_config, components(registry=registry), registry)
    a = torch.randint(0, 64, (1, 16))
    b = a.clone()
    b[0, 10:] = (b[0, 10:] + 1) % 64
    torch.testing.assert_close(m(a)[0][:, :10], m(b)[0][:, :10])


def test_aux_losses_reported_by_a_component_join_the_loss(tiny_model_config):
    class AuxFFN(torch.nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.lin = torch.nn.Linear(cfg.d_model, cfg.d_model)

        def forward(self, x, ctx=None):
            ctx.add_aux_loss("test_aux", x.pow(2).mean() * 0 + 0.25)
            ctx.add_metric("test_metric", 1.5)
            return self.lin(x)

    class Plugin:
        @hookimpl
        def register_components(self, register):
            register("ffn", "aux_ffn", AuxFFN)

    pm.register(Plugin(), name="aux-test")
    try:
        reg = build_registry()
        m = DecoderLM(tiny_model_config, components(ffn="aux_ffn", registry=reg), reg)
        idx = torch.randint(0, 64, (1, 16))
        ctx = ForwardContext(position=m.position)
        _, loss, ctx = m(idx, idx, ctx)
        # one aux loss per layer, accumulated under its name
        assert float(loss) == pytest.approx(float(ctx.metrics["ce_loss"]) + 0.25 * 2, abs=1e-5)
        assert ctx.metrics["test_metric"] == 1.5
    finally:
        pm.unregister(name="aux-test")


def test_residual_projections_get_scaled_init(registry):
    cfg = ModelConfig(d_model=64, n_layers=8, n_heads=4, context=16, vocab_size=64, init_std=0.02)
    m = DecoderLM(cfg, components(registry=registry), registry)
    out_std = m.blocks[0].mixer.out_proj.weight.std().item()
    q_std = m.blocks[0].mixer.q_proj.weight.std().item()
    assert out_std == pytest.approx(0.02 / 4, rel=0.15)
    assert q_std == pytest.approx(0.02, rel=0.15)


# ------------------------------------------------------------ KVCache: the decode-cache helper for any mixer


def test_kv_cache_passes_through_in_training():
    from abl.model.decoder import KVCache

    ctx = ForwardContext(position=None, start=0)
    k = torch.randn(1, 2, 5, 4)
    cache = KVCache(ctx)
    assert not cache.enabled
    tensors, start = cache.append(k=k, window=2)
    assert tensors["k"] is k and start == 0
    assert cache.state() is None
    cache.set_state(s=k)  # nothing to keep it in
    assert ctx.cache is None


def test_kv_cache_appends_keeps_a_window_and_restarts_on_a_prefill():
    from abl.model.decoder import KVCache

    cache: dict = {}
    seq = torch.arange(8.0).view(1, 1, 8, 1)
    kv, start = KVCache(ForwardContext(position=None, cache=cache, layer=3)).append(k=seq[:, :, :5], window=3)
    assert start == 0 and kv["k"].flatten().tolist() == [0, 1, 2, 3, 4]  # all of the prefill comes back
    assert cache[3]["k"].flatten().tolist() == [2, 3, 4] and cache[3]["start"] == 2  # the last 3 are kept
    for t in range(5, 8):
        kv, start = KVCache(ForwardContext(position=None, cache=cache, layer=3, start=t)).append(
            k=seq[:, :, t:t + 1], window=3)
        assert start == t - 3 and kv["k"].flatten().tolist() == list(range(t - 3, t + 1))
    assert cache[3]["k"].flatten().tolist() == [5, 6, 7] and cache[3]["k"].is_contiguous()
    # start = 0 is a new sequence, whatever the dict held
    kv, start = KVCache(ForwardContext(position=None, cache=cache, layer=3)).append(k=seq[:, :, :2])
    assert start == 0 and cache[3]["k"].flatten().tolist() == [0, 1]
    with pytest.raises(ValueError, match="reserved"):
        KVCache(ForwardContext(position=None, cache=cache)).append(start=seq)


def test_kv_cache_recurrent_state():
    from abl.model.decoder import KVCache

    cache: dict = {}
    s = torch.ones(2, 2)
    assert KVCache(ForwardContext(position=None, cache=cache)).state() is None
    KVCache(ForwardContext(position=None, cache=cache, layer=1)).set_state(S=s)
    assert KVCache(ForwardContext(position=None, cache=cache, layer=1, start=4)).state() == {"S": s}
    assert KVCache(ForwardContext(position=None, cache=cache, layer=1, start=0)).state() is None  # a prefill


class WindowAttention(torch.nn.Module):
    """A third-party mixer: one-head sliding-window attention, decoding through KVCache only."""

    def __init__(self, cfg, position, window: int = 3):
        super().__init__()
        self.window = window
        self.qkv = torch.nn.Linear(cfg.d_model, 3 * cfg.d_model)

    def forward(self, x, ctx):
        from abl.model.decoder import KVCache

        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)
        kv, k_start = KVCache(ctx).append(k=k, v=v, window=self.window)
        qpos = torch.arange(ctx.start, ctx.start + x.size(1))[:, None]
        kpos = torch.arange(k_start, k_start + kv["k"].size(-2))[None, :]
        mask = (kpos <= qpos) & (kpos > qpos - self.window)
        y = torch.nn.functional.scaled_dot_product_attention(q, kv["k"], kv["v"], attn_mask=mask)
        return y.squeeze(1)


def test_a_third_party_mixer_decodes_with_kv_cache_like_it_recomputes(registry, tiny_model_config):
    from abl.contracts.registry import Registry
    from abl.model.decode import cache_bytes, greedy_generate, recompute_generate

    reg = Registry(components=dict(registry.components))
    reg.register("mixer", "window3", WindowAttention)
    torch.manual_seed(0)
    model = DecoderLM(tiny_model_config, components(mixer="window3", registry=reg), reg).eval()
    prompt = torch.randint(0, 64, (1, 4))
    gen = greedy_generate(model, prompt, 8)
    assert torch.equal(gen.tokens, recompute_generate(model, prompt, 8))
    # K and V of the last 3 tokens per layer: 2 layers x 2 x 3 x d_model fp32
    assert cache_bytes(gen.cache) == 2 * 2 * 3 * tiny_model_config.d_model * 4
