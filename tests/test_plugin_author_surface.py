"""The plugin author's public surface: the width knob and own init declared in ``register``,
the public attention core, and a new mixer written from the README alone that trains and decodes."""

import json
import re

import duckdb
import pytest
import torch
import torch.nn as nn

import abl
from abl.contracts.config import ModelConfig
from abl.contracts.registry import Registry, RegistryError
from abl.grid.gridfile import expand
from abl.model.decoder import DecoderLM, ForwardContext
from abl.contracts.config import solved_paths
from conftest import ROOT, run_abl

# ---------------------------------------------------------------- the width knob


class WideFFN(nn.Module):
    def __init__(self, cfg, widen=4.0, dropout_ratio=0.5):
        super().__init__()
        h = max(1, round(widen * cfg.d_model))
        self.up, self.down = nn.Linear(cfg.d_model, h), nn.Linear(h, cfg.d_model)

    def forward(self, x, ctx=None):
        return self.down(torch.relu(self.up(x)))


def _wide_cost(cfg, widen=4.0, dropout_ratio=0.5):
    h = max(1, round(widen * cfg.d_model))
    return abl.Cost(params=2 * cfg.d_model * h + h + cfg.d_model, flops_per_token=4.0 * cfg.d_model * h)


def _with(registry, width):
    r = Registry(components=dict(registry.components))
    r.register("ffn", "test_wide", WideFFN, params={"widen": 4.0, "dropout_ratio": 0.5}, cost=_wide_cost,
               width=width, plugin="test")
    return r


def _matched_grid(registry):
    return expand({"experiment": {"name": "w", "seeds": [0]},
                   "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "context": 16},
                   "train": {"match": "params"}, "grid": {"model.ffn": ["swiglu", "test_wide"]}}, registry)


def test_train_match_turns_the_width_knob_the_ffn_declared(registry):
    """The knob is the declared one, whatever its name: the naming rule would have picked
    ``dropout_ratio`` (a float ending in _ratio) and never found ``widen``."""
    r = _with(registry, "widen")
    first, wide = _matched_grid(r).cells
    assert wide.components["ffn"]["params"]["dropout_ratio"] == 0.5  # left alone
    assert wide.components["ffn"]["params"]["widen"] != 4.0
    assert wide.config["matched"]["achieved"] == pytest.approx(first.config["matched"]["achieved"], rel=0.01)
    assert solved_paths(wide.config, r) == {"ffn.test_wide.widen"}


def test_an_ffn_without_a_declared_knob_is_refused_by_train_match(registry):
    from abl.contracts.config import ConfigError

    with pytest.raises(ConfigError, match=r"declares its width knob.*'test_wide' declares none"):
        _matched_grid(_with(registry, None))


def test_the_width_knob_must_be_a_float_parameter(registry):
    with pytest.raises(RegistryError, match=r"width='hidden'.*float parameters \(widen, dropout_ratio\)"):
        _with(registry, "hidden")


def test_builtin_ffns_declare_their_width_knob(registry):
    assert registry.get("ffn", "swiglu").width == "ratio" and registry.get("ffn", "relu").width == "ratio"
    assert registry.get("ffn", "moe").width == "expert_ratio"


# ---------------------------------------------------------------- own init


class Marked(nn.Module):
    """An FFN that sets its weights to 0.5 and its bias to 3 and wants to keep them."""

    def __init__(self, cfg):
        super().__init__()
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        with torch.no_grad():
            self.proj.weight.fill_(0.5)
            self.proj.bias.fill_(3.0)

    def forward(self, x, ctx=None):
        return self.proj(x)


class HalfMarked(Marked):
    """The same, but only ``keep`` is marked with abl.own_init; ``proj`` gets the skeleton's init."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.keep = abl.own_init(nn.Sequential(nn.Linear(cfg.d_model, cfg.d_model)))
        with torch.no_grad():
            self.keep[0].weight.fill_(0.25)


def _model(registry, ffn, own_init):
    r = Registry(components=dict(registry.components))
    r.register("ffn", "test_marked", ffn, own_init=own_init, plugin="test")
    comps = {axis: {"name": name, "params": {k: p.default for k, p in r.get(axis, name).params.items()}}
             for axis, name in (("norm", "rmsnorm"), ("block", "pre"), ("position", "rope"), ("mixer", "mha"),
                                ("ffn", "test_marked"))}
    return DecoderLM(ModelConfig(d_model=16, n_layers=2, n_heads=2, context=8, vocab_size=20), comps, r)


def test_register_own_init_keeps_the_components_weights(registry):
    kept = _model(registry, Marked, own_init=True)
    assert all((b.ffn.proj.weight == 0.5).all() and (b.ffn.proj.bias == 3.0).all() for b in kept.blocks)
    assert not (kept.blocks[0].mixer.q_proj.weight == 0.5).all()  # other components: the skeleton's init
    overwritten = _model(registry, Marked, own_init=False)
    assert not (overwritten.blocks[0].ffn.proj.weight == 0.5).any() and (overwritten.blocks[0].ffn.proj.bias == 0).all()


def test_abl_own_init_marks_one_module_and_its_children(registry):
    m = _model(registry, HalfMarked, own_init=False)
    ffn = m.blocks[1].ffn
    assert (ffn.keep[0].weight == 0.25).all()
    assert not (ffn.proj.weight == 0.5).any()


# ---------------------------------------------------------------- the attention core


def test_the_public_attention_core_is_the_harness_one():
    from abl.model import attention

    assert abl.softmax_attention is attention.softmax_attention and abl.visible is attention.visible
    q = torch.randn(1, 4, 6, 8)
    k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    got = abl.softmax_attention(q, k, v, abl.PositionEncoding(), 0, 0, window=3)
    s = (q @ k.repeat_interleave(2, 1).transpose(-1, -2)) / 8 ** 0.5
    s = s.masked_fill(~abl.visible(6, 6, 0, 0, 3, "cpu"), float("-inf"))
    torch.testing.assert_close(got, torch.softmax(s, -1) @ v.repeat_interleave(2, 1))


# ---------------------------------------------------------------- the README's mixer


def readme_mixer() -> tuple[str, str]:
    text = (ROOT / "docs" / "plugins.md").read_text()
    blocks = re.findall(r"<!-- mixer: (\S+) -->\n```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "docs/plugins.md should show one new mixer, marked <!-- mixer: FILE.py -->"
    return blocks[0]


def test_the_readme_mixer_is_at_most_40_lines_and_uses_only_abl():
    _, body = readme_mixer()
    assert len(body.splitlines()) <= 40
    imports = re.findall(r"^(?:from|import) (\S+)", body, re.M)
    assert set(imports) <= {"abl", "torch", "torch.nn", "math"}, imports
    assert "softmax_attention(" in body


def test_the_readme_mixer_decodes_with_its_cache_as_it_recomputes(tmp_path, monkeypatch):
    """Prefill, then one token at a time through the mixer's KVCache (a rolling window of 5
    keys, shorter than the sequence): the same outputs as one forward over the whole sequence."""
    name, body = readme_mixer()
    (tmp_path / name).write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = __import__(name.removesuffix(".py"))
    r = Registry()
    mod.register_components(register=lambda *a, **k: r.register(*a, plugin="readme", **k))
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4, context=24, vocab_size=10)
    torch.manual_seed(0)
    position = _Rope(cfg.head_dim)
    mixer = r.get("mixer", "local_mqa").factory(cfg, position, window=5)
    x = torch.randn(2, 12, 32)
    with torch.no_grad():
        full = mixer(x, ForwardContext(position=position))
        cache: dict = {}
        steps = [mixer(x[:, :7], ForwardContext(position=position, start=0, cache=cache))]
        for t in range(7, 12):
            steps.append(mixer(x[:, t:t + 1], ForwardContext(position=position, start=t, cache=cache)))
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    assert cache[0]["k"].size(2) == 5  # the rolling buffer kept the window only


class _Rope(abl.PositionEncoding):
    """A minimal rotation, so the test sees the mixer apply ctx.position to q and k."""

    def __init__(self, dim):
        super().__init__()
        self.inv = 1.0 / 100.0 ** (torch.arange(0, dim, 2).float() / dim)

    def rotate(self, q, k, q_start, k_start):
        def rot(x, start):
            a = torch.arange(start, start + x.size(-2)).float()[:, None] * self.inv
            x1, x2 = x[..., 0::2], x[..., 1::2]
            return torch.stack((x1 * a.cos() - x2 * a.sin(), x1 * a.sin() + x2 * a.cos()), -1).flatten(-2)

        return rot(q, q_start), rot(k, k_start)


@pytest.mark.slow
def test_the_readme_mixer_trains_and_decodes_through_abl_run(tmp_path):
    """Installed as a plugin from a folder (``abl --plugins-dir``), trained on a tiny cell;
    the run's decode evaluation generates with the mixer's cache and agrees with recomputation."""
    name, body = readme_mixer()
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / name).write_text(body)
    grid = tmp_path / "g.toml"
    grid.write_text("""
[experiment]
name = "readme-mixer"
seeds = [0]
[model]
d_model = 32
n_layers = 2
n_heads = 4
context = 32
mixer = "local_mqa"
[mixer.local_mqa]
window = 8
[train]
steps = 6
batch_size = 4
eval_every = 6
eval_batches = 1
threads = 1
[dataset.pystdlib]
max_bytes = 300000
""")
    db = tmp_path / "m.duckdb"
    r = run_abl(["--plugins-dir", str(plugins), "run", str(grid), "--db", str(db)])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    con = duckdb.connect(str(db), read_only=True)
    status, config = con.execute("SELECT status, config FROM runs").fetchone()
    metrics = dict(con.execute("SELECT name, value FROM metrics WHERE name IN "
                               "('decode_agreement', 'kv_bytes_per_token_measured', 'val_loss')").fetchall())
    con.close()
    assert status == "completed"
    assert json.loads(config)["components"]["mixer"]["name"] == "local_mqa"
    assert metrics["decode_agreement"] == 1.0 and metrics["kv_bytes_per_token_measured"] > 0
    assert 0 < metrics["val_loss"] < 10
