"""The default init scale (``model.init_std = 0`` -> 1/sqrt(d_model)) and why (README "Default
initialisation"): at GPT-2's fixed 0.02 a narrow model's FFN works near the origin, where GELU and
SiLU are almost linear and a gated unit (a product of two projections) is second order."""

import pytest
import torch

from abl.contracts.config import ModelConfig
from abl.grid.gridfile import expand
from abl.model.decoder import DecoderLM


def model(registry, ffn="gelu", d_model=64, **extra):
    raw = {"model": {"d_model": d_model, "n_layers": 2, "n_heads": 4, "context": 32, "vocab_size": 256,
                     "ffn": ffn, **extra}}
    c = expand(raw, registry).cells[0]
    torch.manual_seed(0)
    return c, DecoderLM(c.model, c.components, registry)


def ffn_stats(m):
    """(RMS of the first FFN's hidden pre-activations, RMS of its output / RMS of its input)."""
    ffn = m.blocks[0].ffn
    first = next(mod for mod in ffn.modules() if isinstance(mod, torch.nn.Linear))
    seen = {}
    h1 = first.register_forward_hook(lambda mod, i, o: seen.__setitem__("pre", o.pow(2).mean().sqrt()))
    h2 = ffn.register_forward_hook(lambda mod, i, o: seen.__setitem__(
        "gain", o.pow(2).mean().sqrt() / i[0].pow(2).mean().sqrt()))
    with torch.no_grad():
        m(torch.randint(0, 256, (4, 32)))
    h1.remove()
    h2.remove()
    return float(seen["pre"]), float(seen["gain"])


def test_default_is_one_over_sqrt_d_and_is_stored_resolved(registry):
    assert ModelConfig(d_model=64).init_std == 0.125
    c, _ = model(registry)
    assert c.config["model"]["init_std"] == 0.125
    assert model(registry, init_std=0.125)[0].run_id == c.run_id  # the same run, written out
    assert model(registry, init_std=0.02)[0].model.init_std == 0.02
    assert model(registry, scale="l")[0].model.init_std == pytest.approx(512 ** -0.5)
    assert model(registry, scale="l", init_std=0.02)[0].model.init_std == 0.02


@pytest.mark.parametrize("d_model", [64, 256])
def test_ffn_pre_activations_are_order_one_at_every_width(registry, d_model):
    for ffn in ("gelu", "swiglu"):
        pre, _ = ffn_stats(model(registry, ffn, d_model)[1])
        assert 0.7 < pre < 1.4, (ffn, d_model, pre)


def test_a_fixed_small_init_starves_the_gated_ffn(registry):
    """The finding behind the default: at 0.02 and d_model 64 the hidden pre-activations have RMS
    0.02 * sqrt(64) = 0.16 and a gated FFN's output is about 10x smaller than a dense one's (it is
    quadratic in the weight scale); at 1/sqrt(d) both are of the same order."""
    small = {f: ffn_stats(model(registry, f, init_std=0.02)[1]) for f in ("gelu", "swiglu")}
    default = {f: ffn_stats(model(registry, f)[1]) for f in ("gelu", "swiglu")}
    assert small["gelu"][0] == pytest.approx(0.16, rel=0.15)
    assert small["gelu"][1] / small["swiglu"][1] > 5
    assert default["gelu"][1] / default["swiglu"][1] < 2


@pytest.mark.parametrize("d_model", [64, 256])
def test_scaled_sinusoidal_embeddings_are_comparable_to_the_positions(registry, d_model):
    """Vaswani et al. 2017 sec. 3.4: embeddings x sqrt(d_model), then + PE. At the default init and
    embed_scale the token part has RMS 1 against the table's 1/sqrt(2); unscaled it is sqrt(d) smaller."""
    _, m = model(registry, d_model=d_model, position="sinusoidal")
    assert m.position.scale == pytest.approx(d_model ** 0.5)  # embed_scale is on by default
    tok = m.embed.weight * m.position.scale
    pe = m.position.table(0, 32, "cpu")
    ratio = float(tok.pow(2).mean().sqrt() / pe.pow(2).mean().sqrt())
    assert 0.7 < ratio < 2.0
