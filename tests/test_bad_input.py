"""Bad input: exit status 2, one clear message, no traceback, store untouched."""

import os

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from abl.cli import cli
from abl.config import ConfigError, expand, parse_toml_text

GOOD = """[experiment]
name = "bad"
seeds = [0]
[model]
d_model = 32
n_layers = 2
n_heads = 4
context = 32
[train]
steps = 2
[grid]
"model.norm" = ["rmsnorm", "layernorm"]
"""

# (name, grid text, words the message must contain)
CASES = [
    ("toml syntax", GOOD.replace("d_model = 32", "d_model = = 32"), ["bad.toml:5:", "TOML syntax error"]),
    ("unclosed table", GOOD.replace("[train]", "[train"), ["TOML syntax error"]),
    ("unknown table", GOOD.replace("[train]", "[trian]"), ["unknown table 'trian'", "did you mean 'train'"]),
    ("unknown key", GOOD.replace("d_model", "d_modle"), ["did you mean 'd_model'"]),
    ("wrong type", GOOD.replace("d_model = 32", 'd_model = "wide"'), ["d_model must be int"]),
    ("bool for int", GOOD.replace("n_layers = 2", "n_layers = true"), ["n_layers must be int"]),
    ("out of range", GOOD.replace("n_layers = 2", "n_layers = 0"), ["n_layers must be >= 1"]),
    ("negative lr", GOOD.replace("steps = 2", "steps = 2\nlr = -1.0"), ["lr must be >= 0"]),
    ("probability > 1", GOOD.replace("steps = 2", "steps = 2\nbeta2 = 1.5"), ["beta2 must be <= 1"]),
    ("unknown component", GOOD.replace('"layernorm"]', '"layernrom"]'), ["unknown norm 'layernrom'",
                                                                          "Closest match: 'layernorm'"]),
    ("unknown param", GOOD + "[norm.rmsnorm]\nepsilon = 1e-5\n", ["did you mean 'eps'"]),
    ("param wrong type", GOOD + "[norm.rmsnorm]\neps = \"small\"\n", ["eps must be float"]),
    ("kv heads", GOOD + "[mixer.mha]\nn_kv_heads = 3\n", ["not divisible by n_kv_heads=3"]),
    ("d_model vs heads", GOOD.replace("n_heads = 4", "n_heads = 5"), ["not divisible by model.n_heads=5"]),
    ("odd rope head dim", GOOD.replace("d_model = 32", "d_model = 36"), ["RoPE needs an even head dim"]),
    ("empty grid", GOOD + 'exclude = [{ "model.d_model" = 32 }]\n', ["the grid is empty"]),
    ("grid value not list", GOOD.replace('["rmsnorm", "layernorm"]', '"rmsnorm"'), ["must be a non-empty list"]),
    ("grid empty list", GOOD.replace('["rmsnorm", "layernorm"]', "[]"), ["must be a non-empty list"]),
    ("grid unknown path", GOOD + '"model.n_layer" = [1]\n', ["unknown key 'model.n_layer'", "did you mean 'n_layers'"]),
    ("exclude malformed", GOOD + "exclude = [1, 2]\n", ["grid.exclude must be a list of tables"]),
    ("seeds not list", GOOD.replace("seeds = [0]", "seeds = 3"), ["seeds must be a non-empty list"]),
    ("duplicate seeds", GOOD.replace("seeds = [0]", "seeds = [1, 1]"), ["duplicates"]),
    ("section not table", "train = 3\n" + GOOD.replace("[train]\nsteps = 2\n", ""), ["[train] must be a table"]),
    ("bad device", GOOD.replace("steps = 2", 'steps = 2\ndevice = "tpu"'), ["train.device must be"]),
    ("bad kernels", GOOD.replace("steps = 2", 'steps = 2\nkernels = "cuda"'), ["kernels must be one of"]),
    ("batch vs devices", GOOD.replace("steps = 2", "steps = 2\nbatch_size = 5\ndevices = 2"),
     ["not divisible by train.devices=2"]),
    ("unknown pattern mixer", GOOD.replace("context = 32", 'context = 32\nlayer_pattern = "mha,mambo"'),
     ["unknown mixer 'mambo'"]),
    ("unknown precision", GOOD.replace("steps = 2", 'steps = 2\nprecision = "fp7"'), ["unknown precision 'fp7'"]),
    ("dataset param type", GOOD + "[dataset.pystdlib]\nmax_bytes = \"lots\"\n", ["max_bytes must be int"]),
    ("db outside tree", GOOD.replace('name = "bad"', 'name = "bad"\ndb = "../elsewhere.duckdb"'),
     ["points outside the working directory"]),
    ("db absolute", GOOD.replace('name = "bad"', 'name = "bad"\ndb = "/var/x.duckdb"'),
     ["points outside the working directory"]),
]


@pytest.mark.parametrize("name,text,needles", CASES, ids=[c[0] for c in CASES])
def test_malformed_grid_exits_2_without_traceback(tmp_path, name, text, needles):
    grid = tmp_path / "bad.toml"
    grid.write_text(text)
    db = tmp_path / "store.duckdb"
    result = CliRunner().invoke(cli, ["run", str(grid), "--db", str(db)])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in result.output, result.output
    assert not db.exists() and not (tmp_path / "runs").exists()


def test_too_many_cells_and_unreadable_files(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(GOOD)
    r = CliRunner().invoke(cli, ["run", str(grid), "--max-cells", "1", "--db", str(tmp_path / "x.duckdb")])
    assert r.exit_code == 2 and "more than --max-cells=1" in r.output
    grid.write_bytes(b"\xff\xfe\x00garbage")
    r = CliRunner().invoke(cli, ["run", str(grid), "--db", str(tmp_path / "x.duckdb")])
    assert r.exit_code == 2 and "cannot read" in r.output


def test_existing_store_is_untouched_by_bad_input(tmp_path):
    import duckdb

    db = tmp_path / "x.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE keep (x INTEGER)")
    con.close()
    before = db.read_bytes()
    grid = tmp_path / "bad.toml"
    grid.write_text(GOOD.replace("n_heads = 4", "n_heads = 5"))
    r = CliRunner().invoke(cli, ["run", str(grid), "--db", str(db)])
    assert r.exit_code == 2
    assert db.read_bytes() == before


scalars = st.one_of(st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=8), st.booleans(),
                    st.lists(st.integers(-2, 2), max_size=3))
keys = st.sampled_from(["experiment", "model", "train", "data", "grid", "norm", "mixer", "d_model", "seeds",
                        "n_heads", "steps", "model.norm", "exclude", "rmsnorm", "eps", "name", "x"])
documents = st.recursive(scalars, lambda inner: st.dictionaries(keys, inner, max_size=5), max_leaves=20)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_random_structures_only_raise_config_errors(registry, doc):
    if not isinstance(doc, dict):
        doc = {"model": doc}
    try:
        expand(doc, registry, max_cells=50)
    except ConfigError:
        pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_toml_only_raises_config_errors(registry, data):
    pos = data.draw(st.integers(0, len(GOOD)))
    junk = data.draw(st.text(alphabet='[]="{},.#\n 0123456789abcxyz', max_size=6))
    cut = data.draw(st.integers(0, 4))
    text = GOOD[:pos] + junk + GOOD[pos + cut:]
    try:
        expand(parse_toml_text(text, "fuzz.toml"), registry, max_cells=50)
    except ConfigError:
        pass
