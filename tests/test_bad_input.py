"""Bad input: exit status 2, one clear message, no traceback, store untouched."""

import os

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from abl.cli import cli
from abl.contracts.config import ConfigError
from abl.grid.gridfile import expand
from abl.grid.parsing import parse_toml_text

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
    # issue 13, 4: NaN and inf passed the min/max checks and reached the worker
    ("lr nan", GOOD.replace("steps = 2", "steps = 2\nlr = nan"), ["train.lr must be a finite number, got nan"]),
    ("lr inf", GOOD.replace("steps = 2", "steps = 2\nlr = inf"), ["train.lr must be a finite number, got inf"]),
    ("dropout nan", GOOD.replace("context = 32", "context = 32\ndropout = nan"),
     ["model.dropout must be a finite number"]),
    ("init_std inf", GOOD.replace("context = 32", "context = 32\ninit_std = inf"),
     ["model.init_std must be a finite number"]),
    ("component param nan", GOOD + "[norm.rmsnorm]\neps = nan\n", ["norm.rmsnorm.eps: eps must be a finite number"]),
    ("grid value -inf", GOOD + '"train.lr" = [3e-3, -inf]\n', ["train.lr must be a finite number, got -inf"]),
    # issue 13, 5: integers the store's columns cannot hold gave a DuckDB ConversionException
    ("seed 10**20", GOOD.replace("seeds = [0]", "seeds = [100000000000000000000]"),
     ["experiment.seeds: 100000000000000000000 is outside the store's 32-bit range"]),
    ("seed 2**31", GOOD.replace("seeds = [0]", "seeds = [2147483648]"), ["outside the store's 32-bit range"]),
    ("int over 64 bits", GOOD.replace("n_layers = 2", "n_layers = 100000000000000000000"),
     ["model.n_layers must fit in 64 bits"]),
    ("steps over the step column", GOOD.replace("steps = 2", "steps = 4294967296"),
     ["train.steps = 4294967296", "more than the store's step column holds"]),
    ("tokens over the step column", GOOD.replace("steps = 2", "tokens = 4611686018427387904"),
     ["more than the store's step column holds"]),
    # issue 13, 7: an empty grid file trained a default model
    ("empty file", "", ["the grid file is empty"]),
    ("comments only", "# nothing here\n\n", ["the grid file is empty"]),
    # issue 13, 9: a sweep over a parameter of a component no cell selects collapsed to one run
    ("sweep of an unselected component", GOOD.replace('"model.norm" = ["rmsnorm", "layernorm"]',
                                                      '"norm.rmsnorm.eps" = [1e-6, 1e-5]')
     .replace("context = 32", 'context = 32\nnorm = "layernorm"'),
     ["grid sweeps norm.rmsnorm.eps", "no cell selects norm 'rmsnorm'", "model.norm is 'layernorm'"]),
    ("sweep overridden by model.scale", GOOD.replace('"model.norm" = ["rmsnorm", "layernorm"]',
                                                     '"model.d_model" = [32, 64]')
     .replace("context = 32", 'context = 32\nscale = "xs"'),
     ["grid sweeps model.d_model", "every value resolves to the same run"]),
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


# ---------------------------------------------------------------- issue 13: every float, every check in the parent


def _float_fields():
    from abl.contracts.config import SECTIONS, section_params

    for section, cls in SECTIONS.items():
        for key, p in section_params(cls).items():
            if p.resolved_type() is float:
                yield f"{section}.{key}"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_every_float_config_field_refuses_non_finite_values(registry, value):
    fields = list(_float_fields())
    assert "train.lr" in fields and "model.dropout" in fields and len(fields) >= 10
    for path in fields:
        section, key = path.split(".")
        raw = {"experiment": {"name": "x"}, "model": {"d_model": 32, "n_heads": 4}, section: {key: value}}
        with pytest.raises(ConfigError) as err:
            expand(raw, registry)
        assert f"{path} must be a finite number" in str(err.value), path


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_every_float_component_parameter_refuses_non_finite_values(registry, value):
    from abl.contracts.registry import AXES

    seen = 0
    for comp in registry.all():
        for key, p in comp.params.items():
            if p.resolved_type() is not float:
                continue
            section, selector = AXES[comp.axis][0].split(".")
            raw = {"experiment": {"name": "x"}, "model": {"d_model": 32, "n_heads": 4},
                   section: {selector: comp.name}, comp.axis: {comp.name: {key: value}}}
            if section == "model":
                raw["model"][selector] = comp.name
            with pytest.raises(ConfigError) as err:
                expand(raw, registry)
            assert f"{comp.axis}.{comp.name}.{key}: {key} must be a finite number" in str(err.value), \
                (comp.axis, comp.name, key)
            seen += 1
    assert seen >= 20  # every built-in float parameter was tried


def test_an_override_of_a_float_is_checked_the_same_way(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(GOOD)
    r = CliRunner().invoke(cli, ["run", str(grid), "--db", str(tmp_path / "x.duckdb"), "--set", "train.lr=nan"])
    assert r.exit_code == 2 and "train.lr must be a finite number" in r.output
    assert not (tmp_path / "x.duckdb").exists()


BAD_DBS = [
    ("parent is a file", lambda t: t / "g.toml" / "x.duckdb", "is a file, not a folder"),
    ("grandparent is a file", lambda t: t / "g.toml" / "sub" / "x.duckdb", "is a file, not a folder"),
    ("a folder", lambda t: t, "is a folder"),
    ("not a database", lambda t: t / "g.toml", "is not a DuckDB database"),
    ("an empty file", lambda t: t / "empty.duckdb", "is an empty file"),
]


@pytest.mark.parametrize("name,make,needle", BAD_DBS, ids=[b[0] for b in BAD_DBS])
@pytest.mark.parametrize("command", ["run", "ingest"])
def test_a_bad_db_is_refused_before_anything_is_written(tmp_path, name, make, needle, command):
    grid = tmp_path / "g.toml"
    grid.write_text(GOOD)
    (tmp_path / "empty.duckdb").write_bytes(b"")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    db = make(tmp_path)
    args = ["run", str(grid), "--db", str(db)] if command == "run" else ["ingest", "--db", str(db)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2, r.output
    assert isinstance(r.exception, SystemExit) and "Traceback" not in r.output
    assert needle in r.output, r.output
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no lock file, no runs/, nothing


def test_only_a_held_lock_is_retried_when_opening_the_store(tmp_path, monkeypatch):
    """A bad database used to take 50 lock retries (5 s) before its error."""
    import duckdb

    from abl.store import database as store

    calls = []
    real = duckdb.connect

    def counting(*a, **kw):
        calls.append(a)
        return real(*a, **kw)

    monkeypatch.setattr(duckdb, "connect", counting)
    (tmp_path / "junk.duckdb").write_text("not a database")
    for bad in (tmp_path / "junk.duckdb", tmp_path):
        calls.clear()
        with pytest.raises(store.StoreError):
            store.connect(bad)
        assert len(calls) == 1, bad
    monkeypatch.setattr(store.time, "sleep", lambda s: None)
    con = real(str(tmp_path / "held.duckdb"))  # DuckDB's own lock, held by "another" connection
    try:
        import subprocess
        import sys

        code = ("import sys; from abl.store import database as store\n"
                "try:\n    store.connect(sys.argv[1], retries=3)\nexcept store.StoreError as e:\n    print(e)")
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "held.duckdb")], capture_output=True,
                             text=True, timeout=120)
        assert "Could not set lock" in out.stdout, out.stdout + out.stderr
    finally:
        con.close()


SWEPT = GOOD  # sweeps model.norm over ["rmsnorm", "layernorm"]


@pytest.mark.parametrize("value,extra", [("rmsnrom", ["unknown norm 'rmsnrom'", "Closest match: 'rmsnorm'"]),
                                         ("layernorm", [])], ids=["misspelled", "valid"])
def test_a_set_on_a_swept_key_is_refused_and_its_value_checked(tmp_path, value, extra):
    grid = tmp_path / "g.toml"
    grid.write_text(SWEPT)
    db = tmp_path / "x.duckdb"
    r = CliRunner().invoke(cli, ["run", str(grid), "--db", str(db), "--set", f"model.norm={value}"])
    assert r.exit_code == 2, r.output
    assert "the grid sweeps model.norm" in r.output
    assert f"--set 'grid.model.norm=[\"{value}\"]'" in r.output
    for needle in extra:
        assert needle in r.output
    if not extra:
        assert "unknown norm" not in r.output
    assert not db.exists() and not (tmp_path / "runs").exists()
    # the way the message shows works
    ok = CliRunner().invoke(cli, ["run", str(grid), "--db", str(db), "--dry-run",
                                  "--set", 'grid.model.norm=["layernorm"]'])
    assert ok.exit_code == 0, ok.output


def test_the_shipped_norms_grid_refuses_a_misspelled_swept_set():
    """The issue's example: abl run ablations/norms.toml --set model.norm=rmsnrom started all 26 runs."""
    r = CliRunner().invoke(cli, ["run", "ablations/norms.toml", "--dry-run", "--set", "model.norm=rmsnrom"])
    assert r.exit_code == 2 and "the grid sweeps model.norm" in r.output and "'rmsnorm'" in r.output


def test_a_sweep_that_only_some_cells_feel_is_allowed(registry):
    """README's example: norm.rmsnorm.eps applies only where rmsnorm is selected; that collapse is expected."""
    from abl.run import preflight

    raw = parse_toml_text(GOOD + '"norm.rmsnorm.eps" = [1e-6, 1e-5]\n', "g.toml")
    grid = expand(raw, registry)
    assert len(grid.cells) == 3 and preflight.grid_problems(grid, registry) == []
    # values narrowed by exclude on purpose are not a collapse either
    raw = parse_toml_text(GOOD + 'exclude = [{ "model.norm" = "layernorm" }]\n', "g.toml")
    grid = expand(raw, registry)
    assert len(grid.cells) == 1 and preflight.grid_problems(grid, registry) == []


def test_the_shipped_grids_pass_the_preflight(registry):
    from abl.grid.gridfile import load_grid, packaged_grids
    from abl.run import preflight

    for name, path in packaged_grids().items():
        assert preflight.grid_problems(load_grid(path, registry), registry) == [], name
