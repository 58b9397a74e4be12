"""model.logit_scale and model.z_loss (harness/model/decoder.py): the LM head's logit scaling and PaLM's
output z-loss, as config keys of the skeleton; left out of the hashed config at their defaults."""

import math

import pytest
import torch

from abl.contracts.config import ConfigError
from abl.data.tasks import IGNORE_INDEX
from abl.grid.gridfile import expand
from abl.model.decoder import DecoderLM

V = 40


def _cell(registry, **model):
    raw = {"experiment": {"name": "logits"},
           "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 8, "vocab_size": V, **model}}
    return expand(raw, registry).cells[0]


def _model(registry, **model):
    cell = _cell(registry, **model)
    torch.manual_seed(0)
    return DecoderLM(cell.model, cell.components, registry)


def test_inv_sqrt_d_model_divides_the_logits_by_sqrt_d_model(registry):
    plain, scaled = _model(registry), _model(registry, logit_scale="inv_sqrt_d_model")
    x = torch.randint(0, V, (2, 8))
    a, b = plain(x)[0], scaled(x)[0]
    torch.testing.assert_close(b, a / math.sqrt(16))
    _, loss, _ = scaled(x, x)
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(b.reshape(-1, V), x.reshape(-1)))


def test_z_loss_adds_the_mean_squared_log_normaliser_at_scored_positions(registry):
    model = _model(registry, z_loss=1e-2)
    x = torch.randint(0, V, (2, 8))
    y = x.clone()
    y[:, :3] = IGNORE_INDEX
    logits, loss, ctx = model(x, y)
    log_z = torch.logsumexp(logits.float(), -1)[:, 3:]
    want_z = 1e-2 * (log_z ** 2).mean()
    assert float(want_z.detach()) > 0
    torch.testing.assert_close(loss - ctx.metrics["ce_loss"], want_z)
    torch.testing.assert_close(ctx.metrics["log_z_sq"], (log_z ** 2).mean())
    loss.backward()  # the z-loss pulls on the head: its gradient differs from the cross-entropy's alone
    with_z = model.lm_head.weight.grad.clone()
    model.zero_grad()
    model.cfg.z_loss = 0.0
    _, ce, _ = model(x, y)
    ce.backward()
    assert not torch.allclose(with_z, model.lm_head.weight.grad)


def test_defaults_leave_the_hashed_config_and_run_id_as_before(registry):
    base = _cell(registry)
    assert "logit_scale" not in base.config["model"] and "z_loss" not in base.config["model"]
    assert _cell(registry, logit_scale="none", z_loss=0.0).run_id == base.run_id
    other = _cell(registry, z_loss=1e-4)
    assert other.config["model"]["z_loss"] == 1e-4 and other.run_id != base.run_id
    scaled = _cell(registry, logit_scale="inv_sqrt_d_model")
    assert scaled.config["model"]["logit_scale"] == "inv_sqrt_d_model" and scaled.run_id != base.run_id


@pytest.mark.parametrize("model,message", [({"logit_scale": "sqrt"}, "logit_scale must be one of"),
                                           ({"z_loss": -1.0}, "z_loss must be >= 0")])
def test_bad_values_are_refused(registry, model, message):
    with pytest.raises(ConfigError, match=message):
        _cell(registry, **model)


# ---------------------------------------------------------------- final-logit soft-capping (Gemma 2)


def test_logit_softcap_caps_the_logits_as_gemma_2_does(registry):
    """Gemma 2 (arXiv:2408.00118, sec. 2): logits <- c * tanh(logits / c), after the head, before the loss.
    Checked against the uncapped model's logits; a large head makes the cap bite (|logits| > c)."""
    plain, capped = _model(registry), _model(registry, logit_softcap=3.0)
    with torch.no_grad():
        for m in (plain, capped):
            m.lm_head.weight.mul_(2.0)
    x = torch.randint(0, V, (2, 8))
    a, b = plain(x)[0].detach(), capped(x)[0].detach()
    assert float(a.abs().max()) > 3.0 and float(b.abs().max()) < 3.0
    torch.testing.assert_close(b, 3.0 * torch.tanh(a / 3.0))
    _, loss, ctx = capped(x, x)
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(b.reshape(-1, V), x.reshape(-1)))
    # with logit scaling, the cap applies to the scaled logits
    both = _model(registry, logit_softcap=3.0, logit_scale="inv_sqrt_d_model")
    with torch.no_grad():
        both.lm_head.weight.mul_(2.0)
    torch.testing.assert_close(both(x)[0], 3.0 * torch.tanh(a / math.sqrt(16) / 3.0))


def test_logit_softcap_holds_in_cached_decoding(registry):
    """A cached decoding step (the path abl.model.decode takes) reads the same capped logits as a full
    forward over the whole sequence."""
    from abl.model.decoder import ForwardContext

    model = _model(registry, logit_softcap=2.0)
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)
    model.eval()
    seq = torch.randint(0, V, (2, 6))
    with torch.no_grad():
        full = model(seq)[0]
        cache: dict = {}
        model(seq[:, :5], ctx=ForwardContext(position=model.position, start=0, cache=cache))
        step = model(seq[:, 5:], ctx=ForwardContext(position=model.position, start=5, cache=cache))[0]
    assert 1.5 < float(full.abs().max()) < 2.0  # capped, and the cap bites
    torch.testing.assert_close(step[:, -1], full[:, -1], rtol=1e-5, atol=1e-5)


def test_logit_softcap_left_out_at_its_default_and_refused_below_zero(registry):
    base = _cell(registry)
    assert "logit_softcap" not in base.config["model"]
    assert _cell(registry, logit_softcap=0.0).run_id == base.run_id
    capped = _cell(registry, logit_softcap=30.0)
    assert capped.config["model"]["logit_softcap"] == 30.0 and capped.run_id != base.run_id
    with pytest.raises(ConfigError, match="logit_softcap must be >= 0"):
        _cell(registry, logit_softcap=-1.0)


# ---------------------------------------------------------------- embedding scale (Vaswani et al.; Gemma 2)


def test_embed_scale_multiplies_the_token_embeddings_by_sqrt_d_model(registry):
    """Vaswani et al. 2017 sec. 3.4 / Gemma 2: the first block reads sqrt(d_model) x the embedding, before
    the position encoding; the tied LM head keeps the unscaled table."""
    plain, scaled = _model(registry, position="learned"), _model(registry, position="learned",
                                                                   embed_scale="sqrt_d_model")
    x = torch.randint(0, V, (2, 8))
    seen = {}
    for name, m in (("plain", plain), ("scaled", scaled)):
        m.blocks[0].register_forward_pre_hook(lambda mod, args, name=name: seen.__setitem__(name, args[0]))
        m(x)
    pos = plain.position.embed(torch.zeros(2, 8, 16), 0)  # the learned position table alone
    torch.testing.assert_close(seen["scaled"] - pos, (seen["plain"] - pos) * math.sqrt(16))
    torch.testing.assert_close(scaled.lm_head.weight, plain.lm_head.weight)
    base = _cell(registry)
    assert "embed_scale" not in base.config["model"] and _cell(registry, embed_scale="none").run_id == base.run_id
    assert _cell(registry, embed_scale="sqrt_d_model").run_id != base.run_id
    with pytest.raises(ConfigError, match="embed_scale must be one of"):
        _cell(registry, embed_scale="sqrt")


def test_a_soft_capped_head_never_takes_the_fused_uncapped_loss(registry, monkeypatch):
    """Under the Triton backend a loss-only forward fuses the LM head into the loss
    (abl.kernels.cross_entropy.linear_cross_entropy), which never forms the logits and so cannot cap them:
    a capped model must keep the logits. The LM head's backend query is mocked (the fused kernel stubbed),
    so this runs on the CPU; an uncapped model takes the stubbed path, the capped one does not."""
    import abl.kernels.cross_entropy as ce
    import abl.model.head as head
    from abl.model.decoder import ForwardContext

    fused = []
    monkeypatch.setattr(head, "use_triton", lambda *op: True)
    monkeypatch.setattr(ce, "linear_cross_entropy", lambda x, w, t: (fused.append(True), torch.tensor(0.0))[1])
    x = torch.randint(0, V, (2, 8))
    plain = _model(registry)
    plain(x, x, ForwardContext(position=plain.position, need_logits=False))
    assert fused == [True]  # the mocked backend does reach the fused branch
    capped = _model(registry, logit_softcap=3.0)
    with torch.no_grad():
        capped.lm_head.weight.mul_(2.0)
    _, loss, _ = capped(x, x, ForwardContext(position=capped.position, need_logits=False))
    assert fused == [True]  # not again
    logits = capped(x)[0].detach()
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits.reshape(-1, V), x.reshape(-1)))
