"""Architecture recipes (``model.recipe``; abl.contracts.recipes, abl.grid.recipes, abl.plugins.recipes).

The published figures below are written out from the papers and official config files, independently
of the recipe code: each recipe is resolved at its family's published size and its components, head
layout, norm placement and FFN width compared with them.
"""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from abl import Setting, hookimpl, per_head
from abl.cli import cli
from abl.contracts.config import ConfigError, cell_from_config
from abl.contracts.plugin_manager import build_registry, get_registry, pm
from abl.contracts.recipes import make_recipe
from abl.contracts.registry import Registry, RegistryError
from abl.grid.gridfile import expand, load_grid
from abl.plugins.ffn import hidden_size
from abl.plugins.moe import expert_hidden

ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------- the published configurations
# size: d_model, n_layers, n_heads, head_dim (0 = d_model / n_heads), context; then what the family is.
# ffn_hidden is the published intermediate size (per expert for MoE); window the sliding window.
PUBLISHED = {
    # Llama 2 7B: arXiv:2307.09288 sec. 2.2 (and LLaMA arXiv:2302.13971 sec. 2.2); config.json of
    # meta-llama/Llama-2-7b-hf: hidden 4096, 32 layers, 32 heads, 32 KV heads, intermediate 11008,
    # rms_norm_eps 1e-5, rope_theta 1e4, tie_word_embeddings false, max_position_embeddings 4096
    "llama": {"size": (4096, 32, 32, 0, 4096), "block": "pre", "norm": "rmsnorm", "eps": 1e-5, "position": "rope",
        "theta": 10000.0, "mixers": {"mha": 32}, "n_kv_heads": 32, "ffn": "swiglu", "ffn_hidden": 11008,
        "tie": False, "bias": False},
    # GPT-2 small: Radford et al. 2019 sec. 2.3; config.json of openai-community/gpt2: n_embd 768,
    # n_layer 12, n_head 12, n_positions 1024, n_inner = 4 * 768, layer_norm_epsilon 1e-5, gelu_new, biases
    "gpt2": {"size": (768, 12, 12, 0, 1024), "block": "pre", "norm": "layernorm", "eps": 1e-5, "position": "learned",
        "mixers": {"mha": 12}, "n_kv_heads": 12, "ffn": "gelu", "ffn_hidden": 3072, "tie": True, "bias": True},
    # Gemma 2 9B: arXiv:2408.00118 sec. 2 and Table 1: d 3584, 42 layers, 16 heads, 8 KV heads, head
    # size 256, feedforward 2 x 14336 (GeGLU), pre- and post-norm RMSNorm, local 4096 / global 8192
    # alternating, attention soft cap 50; config.json of google/gemma-2-9b: rms_norm_eps 1e-6
    "gemma2": {"size": (3584, 42, 16, 256, 8192), "block": "sandwich", "norm": "rmsnorm", "eps": 1e-6, "position": "rope",
        "theta": 10000.0, "mixers": {"sliding_window": 21, "mha": 21}, "n_kv_heads": 8, "window": 4096,
        "softcap": 50.0, "ffn": "geglu", "ffn_hidden": 14336, "tie": True, "bias": False,
        "logit_softcap": 30.0, "embed_scale": "sqrt_d_model"},  # sec. 2: "30.0 for the final layer"; config.json: final_logit_softcapping 30.0
    # OLMo 2 7B: arXiv:2501.00656 (reordered norm h = x + RMSNorm(Attn(x)), QK-norm); config.json of
    # allenai/OLMo-2-1124-7B: hidden 4096, 32 layers, 32 heads, 32 KV heads, intermediate 11008,
    # rope_theta 5e5, rms_norm_eps 1e-6, untied
    "olmo2": {"size": (4096, 32, 32, 0, 4096), "block": "post_branch", "norm": "rmsnorm", "eps": 1e-6, "position": "rope",
        "theta": 500000.0, "mixers": {"mha": 32}, "n_kv_heads": 32, "qk_norm": True, "ffn": "swiglu", "ffn_hidden": 11008,
        "tie": False, "bias": False, "z_loss": 1e-5},  # arXiv:2501.00656: z-loss regularisation, 1e-5
    # Mistral 7B: arXiv:2310.06825 Table 1: dim 4096, 32 layers, head_dim 128, hidden_dim 14336,
    # 32 heads, 8 KV heads, window 4096, context 8192; config.json of mistralai/Mistral-7B-v0.1
    "mistral": {"size": (4096, 32, 32, 0, 8192), "block": "pre", "norm": "rmsnorm", "eps": 1e-5, "position": "rope",
        "theta": 10000.0, "mixers": {"sliding_window": 32}, "n_kv_heads": 8, "window": 4096, "ffn": "swiglu",
        "ffn_hidden": 14336, "tie": False, "bias": False},
    # Qwen3-8B: arXiv:2505.09388 sec. 2 and Table 1: 36 layers, 32 Q / 8 KV heads, untied, QK-norm, no
    # QKV bias; config.json of Qwen/Qwen3-8B: hidden 4096, intermediate 12288, rope_theta 1e6, eps 1e-6
    "qwen3": {"size": (4096, 36, 32, 0, 4096), "block": "pre", "norm": "rmsnorm", "eps": 1e-6, "position": "rope",
        "theta": 1000000.0, "mixers": {"mha": 36}, "n_kv_heads": 8, "qk_norm": True, "ffn": "swiglu", "ffn_hidden": 12288,
        "tie": False, "bias": False},
    # DeepSeek-V3: arXiv:2412.19437 sec. 2.1 and 4.2: 61 layers, hidden 7168, 128 heads of 128, d_c 512,
    # d_c' 1536, d_h^R 64, 1 shared + 256 routed experts (8 active) of hidden 2048
    "deepseek_v3_small": {"size": (7168, 61, 128, 128, 4096), "block": "pre", "norm": "rmsnorm", "eps": 1e-6,
        "position": "rope", "theta": 10000.0, "mixers": {"mla": 61}, "kv_rank": 512, "q_rank": 1536,
        "rope_dim": 64, "ffn": "moe", "ffn_hidden": 2048, "n_shared": 1, "n_experts": 256, "top_k": 8,
        "tie": False},
    # Jamba: arXiv:2403.19887 sec. 3.1: blocks of 8 layers, attention:Mamba 1:7, 16 experts, top-2;
    # config.json of ai21labs/Jamba-v0.1: hidden 4096, 32 layers, 32 heads, 8 KV heads, intermediate
    # 14336, attn_layer_offset 4, no positional embeddings, mamba d_state 16, d_conv 4, expand 2
    "jamba": {"size": (4096, 32, 32, 0, 4096), "block": "pre", "norm": "rmsnorm", "eps": 1e-6, "position": "nope",
        "mixers": {"mamba": 28, "mha": 4}, "attention_layers": [4, 12, 20, 28], "n_kv_heads": 8, "ffn": "moe",
        "ffn_hidden": 14336, "n_shared": 0, "n_experts": 16, "top_k": 2, "tie": False},
}


def _cell(recipe: str, overrides: dict | None = None):
    d, n_layers, n_heads, head_dim, context = PUBLISHED[recipe]["size"]
    model = {"recipe": recipe, "d_model": d, "n_layers": n_layers, "n_heads": n_heads, "context": context}
    if head_dim:
        model["head_dim"] = head_dim
    raw = {"experiment": {"name": "t"}, "model": {**model, **(overrides or {})}}
    return expand(raw, get_registry()).cells[0]


def test_every_recipe_is_checked_against_its_published_configuration():
    assert set(get_registry().recipes) == set(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_a_recipe_at_its_published_size_is_the_published_model(name):
    pub = PUBLISHED[name]
    cell = _cell(name)
    comps, model = cell.components, cell.model
    assert cell.config["model"]["recipe"] == name
    assert (comps["block"]["name"], comps["norm"]["name"], comps["position"]["name"]) == \
        (pub["block"], pub["norm"], pub["position"])
    assert comps["norm"]["params"]["eps"] == pub["eps"]
    if "theta" in pub:
        assert comps["position"]["params"]["theta"] == pub["theta"]
    layers = [s for s in comps.get("layer_mixers", [])] or [comps["mixer"]] * model.n_layers
    counts: dict[str, int] = {}
    for spec in layers:
        counts[spec["name"]] = counts.get(spec["name"], 0) + 1
    assert counts == pub["mixers"]
    if "attention_layers" in pub:
        assert [i for i, s in enumerate(layers) if s["name"] == "mha"] == pub["attention_layers"]
    for spec in layers:  # the head layout and attention options of every attention layer
        p = spec["params"]
        if "n_kv_heads" in p:
            assert p["n_kv_heads"] == pub["n_kv_heads"]
            assert p["bias"] == pub.get("bias", False)
            assert p["qk_norm"] == pub.get("qk_norm", False)
            assert p["softcap"] == pub.get("softcap", 0.0)
        if spec["name"] == "sliding_window":
            assert p["window"] == pub["window"]
        if spec["name"] == "mla":
            assert model.head_dim == 128
            assert (p["kv_rank"], p["q_rank"], p["rope_dim"]) == (pub["kv_rank"], pub["q_rank"], pub["rope_dim"])
    ffn = comps["ffn"]
    assert ffn["name"] == pub["ffn"]
    p = ffn["params"]
    if ffn["name"] == "moe":
        hidden = expert_hidden(model.d_model, p["expert"], p["expert_ratio"], p["top_k"], p["n_shared_experts"],
                               p["multiple_of"])
        assert hidden == pub["ffn_hidden"] and p["n_shared_experts"] == pub["n_shared"]
        recipe = get_registry().recipe(name)
        if (p["n_experts"], p["top_k"]) != (pub["n_experts"], pub["top_k"]):  # scaled down: said so
            assert any(str(pub["n_experts"]) in g and str(pub["top_k"]) in g for g in recipe.gaps), recipe.gaps
    else:
        assert hidden_size(model.d_model, p["ratio"], p["multiple_of"]) == pub["ffn_hidden"]
        assert p["bias"] == pub["bias"]
    assert model.tie_embeddings == pub["tie"]
    assert model.z_loss == pub.get("z_loss", 0.0)  # the output z-loss (model.z_loss), where the family uses one
    assert model.logit_softcap == pub.get("logit_softcap", 0.0)  # final-logit soft-capping, where the family caps
    assert model.embed_scale == pub.get("embed_scale", "none")  # sqrt(d_model) on the input embeddings (Gemma)


def test_every_setting_cites_a_source_and_no_recipe_sets_the_size():
    for recipe in get_registry().recipes.values():
        assert recipe.doc and ("arXiv:" in recipe.doc or "Radford" in recipe.doc)
        for s in recipe.settings:
            # a paper with its arXiv id, or a year and section; an official config or modeling file
            assert re.search(r"arXiv:\d{4}\.\d{4,5}|config\.json of \S+/\S+|modeling_\w+\.py|(19|20)\d\d\b.*sec\. \d",
                             s.source), (recipe.name, s)
            assert not s.path.startswith(("model.d_model", "model.n_layers", "model.n_heads", "model.context"))


def test_keys_the_grid_sets_win_over_the_recipe_and_set_wins_over_both(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text('[model]\nrecipe = "llama"\nd_model = 64\nn_heads = 4\nnorm = "layernorm"\n'
                    '[mixer.mha]\nn_kv_heads = 2\n')
    reg = get_registry()
    cell = load_grid(grid, reg).cells[0]
    assert cell.components["norm"]["name"] == "layernorm"  # the grid file's
    assert cell.components["mixer"]["params"]["n_kv_heads"] == 2  # the grid file's, not the recipe's 4
    assert cell.components["ffn"]["name"] == "swiglu" and cell.model.tie_embeddings is False  # the recipe's
    assert cell.components["norm"]["params"]["eps"] == 1e-5  # layernorm's default: the recipe set rmsnorm's
    cell = load_grid(grid, reg, ["model.norm=scalenorm", "model.tie_embeddings=true"]).cells[0]
    assert cell.components["norm"]["name"] == "scalenorm" and cell.model.tie_embeddings is True


def test_a_grid_sweeps_one_axis_away_from_a_recipe(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text('[model]\nrecipe = "llama"\nd_model = 64\nn_heads = 4\n'
                    '[grid]\n"model.norm" = ["rmsnorm", "layernorm"]\n')
    cells = load_grid(grid, get_registry()).cells
    assert [c.components["norm"]["name"] for c in cells] == ["rmsnorm", "layernorm"]
    for c in cells:  # everything else stays Llama
        assert c.components["ffn"]["name"] == "swiglu" and c.components["position"]["name"] == "rope"
        assert c.model.tie_embeddings is False
    assert cells[0].components["norm"]["params"]["eps"] == 1e-5
    # a cell's run id is its own settings, whatever else its grid sweeps
    explicit = load_grid(grid, get_registry(), ["grid.model.norm=[\"rmsnorm\"]"]).cells[0]
    assert explicit.run_id == cells[0].run_id


def test_the_recipe_scales_to_the_grid_size():
    a = _cell("mistral", {"d_model": 64, "n_layers": 2, "n_heads": 4, "context": 128})
    assert a.components["mixer"]["params"]["n_kv_heads"] == 1 and a.components["mixer"]["params"]["window"] == 64
    b = _cell("mistral", {"d_model": 128, "n_layers": 2, "n_heads": 8, "context": 256})
    assert b.components["mixer"]["params"]["n_kv_heads"] == 2 and b.components["mixer"]["params"]["window"] == 128
    c = _cell("gemma2", {"scale": "m"})  # a size preset: 256 wide, 8 heads
    assert c.model.n_heads == 8 and c.components["layer_mixers"][0]["params"]["n_kv_heads"] == 4


def test_a_grid_without_a_recipe_stores_and_hashes_no_recipe_key():
    cell = expand({"experiment": {"name": "t"}, "model": {"d_model": 64}}, get_registry()).cells[0]
    assert "recipe" not in cell.config["model"]
    stored = cell_from_config(json.loads(json.dumps(cell.config)), get_registry())
    assert stored.run_id == cell.run_id and stored.model.recipe == ""
    with_recipe = _cell("qwen3", {"d_model": 64, "n_heads": 4, "n_layers": 2, "context": 64})
    again = cell_from_config(json.loads(json.dumps(with_recipe.config)), get_registry())
    assert again.run_id == with_recipe.run_id and again.model.recipe == "qwen3"
    assert again.components["mixer"]["params"]["qk_norm"] is True  # the worker needs no recipe


def test_an_unknown_recipe_is_a_clear_error_naming_the_recipes(tmp_path):
    with pytest.raises(ConfigError) as exc:
        expand({"model": {"recipe": "lama"}}, get_registry())
    assert "unknown recipe 'lama'" in str(exc.value) and "'llama'" in str(exc.value)
    grid = tmp_path / "g.toml"
    grid.write_text('[model]\nrecipe = "lama"\n')
    r = CliRunner().invoke(cli, ["cost", str(grid)])
    assert r.exit_code == 2 and "unknown recipe" in r.output and "Traceback" not in r.output


def test_a_recipe_that_does_not_fit_the_size_says_why():
    with pytest.raises(ConfigError) as exc:
        expand({"model": {"recipe": "jamba", "n_layers": 4}}, get_registry())
    assert "n_layers=4 must be a multiple" in str(exc.value)


def test_a_recipe_registers_like_any_plugin_and_bad_recipes_are_refused():
    module = types.ModuleType("third_party_recipes")

    @hookimpl
    def register_recipes(register):
        register("tiny_llama", [Setting("model.norm", "rmsnorm", "TinyLlama, arXiv:2401.02385"),
                                Setting("mixer.mha.n_kv_heads", per_head(0.5, "n_heads / 2"), "ibid.")],
                 doc="TinyLlama (arXiv:2401.02385).")

    module.register_recipes = register_recipes  # type: ignore[attr-defined]
    pm.register(module, name="third_party_recipes")
    try:
        reg = build_registry()
        assert reg.recipe("tiny_llama").plugin == "third_party_recipes" and "llama" in reg.recipes
        cell = expand({"model": {"recipe": "tiny_llama", "n_heads": 4}}, reg).cells[0]
        assert cell.components["mixer"]["params"]["n_kv_heads"] == 2
    finally:
        pm.unregister(name="third_party_recipes")
    reg = Registry()

    def add(name, settings, plugin="?"):
        return reg.register_recipe(make_recipe(name, settings, plugin=plugin))

    add("a", [Setting("model.norm", "rmsnorm", "src")], plugin="p1")
    with pytest.raises(RegistryError, match="duplicate recipe 'a'.*p1.*p2"):
        add("a", [], plugin="p2")
    with pytest.raises(RegistryError, match="sets model.d_model"):
        add("b", [Setting("model.d_model", 64, "src")])
    with pytest.raises(RegistryError, match="cites no source"):
        add("c", [Setting("model.norm", "rmsnorm", " ")])
    with pytest.raises(RegistryError, match="must be abl.Setting"):
        add("e", [("model.norm", "rmsnorm", "src")])
    add("d", [Setting("model.nrom", "rmsnorm", "src")])  # a typo: caught when a grid uses it
    with pytest.raises(ConfigError, match="unknown key 'model.nrom'"):
        expand({"model": {"recipe": "d"}}, reg)


def test_abl_plugins_lists_every_recipe_with_its_source():
    r = CliRunner().invoke(cli, ["plugins"])
    assert r.exit_code == 0, r.output
    listing = r.output[r.output.index("recipe  (selected by model.recipe"):]
    for name in PUBLISHED:
        assert f"\n  {name}  built-in" in listing
    r = CliRunner().invoke(cli, ["plugins", "--recipe", "gemma2"])
    assert r.exit_code == 0 and "mixer.sliding_window.window = context / 2" in r.output
    assert "arXiv:2408.00118" in r.output and "model.logit_softcap = 30.0" in r.output
    assert "gap: head size 256" in r.output
    rows = json.loads(CliRunner().invoke(cli, ["plugins", "--json"]).output)
    assert {row["name"] for row in rows if row["axis"] == "recipe"} == set(PUBLISHED)
    r = CliRunner().invoke(cli, ["plugins", "--recipe", "lama"])
    assert r.exit_code == 2 and "unknown recipe" in r.output


def test_abl_cost_prints_each_recipe_at_the_size_given():
    r = CliRunner().invoke(cli, ["cost", "--recipe", "all", "--set", "model.n_layers=8", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert len(rows) == len(PUBLISHED) and all(n in row["cell"] for n, row in zip(sorted(PUBLISHED), rows))
    by_name = dict(zip(sorted(PUBLISHED), rows))
    assert by_name["llama"]["n_params"] > 0
    # the recipe changes the cost: Llama's untied head and SwiGLU against GPT-2's tied head and biases
    assert by_name["llama"]["n_params"] != by_name["gpt2"]["n_params"]
    wide = json.loads(CliRunner().invoke(cli, ["cost", "--recipe", "llama", "--set", "model.d_model=256",
                                               "--json"]).output)
    assert wide[0]["n_params"] > by_name["llama"]["n_params"]
    r = CliRunner().invoke(cli, ["cost", str(ROOT / "ablations" / "norms.toml"), "--recipe", "qwen3"])
    assert r.exit_code == 0 and "qwen3" in r.output
    r = CliRunner().invoke(cli, ["cost"])
    assert r.exit_code == 2 and "--recipe" in r.output


def test_docs_name_every_recipe_and_every_gap():
    text = " ".join((ROOT / "docs" / "recipes.md").read_text().split())
    assert "defaults < recipe < grid file < --set" in text
    for recipe in get_registry().recipes.values():
        assert f"`{recipe.name}`" in text
        for gap in recipe.gaps:
            assert " ".join(gap.split()) in text, (recipe.name, gap)


def test_set_puts_a_recipe_under_a_grid_that_has_none():
    reg = get_registry()
    plain = load_grid(ROOT / "ablations" / "norms.toml", reg)
    cells = load_grid(ROOT / "ablations" / "norms.toml", reg, ["model.recipe=qwen3"]).cells
    assert len(cells) == len(plain.cells)
    for cell, before in zip(cells, plain.cells):
        # the grid's own choices stand (norm, block, mixer, ffn); the recipe fills the rest
        assert cell.components["norm"]["name"] == before.components["norm"]["name"]
        assert cell.components["ffn"]["name"] == "gelu"
        assert cell.components["mixer"]["params"]["qk_norm"] is True
        assert cell.components["mixer"]["params"]["n_kv_heads"] == 1  # n_heads 4 / 4
        assert cell.run_id != before.run_id
    r = CliRunner().invoke(cli, ["cost", str(ROOT / "ablations" / "recipes.toml"), "--set", "model.recipe=llama"])
    assert r.exit_code == 2 and "grid.model.recipe" in r.output  # the grid sweeps it: say how to override
