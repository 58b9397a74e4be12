"""The cost model against the built model: exact parameters, FLOPs within 5% of torch's flop counter.

Adapts to whatever is registered: every component on the model axes that
declares a cost function is checked, inside a model whose other parts are the
defaults (or, on an axis where nothing declares a cost yet, a stub defined here).
"""

import dataclasses
import json

import pytest
import torch
import torch.nn as nn

from abl.contracts.cost import Cost
from abl.contracts.registry import AXES, Registry
from abl.grid.gridfile import expand
from abl.model import costmodel
from abl.model.decoder import DecoderLM, ForwardContext, PositionEncoding, residual_out

MODEL_AXES = ("norm", "block", "position", "mixer", "ffn")
BASE_MODEL = {"d_model": 32, "n_layers": 2, "n_heads": 4, "context": 16, "vocab_size": 64}


# ---------------------------------------------------------------- stubs with known costs


class StubMixer(nn.Module):
    """y = W x (one d x d projection per copy)."""

    def __init__(self, cfg, position, copies: int = 1):
        super().__init__()
        self.projs = nn.ModuleList(residual_out(nn.Linear(cfg.d_model, cfg.d_model, bias=False))
                                   for _ in range(copies))

    def forward(self, x, ctx):
        return sum(p(x) for p in self.projs)


def stub_mixer_cost(cfg, copies=1):
    d = cfg.d_model
    return Cost(params=copies * d * d, flops_per_token=copies * 2.0 * d * d,
                activation_elements_per_token=d, state_elements_per_token=2 * d)


class StubFFN(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, 2 * cfg.d_model, bias=True)
        self.down = residual_out(nn.Linear(2 * cfg.d_model, cfg.d_model, bias=False))

    def forward(self, x, ctx=None):
        return self.down(torch.relu(self.up(x)))


def stub_ffn_cost(cfg):
    d = cfg.d_model
    return Cost(params=2 * d * d + 2 * d + 2 * d * d, flops_per_token=8.0 * d * d,
                activation_elements_per_token=5 * d)


class StubNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * self.weight


class StubBlock(nn.Module):
    final_norm = True

    def __init__(self, cfg, make_norm, make_mixer, make_ffn):
        super().__init__()
        self.n1, self.n2 = make_norm(cfg.d_model), make_norm(cfg.d_model)
        self.mixer, self.ffn = make_mixer(), make_ffn()

    def forward(self, x, ctx):
        x = x + self.mixer(self.n1(x), ctx)
        return x + self.ffn(self.n2(x), ctx)


class StubPosition(PositionEncoding):
    def __init__(self, cfg):
        super().__init__()


STUBS = {
    "norm": ("test_stub_norm", StubNorm, lambda dim: Cost(params=dim, activation_elements_per_token=dim)),
    "block": ("test_stub_block", StubBlock, lambda cfg: Cost(norms=2)),
    "position": ("test_stub_position", StubPosition, lambda cfg: Cost()),
    "mixer": ("test_stub_mixer", StubMixer, stub_mixer_cost),
    "ffn": ("test_stub_ffn", StubFFN, stub_ffn_cost),
}


def _with_costs(reg):
    return {axis: [n for n in reg.names(axis) if reg.get(axis, n).cost is not None] for axis in MODEL_AXES}


@pytest.fixture(scope="module")
def reg():
    """The real registry plus stubs: a stub mixer always (for hybrids), others where no component has a cost."""
    from abl.contracts.plugin_manager import get_registry

    base = get_registry()
    r = Registry(components=dict(base.components))
    have = _with_costs(base)
    for axis, (name, factory, cost) in STUBS.items():
        if axis == "mixer" or not have[axis]:
            r.register(axis, name, factory, params={"copies": 1} if axis == "mixer" else None, cost=cost,
                       plugin="test")
    r.register("mixer", "test_stub_nocost", StubMixer, params={"copies": 1}, plugin="test_plugin")
    r.register("mixer", "test_stub_badcost", StubMixer, params={"copies": 1}, cost=lambda cfg, copies: 42,
               plugin="test_plugin")
    return r


def _default(reg, axis, preferred):
    names = _with_costs(reg)[axis]
    return preferred if preferred in names else next(n for n in names if not n.startswith("test_stub_bad"))


def make_cell(reg, select=None, model=None, train=None, params=None):
    raw_model = dict(BASE_MODEL)
    for axis, pref in (("norm", "rmsnorm"), ("block", "pre"), ("position", "rope"), ("mixer", "mha"),
                       ("ffn", "gelu")):
        raw_model[axis] = _default(reg, axis, pref)
    raw = {"experiment": {"name": "cost-test"}, "model": raw_model, "train": {"batch_size": 2, **(train or {})}}
    for axis, name in (select or {}).items():
        sec, key = AXES[axis][0].split(".")
        raw.setdefault(sec, {})[key] = name
    raw["model"].update(model or {})
    for path, value in (params or {}).items():
        axis, name, p = path.split(".")
        raw.setdefault(axis, {}).setdefault(name, {})[p] = value
    return expand(raw, reg).cells[0]


def cost_components():
    """(axis, name) of every registered model component that declares a cost (collection time)."""
    from abl.contracts.plugin_manager import get_registry

    reg = get_registry()
    return [(a, n) for a in MODEL_AXES for n in reg.names(a) if reg.get(a, n).cost is not None]


COMPONENTS = cost_components()


def _cell_or_skip(reg, axis, name, **kw):
    from abl.contracts.config import ConfigError

    try:
        return make_cell(reg, select={axis: name}, **kw)
    except ConfigError as exc:  # the component needs a config this tiny base does not give
        pytest.skip(f"{axis} {name!r} is not valid in the tiny test config: {exc.messages[0]}")


# ---------------------------------------------------------------- exactness


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("axis,name", COMPONENTS, ids=[f"{a}-{n}" for a, n in COMPONENTS])
def test_predicted_params_equal_the_built_models(reg, axis, name, tie):
    cell = _cell_or_skip(reg, axis, name, model={"tie_embeddings": tie})
    pred = costmodel.predict(cell, reg)
    model = DecoderLM(cell.model, cell.components, reg)
    assert pred["n_params"] == model.n_params()
    assert pred["n_params_non_embedding"] == model.n_params(non_embedding=True)


@pytest.mark.parametrize("axis,name", COMPONENTS, ids=[f"{a}-{n}" for a, n in COMPONENTS])
def test_predicted_flops_per_step_within_5_percent_of_the_flop_counter(reg, axis, name):
    from abl.model import flops
    cell = _cell_or_skip(reg, axis, name)
    pred = costmodel.predict(cell, reg)
    torch.manual_seed(0)
    model = DecoderLM(cell.model, cell.components, reg)
    x = torch.randint(0, cell.model.vocab_size, (cell.train.batch_size, cell.model.context))
    # torch's counter plus the CPU flash-attention formulas it lacks (abl.model.flops)
    with flops.flop_counter() as fc:
        _, loss, _ = model(x, x)
        loss.backward()
    measured = fc.get_total_flops()
    assert measured == pytest.approx(pred["flops_per_step"], rel=0.05), (
        f"{axis} {name!r}: flop counter {measured:,} vs predicted {pred['flops_per_step']:,.0f} "
        f"(forward predicted {pred['forward_flops_per_step']:,.0f})")


def _measured_step_peak(reg, cell):
    """peak_tensor_bytes of one training step after a first one (the optimizer state exists), as train() does."""
    from abl.model.memory import StepMemory
    from abl.train.optim import make_optimizer

    torch.manual_seed(0)
    model = DecoderLM(cell.model, cell.components, reg)
    spec = cell.components["precision"]
    precision = reg.get("precision", spec["name"]).factory(**spec["params"])
    cpu = torch.device("cpu")
    precision.setup(model, cpu)
    opt = make_optimizer(model, cell.train)
    x = torch.randint(0, cell.model.vocab_size, (cell.train.batch_size, cell.model.context))
    for _ in range(2):
        with StepMemory(model, opt, x) as mem:
            with precision.autocast(cpu):
                _, loss, _ = model(x, x, ForwardContext(position=model.position, need_logits=False))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return mem.peak


MEMORY_CASES = COMPONENTS + [("precision", n) for n in ("fp32", "bf16", "fp16", "fp8")]


@pytest.mark.parametrize("axis,name", MEMORY_CASES, ids=[f"{a}-{n}" for a, n in MEMORY_CASES])
def test_predicted_peak_memory_within_the_documented_band(reg, axis, name):
    """The prediction (torch reference path) against torch's MemTracker over one whole step."""
    cell = _cell_or_skip(reg, axis, name, model={"context": 32}, train={"batch_size": 4})
    pred = costmodel.predict(cell, reg)["train_peak_bytes"]
    peak = _measured_step_peak(reg, cell)
    lo, hi = costmodel.MEMORY_BAND
    assert lo <= peak / pred <= hi, f"{axis} {name!r}: measured {peak:,} / predicted {pred:,.0f} = {peak / pred:.3f}"


def test_hybrid_layer_pattern_costs_each_layers_own_mixer(reg):
    other = _default(reg, "mixer", "mha")
    cell = make_cell(reg, model={"n_layers": 4, "layer_pattern": f"test_stub_mixer,{other}"})
    pred = costmodel.predict(cell, reg)
    model = DecoderLM(cell.model, cell.components, reg)
    assert pred["n_params"] == model.n_params()
    mixers = [p for p in pred["parts"] if p["axis"] == "mixer"]
    assert sorted(p["count"] for p in mixers) == [2, 2]
    assert {p["name"].split(":")[0] for p in mixers} == {"layers 0,2", "layers 1,3"}


def test_mixer_cost_is_counted_per_layer_with_its_decoding_cache(reg):
    one = make_cell(reg, select={"mixer": "test_stub_mixer"}, model={"n_layers": 3})
    pred = costmodel.predict(one, reg)
    d = BASE_MODEL["d_model"]
    mixer = next(p for p in pred["parts"] if p["axis"] == "mixer")
    assert (mixer["count"], mixer["params"], mixer["flops_per_token"]) == (3, d * d, 2.0 * d * d)
    assert pred["kv_cache_bytes_per_token"] == 3 * 2 * d * 4  # 3 layers x 2d elements x fp32
    assert pred["decode_cache_bytes_per_sequence"] == pred["kv_cache_bytes_per_token"] * BASE_MODEL["context"]


# ---------------------------------------------------------------- conventions


def test_training_flops_are_forward_times_one_plus_backward_factor_and_useful_caps_recompute(reg):
    r = Registry(components=dict(reg.components))
    r.register("mixer", "test_recompute", StubMixer, params={"copies": 1}, plugin="test",
               cost=lambda cfg, copies: Cost(params=cfg.d_model ** 2, flops_per_token=100.0,
                                             useful_flops_per_token=60.0, backward_factor=2.5))
    cell = make_cell(r, select={"mixer": "test_recompute"})
    base = make_cell(r, select={"mixer": "test_stub_mixer"})
    p, q = costmodel.predict(cell, r), costmodel.predict(base, r)
    n = cell.model.n_layers
    other_fwd = q["flops_per_token"] - n * 2.0 * 32 * 32
    assert p["flops_per_token"] == pytest.approx(other_fwd + n * 100.0)
    assert p["train_flops_per_token"] == pytest.approx(3 * other_fwd + n * 100.0 * 3.5)
    assert p["useful_train_flops_per_token"] == pytest.approx(3 * other_fwd + n * 60.0 * 3)
    assert p["flops_per_step"] == pytest.approx(p["train_flops_per_token"] * 2 * 16)


def test_lm_head_flops_and_tied_params(reg):
    d, v = BASE_MODEL["d_model"], BASE_MODEL["vocab_size"]
    tied = costmodel.predict(make_cell(reg, model={"tie_embeddings": True}), reg)
    untied = costmodel.predict(make_cell(reg, model={"tie_embeddings": False}), reg)
    assert untied["n_params"] - tied["n_params"] == v * d
    assert tied["n_params_non_embedding"] == untied["n_params_non_embedding"]
    assert tied["flops_per_token"] == untied["flops_per_token"]  # the head's matmul runs either way
    head = next(p for p in tied["parts"] if p["component"] == "lm_head")
    assert head["flops_per_token"] == 2.0 * d * v and head["params"] == 0


def test_memory_accounting_follows_the_seeds(reg):
    """fp32: 4 (weights) + 4 (grads) + 8 (AdamW) bytes per parameter; mixed: + 2 for autocast copies."""
    cell = make_cell(reg)
    n = costmodel.predict(cell, reg)["n_params"]
    fp32 = costmodel.predict(cell, reg, activation_bytes=4)
    half = costmodel.predict(cell, reg, activation_bytes=2)
    assert (fp32["param_bytes"], fp32["grad_bytes"], fp32["optimizer_bytes"]) == (4 * n, 4 * n, 8 * n)
    assert fp32["static_bytes"] == 16 * n and fp32["autocast_copy_bytes"] == 0
    assert half["static_bytes"] == 18 * n  # 2 (bf16 copy) + 12 (fp32 weights, Adam moments) + 4 (fp32 grads); ZeRO counts 16 with 2-byte grads (arXiv:1910.02054, sec. 3.1)
    v = cell.model.vocab_size
    # activations scale with the dtype except the fp32 log-softmax output of the loss (V per token)
    assert (fp32["activation_bytes_per_token"] - 4 * v) == pytest.approx(2 * (half["activation_bytes_per_token"] - 4 * v))
    assert fp32["activation_bytes_per_step"] == fp32["activation_bytes_per_token"] * 2 * 16
    # + the fp32 gradient of the logits that the loss's backward forms while its output is alive
    assert fp32["loss_backward_bytes"] == 4 * v * 2 * 16
    assert fp32["train_peak_bytes"] == (fp32["static_bytes"] + fp32["activation_bytes_per_step"]
                                        + fp32["loss_backward_bytes"])


def test_activation_dtype_comes_from_the_precision_policy(reg):
    """One answer: the policy's compute_dtype decides autocast, activation bytes and the peak format."""
    from abl.contracts.precision import Precision

    class Half(Precision):
        name = "test_half"
        compute_dtype = torch.bfloat16

    r = Registry(components=dict(reg.components))
    r.register("precision", "test_half", Half, plugin="test")
    r.register("precision", "test_plain", Precision, plugin="test")
    got = {name: costmodel.activation_dtype_bytes(make_cell(r, train={"precision": name}), r)
           for name in ("test_half", "test_plain", "fp16", "fp8")}
    assert got == {"test_half": 2, "test_plain": 4, "fp16": 2, "fp8": 2}
    with Half().autocast(torch.device("cpu")):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert (Half().peak_format(), Precision().peak_format()) == ("bf16", "fp32")


def test_vocab_size_zero_is_taken_from_the_dataset(reg, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(bytes(range(256)) * 4)
    cell = make_cell(reg, model={"vocab_size": 0})
    cell.components["dataset"] = {"name": "text_file", "params": {"path": str(corpus), "val_fraction": 0.1}}
    assert costmodel.predict(cell, reg)["vocab_size"] == 256
    assert costmodel.predict(cell, reg, vocab_size=300)["vocab_size"] == 300


# ---------------------------------------------------------------- errors


def test_a_component_without_a_cost_function_is_named(reg):
    cell = make_cell(reg, select={"mixer": "test_stub_nocost"})
    with pytest.raises(costmodel.CostModelError, match=r"mixer 'test_stub_nocost' \(plugin 'test_plugin'"):
        costmodel.predict(cell, reg)
    assert costmodel.missing_costs(cell.components, reg) == ["mixer 'test_stub_nocost'"]


def test_a_component_without_a_cost_function_is_measured_when_asked(reg):
    """predict(measure_missing=True): the model built once per shape and measured (abl.model.measuredcost)."""
    from abl.model import measuredcost
    from abl.model.decoder import DecoderLM

    cell = make_cell(reg, select={"mixer": "test_stub_nocost"})
    got = costmodel.predict(cell, reg, measure_missing=True)
    assert got["cost_source"] == "measured"
    model = DecoderLM(dataclasses.replace(cell.model, vocab_size=got["vocab_size"]), cell.components, reg)
    assert got["n_params"] == model.n_params()
    assert got["n_params_non_embedding"] == model.n_params(non_embedding=True)
    assert got["flops_per_step"] > got["forward_flops_per_step"] > 0
    assert got["train_peak_bytes"] > got["static_bytes"] > 0
    assert got["kv_cache_bytes_per_token"] is None  # not measured: no figure rather than a wrong one
    # once per shape: a second seed of the cell is not built again
    calls = []
    real = measuredcost._measure
    measuredcost._measure = lambda *a: calls.append(a) or real(*a)
    try:
        again = costmodel.predict(dataclasses.replace(cell, seed=cell.seed + 1), reg, measure_missing=True)
    finally:
        measuredcost._measure = real
    assert not calls and again["flops_per_step"] == got["flops_per_step"]
    # a cell whose components all declare a cost is predicted, as before
    assert costmodel.predict(make_cell(reg), reg, measure_missing=True)["cost_source"] == "predicted"


def test_a_run_without_a_cost_prediction_takes_its_counted_flops_for_mfu(reg):
    from abl.train.measure import measure_costs, mfu

    cell = make_cell(reg, select={"mixer": "test_stub_nocost"})
    precision = reg.get("precision", "fp32").factory()
    costs = measure_costs(None, cell, reg, None, precision, torch.device("cpu"), 1, counted=2.0e9)
    assert costs["useful_flops_per_step"] == 2.0e9
    assert "counted by torch" in costs["_note"]
    costs["device_peak_flops"] = 1.0e12
    assert mfu(costs, [0.5]) == pytest.approx(2.0e9 / 0.5 / 1.0e12)


def test_a_cost_function_returning_the_wrong_type_is_named(reg):
    cell = make_cell(reg, select={"mixer": "test_stub_badcost"})
    with pytest.raises(costmodel.CostModelError, match="test_stub_badcost.*returned int"):
        costmodel.predict(cell, reg)


def test_cost_model_errors_are_user_errors():
    from abl.contracts.registry import RegistryError

    assert issubclass(costmodel.CostModelError, RegistryError)


def test_agreement_verdicts():
    assert costmodel.agreement(10, 10, "exact")[1] == "agrees (exact)"
    assert costmodel.agreement(10, 11, "exact")[1] == "DISAGREES"
    assert costmodel.agreement(100, 104, 0.05)[1].startswith("agrees")
    assert costmodel.agreement(100, 106, 0.05)[1].startswith("DISAGREES")
    assert costmodel.agreement(100, None, 0.05) == (None, "not measured")


# ---------------------------------------------------------------- abl cost


GRID = """
[experiment]
name = "cost-cli"
seeds = [0, 1]
[model]
d_model = 32
n_layers = 2
n_heads = 4
context = 16
vocab_size = 64
[grid]
"model.n_layers" = [1, 2]
"""


def test_abl_cost_prints_the_predicted_table_without_training(tmp_path, monkeypatch):
    import json

    from click.testing import CliRunner

    from abl.cli import cli

    monkeypatch.chdir(tmp_path)
    grid = tmp_path / "g.toml"
    grid.write_text(GRID)
    r = CliRunner().invoke(cli, ["cost", str(grid), "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert len(rows) == 2  # one row per cell, not per seed
    assert rows[1]["n_params"] > rows[0]["n_params"]
    r = CliRunner().invoke(cli, ["cost", str(grid), "--set", "model.d_model=48"])
    assert r.exit_code == 0, r.output
    assert "train FLOP /step" in r.output and "est. peak" in r.output and "vocab 64" in r.output
    assert not (tmp_path / "results").exists()  # nothing trained, no database


@pytest.mark.parametrize("columns", ["60", "100", "200"])
def test_abl_cost_cuts_no_header_and_no_value(tmp_path, monkeypatch, columns):
    """The header read ``params+grad+a…`` in a narrow window: every header word and every value whole."""
    from click.testing import CliRunner

    from abl.cli import cli
    from abl.cli.cost import COMPUTE, MEMORY

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", columns)
    grid = tmp_path / "g.toml"
    grid.write_text(GRID.replace('"model.n_layers" = [1, 2]', '"model.n_layers" = [1, 2]\n'
                                 '"model.mixer" = ["mha", "sliding_window", "linear"]'))
    r = CliRunner().invoke(cli, ["cost", str(grid)], terminal_width=int(columns))
    assert r.exit_code == 0, r.output
    assert "…" not in r.output
    for col in (*COMPUTE, *MEMORY, "model.n_layers", "model.mixer", "sliding_window"):
        assert col in r.output, (col, r.output)


def test_decode_cache_says_fixed_size_not_zero():
    """A sliding window or a recurrent state has no per-token KV cache but is not "0 B"."""
    from abl.cli.cost import decode_cache_text

    assert decode_cache_text({"kv_cache_bytes_per_token": 2048, "state_bytes_per_sequence": 0}) == "2.0 KiB/tok"
    assert decode_cache_text({"kv_cache_bytes_per_token": 0, "state_bytes_per_sequence": 65536}) == \
        "64.0 KiB/seq fixed"
    assert decode_cache_text({"kv_cache_bytes_per_token": 512, "state_bytes_per_sequence": 1024}) == \
        "512 B/tok + 1.0 KiB/seq fixed"
    assert decode_cache_text({"kv_cache_bytes_per_token": 0, "state_bytes_per_sequence": 0}) == "none"


def _costless_mixer(tmp_path, forward="return self.p(x)"):
    plug = tmp_path / "plugs"
    plug.mkdir(exist_ok=True)
    (plug / "nocost.py").write_text(
        "import torch.nn as nn\n"
        "from abl.contracts.hookspecs import hookimpl\n"
        "class M(nn.Module):\n"
        "    def __init__(self, cfg, position):\n"
        "        super().__init__()\n"
        "        self.p = nn.Linear(cfg.d_model, cfg.d_model)\n"
        "    def forward(self, x, ctx):\n"
        f"        {forward}\n"
        "@hookimpl\n"
        "def register_components(register):\n"
        "    register('mixer', 'costless', M)\n")
    grid = tmp_path / "g.toml"
    grid.write_text(GRID.replace('vocab_size = 64', 'vocab_size = 64\nmixer = "costless"'))
    return plug, grid


def test_abl_cost_measures_a_component_without_cost(tmp_path):
    """cost= is optional (issue 25): such a cell is measured, and abl cost says so."""
    from conftest import run_abl

    plug, grid = _costless_mixer(tmp_path)
    r = run_abl(["--plugins-dir", str(plug), "cost", str(grid), "--json"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(r.stdout)
    assert rows and all(row["cost_source"] == "measured" for row in rows)
    r = run_abl(["--plugins-dir", str(plug), "cost", str(grid)], cwd=tmp_path)
    assert r.returncode == 0 and "mixer 'costless'" in r.stdout and "no cost" in r.stdout and "measured" in r.stdout


def test_abl_cost_names_a_component_whose_measurement_fails_and_exits_2(tmp_path):
    from conftest import run_abl

    plug, grid = _costless_mixer(tmp_path, forward="raise RuntimeError('broken mixer')")
    r = run_abl(["--plugins-dir", str(plug), "cost", str(grid)], cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "mixer 'costless'" in r.stderr and "no cost function" in r.stderr and "broken mixer" in r.stderr
    assert "Traceback" not in r.stderr
