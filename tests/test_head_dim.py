"""``model.head_dim``: the head width independent of d_model / n_heads, for every attention
mixer, in the cost model, in decode KV accounting and on the command line."""

import json

import pytest
import torch

from abl.contracts.config import ConfigError, ModelConfig
from abl.contracts.precision import Precision
from abl.grid.gridfile import expand
from abl.model import costmodel
from abl.model.decode import analytic_state_bytes, cache_bytes, decode_metrics, greedy_generate, recompute_generate
from abl.model.decoder import DecoderLM, ForwardContext
from tests.conftest import run_abl

ATTENTION = ["mha", "gqa", "mqa", "sliding_window", "linear", "mla"]
PARAMS = {"sliding_window": {"window": 5}, "linear": {"chunk_size": 4}}
VOCAB = 48


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def cell(registry, mixer="mha", position="rope", **model):
    raw = {"experiment": {"name": "head-dim"},
           "model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "context": 16, "vocab_size": VOCAB,
                     "mixer": mixer, "position": position, **model},
           "train": {"batch_size": 2}}
    if mixer in PARAMS:
        raw["mixer"] = {mixer: PARAMS[mixer]}
    return expand(raw, registry).cells[0]


def test_default_is_d_model_over_n_heads_and_is_stored_resolved(registry):
    assert ModelConfig(d_model=64, n_heads=4).head_dim == 16
    c = cell(registry)
    assert c.model.head_dim == 8 and c.config["model"]["head_dim"] == 8
    # giving the derived value explicitly is the same run
    assert cell(registry, head_dim=8).run_id == c.run_id
    assert cell(registry, head_dim=12).run_id != c.run_id
    # a scale preset re-derives it from the preset's width ...
    assert cell(registry, scale="m").model.head_dim == 256 // 8
    # ... unless it was given
    assert cell(registry, scale="m", head_dim=16).model.head_dim == 16


@pytest.mark.parametrize("mixer", ATTENTION)
def test_every_attention_mixer_takes_the_head_dim(registry, mixer):
    """head_dim 12 with d_model 32 and 4 heads: q/k/v are 4 x 12 = 48 wide and the output
    projection maps 48 back to 32; parameters are what the cost function predicts, exactly."""
    c = cell(registry, mixer, head_dim=12)
    model = DecoderLM(c.model, c.components, registry)
    attn = model.blocks[0].mixer
    assert attn.out_proj.weight.shape == (32, 4 * 12)
    narrow = DecoderLM(cell(registry, mixer).model, c.components, registry)
    assert model.n_params() > narrow.n_params()  # the wider heads are really there
    pred = costmodel.predict(c, registry)
    assert pred["n_params"] == model.n_params()
    assert pred["n_params_non_embedding"] == model.n_params(non_embedding=True)


# linear attention has no scores for ALiBi to bias (its check rejects the pair)
DECODE = [(m, p) for m in ATTENTION for p in ("rope", "alibi", "nope") if (m, p) != ("linear", "alibi")]


@pytest.mark.parametrize("mixer,position", DECODE, ids=[f"{m}-{p}" for m, p in DECODE])
def test_decoding_and_kv_accounting_at_an_independent_head_dim(registry, mixer, position):
    c = cell(registry, mixer, position, head_dim=6, init_std=0.2)
    torch.manual_seed(0)
    model = DecoderLM(c.model, c.components, registry).eval()
    a = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    prompt = a[:, :5]
    gen = greedy_generate(model, prompt, 11)
    torch.testing.assert_close(gen.tokens, recompute_generate(model, prompt, 11), rtol=0, atol=0)
    seq = torch.cat((prompt, gen.tokens), dim=1)
    cache: dict = {}
    with torch.no_grad():
        full = model(seq)[0]
        steps = [model(seq[:, :5], ctx=ForwardContext(position=model.position, cache=cache))[0]]
        for i in range(5, seq.size(1)):
            steps.append(model(seq[:, i:i + 1], ctx=ForwardContext(position=model.position, cache=cache,
                                                                   start=i))[0])
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    analytic, missing = analytic_state_bytes(c.model, c.components, registry, seq.size(1), torch.float32)
    assert not missing and cache_bytes(cache) == 2 * analytic  # two sequences in the batch


def test_flops_follow_the_head_dim(registry):
    flops = pytest.importorskip("abl.model.flops")
    c = cell(registry, "mha", head_dim=20)
    pred = costmodel.predict(c, registry)
    torch.manual_seed(0)
    model = DecoderLM(c.model, c.components, registry)
    x = torch.randint(0, VOCAB, (2, 16))
    with flops.flop_counter() as fc:
        _, loss, _ = model(x, x)
        loss.backward()
    assert fc.get_total_flops() == pytest.approx(pred["flops_per_step"], rel=0.05)
    assert pred["flops_per_step"] > costmodel.predict(cell(registry, "mha"), registry)["flops_per_step"]


def test_an_8_head_mha_matches_mqa_kv_bytes_exactly(registry):
    """Shazeer 2019 Table 1: MQA (h = 8, d_k = 128, one K/V head) against MHA cut to the same
    cache, h = 8 heads of d_k = 16. Here d_model 128: MQA's derived head_dim 16 vs MHA at 2."""
    mqa = cell(registry, "mqa", d_model=128, n_heads=8)
    mha = cell(registry, "mha", d_model=128, n_heads=8, head_dim=2)
    full = cell(registry, "mha", d_model=128, n_heads=8)
    kv = {name: costmodel.predict(c, registry)["kv_cache_bytes_per_token"]
          for name, c in (("mqa", mqa), ("mha", mha), ("full", full))}
    assert kv["mqa"] == kv["mha"] == 2 * 2 * 16 * 4  # K and V, 2 layers, 16 dims, fp32
    assert kv["full"] == 8 * kv["mqa"]
    # and the live caches of the trained-model evaluation agree
    val = torch.randint(0, VOCAB, (4000,))
    got = {}
    for name, c in (("mqa", mqa), ("mha", mha)):
        torch.manual_seed(0)
        model = DecoderLM(c.model, c.components, registry).eval()
        got[name], _ = decode_metrics(model, c.model, c.components, registry, val, torch.device("cpu"),
                                      Precision())
    for key in ("kv_bytes_per_token", "kv_bytes_per_token_measured"):
        assert got["mqa"][key] == got["mha"][key] == kv["mqa"]


KV_GRID = """
[experiment]
name = "mqa-vs-mha-cut"
[model]
d_model = 128
n_layers = 2
n_heads = 8
context = 16
vocab_size = 64
[grid]
"model.mixer" = ["mha", "mqa"]
"model.head_dim" = [16, 2]    # 16 = d_model / n_heads, MHA's and MQA's own width
exclude = [{ "model.mixer" = "mqa", "model.head_dim" = 2 }]
"""


def test_abl_cost_shows_mha_cut_to_mqa_kv_bytes(tmp_path):
    grid = tmp_path / "kv.toml"
    grid.write_text(KV_GRID)
    r = run_abl(["cost", str(grid), "--json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = {row["cell"]: row for row in json.loads(r.stdout)}
    assert set(rows) == {"mixer=mha, head_dim=16", "mixer=mha, head_dim=2", "mixer=mqa, head_dim=16"}
    kv = {label: row["kv_cache_bytes_per_token"] for label, row in rows.items()}
    assert kv["mixer=mha, head_dim=2"] == kv["mixer=mqa, head_dim=16"] == 256
    assert kv["mixer=mha, head_dim=16"] == 8 * 256
    table = run_abl(["cost", str(grid)], cwd=tmp_path)
    assert table.returncode == 0 and "model.head_dim" in table.stdout and table.stdout.count("256 B") == 2


@pytest.mark.parametrize("model,train,message", [
    ({"head_dim": -4}, {}, "head_dim"),
    ({"d_model": 30, "n_heads": 4}, {}, "set model.head_dim"),
    ({"head_dim": 7}, {}, "RoPE needs an even head dim; model.head_dim = 7"),
    ({"head_dim": 320}, {"kernels": "triton"}, "exceeds 256"),
    ({"d_model": 1024, "n_heads": 2}, {"kernels": "triton"}, "head_dim=512 exceeds 256"),
])
def test_bad_head_dims_are_config_errors(registry, model, train, message):
    raw = {"model": {"d_model": 32, "n_heads": 4, **model}, "train": train}
    with pytest.raises(ConfigError, match=message):
        expand(raw, registry)


def test_independent_head_dim_needs_no_divisible_width(registry):
    c = cell(registry, d_model=30, n_heads=4, head_dim=8)
    assert c.model.head_dim == 8
    assert cell(registry, head_dim=320).model.head_dim == 320  # the torch path has no width limit


def test_bad_head_dim_exits_2_without_touching_the_store(tmp_path):
    grid = tmp_path / "bad.toml"
    grid.write_text(KV_GRID.replace("[16, 2]", "[16, 3]").replace("= 2 }", "= 3 }"))
    r = run_abl(["run", str(grid), "--db", str(tmp_path / "x.duckdb")], cwd=tmp_path)
    assert r.returncode == 2 and "RoPE needs an even head dim" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x.duckdb").exists()
