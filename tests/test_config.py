import pytest

from abl.contracts.config import ConfigError
from abl.grid.gridfile import expand, load_grid
from abl.grid.parsing import parse_toml_text

BASE = """
[experiment]
name = "t"
seeds = [0, 1]
[model]
d_model = 32
n_heads = 4
[grid]
"model.norm" = ["rmsnorm", "layernorm"]
"""


def grid_of(text, registry, **kw):
    return expand(parse_toml_text(text, "g.toml"), registry, source="g.toml", **kw)


def test_cells_are_the_product_of_the_grid_times_seeds(registry):
    g = grid_of(BASE, registry)
    assert len(g.cells) == 4
    assert {(c.model.norm, c.seed) for c in g.cells} == {
        ("rmsnorm", 0), ("rmsnorm", 1), ("layernorm", 0), ("layernorm", 1)}


def test_norms_grid_has_every_sensible_pair(registry):
    g = load_grid("ablations/norms.toml", registry)
    pairs = {(c.model.norm, c.model.block) for c in g.cells}
    assert len(pairs) == 13  # 3 norms x 4 layouts + none with pre only
    assert ("none", "post") not in pairs and ("none", "pre") in pairs
    assert {c.seed for c in g.cells} == {0, 1}


def test_run_id_is_a_stable_hash_of_the_resolved_config(registry):
    a = grid_of(BASE, registry).cells
    b = grid_of(BASE, registry).cells
    assert [c.run_id for c in a] == [c.run_id for c in b]
    assert len({c.run_id for c in a}) == 4
    # spelling out a default does not change the run
    explicit = BASE.replace("[grid]", "[norm.rmsnorm]\neps = 1e-6\n[grid]")
    assert [c.run_id for c in grid_of(explicit, registry).cells] == [c.run_id for c in a]
    # parameters of components that are not selected do not change the run either
    other = BASE.replace("[grid]", "[norm.scalenorm]\neps = 1e-3\n[grid]")
    assert [c.run_id for c in grid_of(other, registry).cells] == [c.run_id for c in a]
    # a real change does
    changed = BASE.replace("d_model = 32", "d_model = 64")
    assert not {c.run_id for c in grid_of(changed, registry).cells} & {c.run_id for c in a}


def test_cell_key_ignores_the_seed(registry):
    cells = grid_of(BASE, registry).cells
    assert len({c.cell_key for c in cells}) == 2


def test_overrides_are_typed(registry, tmp_path):
    p = tmp_path / "g.toml"
    p.write_text(BASE)
    g = load_grid(p, registry, ["model.d_model=64", "train.lr=1e-3", "experiment.seeds=[7]",
                                "mixer.mha.n_kv_heads=2"])
    c = g.cells[0]
    assert c.model.d_model == 64 and c.train.lr == 1e-3 and c.seed == 7
    assert c.components["mixer"]["params"]["n_kv_heads"] == 2


@pytest.mark.parametrize("text,needle", [
    (BASE.replace("d_model = 32", "d_modle = 32"), "did you mean 'd_model'"),
    (BASE.replace("d_model = 32", 'd_model = "big"'), "d_model must be int"),
    (BASE.replace("d_model = 32", "d_model = 30"), "not divisible by model.n_heads"),
    (BASE.replace('"rmsnorm", ', '"rmsnrom", '), "Closest match: 'rmsnorm'"),
    (BASE + '"norm.rmsnorm.epss" = [1e-5]\n', "did you mean 'eps'"),
    (BASE.replace("[model]", "[modle]"), "did you mean 'model'"),
    (BASE.replace("seeds = [0, 1]", "seeds = []"), "non-empty list"),
    (BASE.replace("d_model = 32", "d_model = 24\nn_layers = 0"), "n_layers must be >= 1"),
    (BASE.replace("n_heads = 4", "n_heads = 8\n[mixer.mha]\nn_kv_heads = 3"), "not divisible by n_kv_heads"),
    (BASE.replace("d_model = 32", "d_model = 36") .replace("n_heads = 4", "n_heads = 4"), "even head dim"),
    (BASE.replace('"model.norm" = ["rmsnorm", "layernorm"]', '"model.norm" = []'), "non-empty list"),
])
def test_bad_configs_are_reported_before_training(registry, text, needle):
    with pytest.raises(ConfigError) as err:
        grid_of(text, registry)
    assert needle in str(err.value)


def test_all_errors_are_collected(registry):
    text = BASE.replace("d_model = 32", "d_modle = 32\n[trian]\nsteps = 3")
    with pytest.raises(ConfigError) as err:
        grid_of(text, registry)
    assert len(err.value.messages) >= 2


def test_toml_syntax_error_names_file_and_line(registry, tmp_path):
    p = tmp_path / "broken.toml"
    p.write_text('[model]\nd_model = 32\nn_heads = = 4\n')
    with pytest.raises(ConfigError) as err:
        load_grid(p, registry)
    assert "broken.toml" in str(err.value) and "line 3" in str(err.value)


def test_exclude_drops_matching_cells_and_empty_grid_is_an_error(registry):
    text = BASE + 'exclude = [{ "model.norm" = "layernorm" }]\n'
    assert {c.model.norm for c in grid_of(text, registry).cells} == {"rmsnorm"}
    text = BASE + 'exclude = [{ "model.d_model" = 32 }]\n'
    with pytest.raises(ConfigError, match="empty"):
        grid_of(text, registry)


def test_max_cells(registry):
    with pytest.raises(ConfigError, match="more than --max-cells=3"):
        grid_of(BASE, registry, max_cells=3)


def test_layer_pattern_tiles_mixers_over_layers(registry):
    text = BASE.replace("n_heads = 4", "n_heads = 4\nn_layers = 4\nlayer_pattern = \"mha, mha\"\n"
                        "[mixer.mha]\nn_kv_heads = 2")
    cell = grid_of(text, registry).cells[0]
    assert [s["name"] for s in cell.components["layer_mixers"]] == ["mha"] * 4
    assert cell.components["layer_mixers"][0]["params"]["n_kv_heads"] == 2
    with pytest.raises(ConfigError, match="multiple of it"):
        grid_of(text.replace("n_layers = 4", "n_layers = 3").replace('"mha, mha"', '"mha,mha"'), registry)
    with pytest.raises(ConfigError, match="unknown mixer 'mamba9'"):
        grid_of(text.replace('"mha, mha"', '"mamba9,mha"'), registry)


def test_scale_presets_and_token_budgets(registry):
    from abl.contracts.config import SCALES

    text = BASE.replace("d_model = 32", 'scale = "s"').replace("n_heads = 4", "") + ""
    text = text.replace("[grid]", "[train]\ntokens = 100000\nbatch_size = 8\n[grid]")
    cell = grid_of(text.replace("[model]", "[model]\ncontext = 64"), registry).cells[0]
    assert (cell.model.d_model, cell.model.n_layers, cell.model.n_heads) == SCALES["s"]
    assert cell.train.steps == -(-100000 // (8 * 64)) and cell.config["train"]["steps"] == cell.train.steps
    with pytest.raises(ConfigError, match="not a preset"):
        grid_of(text.replace('scale = "s"', 'scale = "huge"'), registry)
    with pytest.raises(ConfigError, match="not both"):
        grid_of(text.replace("tokens = 100000", "tokens = 100000\nsteps = 5"), registry)


@pytest.mark.parametrize("what", ["params", "flops"])
def test_match_resizes_cells_to_the_first_within_one_percent(registry, what):
    import dataclasses

    from abl.model.costmodel import predict_model

    text = BASE.replace('"model.norm" = ["rmsnorm", "layernorm"]',
                        '"model.ffn" = ["gelu", "swiglu"]\n"ffn.gelu.ratio" = [4.0, 2.0]')
    text = text.replace("[grid]", f'[train]\nmatch = "{what}"\n[grid]')
    cells = grid_of(text, registry).cells
    key = "n_params_non_embedding" if what == "params" else "train_flops_per_token"

    def cost(c):
        m = dataclasses.replace(c.model, vocab_size=256)
        return predict_model(m, c.components, registry, batch_size=c.train.batch_size)[key]

    target = cost(cells[0])
    assert all(abs(cost(c) - target) <= 0.01 * target for c in cells)
    assert all(c.config["matched"]["what"] == what for c in cells)
    assert len({c.run_id for c in cells}) == len(cells)
    # depth moves in whole layers: here it cannot land within 1%, and the grid is refused
    with pytest.raises(ConfigError, match="more than 1%"):
        grid_of(text.replace(f'match = "{what}"', f'match = "{what}"\nmatch_by = "n_layers"'), registry)


def test_eval_switches_are_a_typed_section_of_the_resolved_config(registry, tmp_path):
    from abl.contracts.config import EvalConfig
    from abl.contracts.config import cell_from_config

    base = grid_of(BASE, registry).cells[0]
    assert base.eval == EvalConfig(decode=True, extrapolation=False)  # extrapolation: off unless asked for
    assert base.config["eval"] == {"decode": True, "extrapolation": False}
    p = tmp_path / "g.toml"
    p.write_text(BASE)
    off = load_grid(p, registry, ["eval.decode=false"]).cells[0]
    assert off.eval == EvalConfig(decode=False, extrapolation=False)
    assert off.config["eval"]["decode"] is False
    assert off.run_id != base.run_id  # a switched-off evaluation is another run
    again = cell_from_config(off.config, registry)
    assert again.eval == off.eval and again.run_id == off.run_id
    # a config stored before [eval] existed rebuilds with every evaluation on
    old = {k: v for k, v in base.config.items() if k != "eval"}
    assert cell_from_config(old, registry).eval == EvalConfig(decode=True, extrapolation=True)


def test_a_grid_can_sweep_an_eval_switch(registry):
    cells = grid_of(BASE + '"eval.decode" = [true, false]\n', registry).cells
    assert sorted((c.model.norm, c.seed, c.eval.decode) for c in cells) == sorted(
        (n, s, d) for n in ("rmsnorm", "layernorm") for s in (0, 1) for d in (True, False))
    assert len({c.run_id for c in cells}) == 8


@pytest.mark.parametrize("text,needle", [
    (BASE.replace("[grid]", "[eval]\ndecod = false\n[grid]"), "did you mean 'decode'"),
    (BASE.replace("[grid]", '[eval]\ndecode = "no"\n[grid]'), "eval.decode must be bool"),
    (BASE + '"eval.extrapolate" = [false]\n', "did you mean 'extrapolation'"),
])
def test_unknown_or_mistyped_eval_keys_are_errors(registry, text, needle):
    with pytest.raises(ConfigError) as err:
        grid_of(text, registry)
    assert needle in str(err.value)
