"""Tasks in the harness (abl.data.tasks): batches with a loss mask, the loss on the marked positions
only, accuracy metrics at every evaluation, eval.probes, and a tiny grid end to end."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pytest
import torch
from conftest import run_abl
from conftest import ListSink

from abl.contracts.config import ConfigError
from abl.contracts.precision import Precision
from abl.data.tasks import IGNORE_INDEX
from abl.grid.gridfile import expand
from abl.plugins.probes import MQAR
from abl.train.taskdata import TaskBatches, accuracy_metrics, make_batches
from abl.train.loop import train

TASK_GRID = {
    "experiment": {"name": "probe_t", "seeds": [0]},
    "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "context": 32},
    "train": {"steps": 6, "batch_size": 8, "warmup_steps": 1, "eval_every": 3, "eval_batches": 2},
    "data": {"dataset": "mqar"},
    "dataset": {"mqar": {"vocab_size": 64, "num_kv_pairs": 4, "eval_kv_pairs": [2, 4]}},
    "eval": {"decode": False, "extrapolation": False},
}


def test_task_batches_are_seeded_and_masked():
    task = MQAR(vocab_size=64, num_kv_pairs=4)
    a, b, c = (TaskBatches(task, 32, 8, seed=s) for s in (0, 0, 1))
    xa, ya = a.next_train()
    xb, yb = b.next_train()
    xc, _ = c.next_train()
    assert xa.shape == ya.shape == (8, 32) and xa.dtype == ya.dtype == torch.int64
    assert torch.equal(xa, xb) and torch.equal(ya, yb) and not torch.equal(xa, xc)
    assert ((ya != IGNORE_INDEX).sum(dim=1) == 4).all()
    # validation examples depend on the task and the context only: the same for every seed
    va, vc = list(a.val_batches(2)), list(c.val_batches(2))
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(va, vc))
    assert len(a.val) >= 8 * 32  # the flat stream decode/extrapolation read
    # a checkpoint of the generator restores the training stream
    state = a.gen.get_state()
    x1, _ = a.next_train()
    a.gen.set_state(state)
    assert torch.equal(a.next_train()[0], x1)


def test_make_batches_dispatches_on_the_dataset_kind():
    from abl.data.corpus import Batches, from_documents

    text = from_documents([("a", b"x" * 500), ("b", b"y" * 500)], 0.5, "t")
    assert type(make_batches(text, 16, 2, 0)) is Batches
    assert isinstance(make_batches(MQAR(vocab_size=64, num_kv_pairs=2), 16, 2, 0), TaskBatches)


def test_the_loss_is_taken_on_the_marked_positions_only(registry):
    from abl.model.decoder import DecoderLM, ForwardContext

    cell = expand(TASK_GRID, registry).cells[0]
    cell.model.vocab_size = 64
    model = DecoderLM(cell.model, cell.components, registry)
    x, y = TaskBatches(MQAR(vocab_size=64, num_kv_pairs=4), 32, 4, seed=0).next_train()
    logits, loss, _ = model(x, y, ForwardContext(position=model.position))
    logits.retain_grad()
    loss.backward()
    mask = y != IGNORE_INDEX
    expected = torch.nn.functional.cross_entropy(logits[mask], y[mask])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    grad_rows = logits.grad.abs().sum(-1)
    assert (grad_rows[~mask] == 0).all() and (grad_rows[mask] > 0).all()


class OracleMQAR(torch.nn.Module):
    """Reads each query's value from the key-value prefix: the perfect MQAR model."""

    def __init__(self, pairs: int, vocab: int, wrong: bool = False):
        super().__init__()
        self.pairs, self.vocab, self.wrong = pairs, vocab, wrong
        self.position = None

    def forward(self, x, targets=None, ctx=None):
        keys, values = x[:, 0:2 * self.pairs:2], x[:, 1:2 * self.pairs:2]
        hit = x[:, :, None] == keys[:, None, :]  # [B, T, N]
        answer = (hit.float() * values[:, None, :].float()).max(-1).values.long()
        if self.wrong:
            answer = (answer + 1) % self.vocab
        return torch.nn.functional.one_hot(answer, self.vocab).float(), None, ctx


def test_accuracy_metrics_of_a_perfect_and_a_wrong_model():
    task = MQAR(vocab_size=64, num_kv_pairs=4, random_non_queries=False)
    batches = TaskBatches(task, 32, 8, seed=0)
    prec = Precision()
    good = accuracy_metrics(OracleMQAR(4, 64), batches, 16, prec, torch.device("cpu"), "mqar")
    floor = task.no_recall_baseline(32)
    assert good == {"mqar_accuracy_pairs_4": 1.0, "mqar_accuracy": 1.0, "mqar_example_accuracy": 1.0,
                    "mqar_no_recall_baseline_pairs_4": floor, "mqar_no_recall_baseline": floor}
    bad = accuracy_metrics(OracleMQAR(4, 64, wrong=True), batches, 16, prec, torch.device("cpu"), "mqar")
    assert bad["mqar_accuracy"] == 0.0 and bad["mqar_example_accuracy"] == 0.0


def test_training_on_a_task_records_accuracy_at_every_evaluation(registry):
    cell = expand(TASK_GRID, registry).cells[0]
    sink = ListSink()
    train(cell, registry, sink)
    for name in ("val_loss", "mqar_accuracy", "mqar_example_accuracy", "mqar_accuracy_pairs_2",
                 "mqar_accuracy_pairs_4"):
        series = sink.series(name)
        assert [s for s, _ in series] == [3, 6], name
        assert all(0.0 <= v <= (1.0 if "accuracy" in name else 10.0) for _, v in series)
    assert cell.model.vocab_size == 64  # taken from the task


def test_eval_probes_on_a_model_trained_on_text(registry):
    grid = {
        "experiment": {"name": "probe_text", "seeds": [0]},
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "context": 64},
        "train": {"steps": 3, "batch_size": 4, "warmup_steps": 1, "eval_every": 3, "eval_batches": 1},
        "dataset": {"pystdlib": {"max_bytes": 200_000}, "mqar": {"num_kv_pairs": 4, "eval_kv_pairs": [4, 8]}},
        "eval": {"decode": False, "extrapolation": False, "probes": ["mqar", "induction"]},
    }
    cell = expand(grid, registry).cells[0]
    assert [p["name"] for p in cell.config["probes"]] == ["mqar", "induction"]
    assert cell.config["probes"][0]["params"]["num_kv_pairs"] == 4
    sink = ListSink()
    summary = train(cell, registry, sink)
    final = {k: v for s, m in sink.rows if s == 3 for k, v in m.items()}
    for name in ("probe_mqar_accuracy", "probe_mqar_accuracy_pairs_4", "probe_mqar_accuracy_pairs_8",
                 "probe_mqar_example_accuracy", "probe_mqar_loss", "probe_induction_accuracy",
                 "probe_induction_loss"):
        assert name in final, name
    assert "mqar_accuracy" not in final  # the training data is text: no task metrics of its own
    # mqar's default 8192-token vocabulary does not fit the byte model: cut to 256, and said so
    assert any("cut from 8192 to the model's 256" in n for n in summary["notes"])


def test_eval_probes_validation(registry):
    base = {"model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "context": 64}}
    with pytest.raises(ConfigError, match="Closest match: 'mqar'"):
        expand({**base, "eval": {"probes": ["mqr"]}}, registry)
    with pytest.raises(ConfigError, match="'pystdlib' is not a task"):
        expand({**base, "eval": {"probes": ["pystdlib"]}}, registry)
    with pytest.raises(ConfigError, match="eval.probes must be list"):
        expand({**base, "eval": {"probes": "mqar"}}, registry)
    with pytest.raises(ConfigError, match="at least 4 x 32"):
        expand({**base, "eval": {"probes": ["mqar"]}, "dataset": {"mqar": {"num_kv_pairs": 32}}}, registry)
    # no probes: the config (and so every run id) is what it was before eval.probes existed
    a = expand(base, registry).cells[0]
    b = expand({**base, "eval": {"probes": []}}, registry).cells[0]
    assert a.run_id == b.run_id and "probes" not in a.config["eval"] and "probes" not in a.config


def test_a_task_that_does_not_fit_the_context_is_refused_before_training(registry):
    bad = json.loads(json.dumps(TASK_GRID))
    bad["dataset"]["mqar"]["num_kv_pairs"] = 9  # 4 x 9 > 32
    with pytest.raises(ConfigError, match="at least 4 x 9"):
        expand(bad, registry)


def test_tiny_grid_end_to_end_records_accuracy(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text("""
[experiment]
name = "probes_e2e"
[model]
d_model = 16
n_layers = 2
n_heads = 2
context = 32
[train]
steps = 4
batch_size = 4
warmup_steps = 1
eval_every = 2
eval_batches = 1
threads = 1
[data]
dataset = "mqar"
[dataset.mqar]
vocab_size = 64
num_kv_pairs = 2
[eval]
decode = false
extrapolation = false
[grid]
"model.mixer" = ["mha", "linear"]
""")
    db = tmp_path / "abl.duckdb"
    r = run_abl(["run", str(grid), "--db", str(db)], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mqar_accuracy" in r.stdout  # the summary reports accuracy per cell
    assert "no-recall baseline" in r.stdout and "did not learn" in r.stdout  # 4 steps: at MQAR's floor
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT name, count(*), count(DISTINCT run_id) FROM metrics "
                       "WHERE name LIKE 'mqar_%' GROUP BY name ORDER BY name").fetchall()
    assert rows == [("mqar_accuracy", 4, 2), ("mqar_accuracy_pairs_2", 4, 2), ("mqar_example_accuracy", 4, 2),
                    ("mqar_no_recall_baseline", 4, 2), ("mqar_no_recall_baseline_pairs_2", 4, 2)]
    # every run is flagged at its last step (accuracy, baseline and flag side by side in the store)
    flags = con.execute("SELECT count(*) FROM metrics WHERE name = 'did_not_learn' AND value = 1").fetchone()[0]
    assert flags == 2
    steps = {s for (s,) in con.execute("SELECT DISTINCT step FROM metrics WHERE name = 'mqar_accuracy'").fetchall()}
    assert steps == {2, 4}
    np.testing.assert_array_less(-1e-9, [v for (v,) in con.execute(
        "SELECT value FROM metrics WHERE name = 'mqar_accuracy'").fetchall()])


def test_the_recall_grid(registry):
    from conftest import ROOT

    from abl.grid.gridfile import load_grid

    from abl.run.lr_sweep import seed_warnings, tuning_grid

    grid = load_grid(ROOT / "ablations" / "recall.toml", registry)
    assert len(grid.cells) == 42 * 4  # 42 cells x seeds 0-3
    varied = {tuple(sorted(c.varied.items())) for c in grid.cells}
    assert len(varied) == 42
    # each mixer at its own learning rate (issue 26: at one shared lr 1e-2 attention stayed on the plateau),
    # with enough seeds left after the tuning seed for a verdict
    assert grid.cells[0].train.lr_sweep == [1e-3, 3e-3, 1e-2]
    assert seed_warnings(grid) == []
    assert len(tuning_grid(grid, registry).cells) == 42 * 3
    # the gated convolutions H3 and Hyena beside attention and the recurrent mixers (Zoology's gap)
    assert {c.model.layer_pattern for c in grid.cells} == {"mha", "linear", "mamba", "mamba2", "mamba2,mha",
                                                            "h3", "hyena"}
    assert len({c.model.d_model for c in grid.cells}) >= 3
    assert {c.components["dataset"]["params"]["num_kv_pairs"] for c in grid.cells} == {2, 4}
    assert all(c.components["dataset"]["name"] == "mqar" for c in grid.cells)


@pytest.mark.parametrize("task,params", [("induction", {"vocab_size": 16, "induction_len": 2}),
                                         ("selective_copy", {"vocab_size": 16, "n_tokens": 4}),
                                         ("copy", {"vocab_size": 16, "n_tokens": 4})])
def test_every_task_trains_and_records_its_accuracy(registry, task, params):
    grid = json.loads(json.dumps(TASK_GRID))
    grid["data"]["dataset"] = task
    grid["dataset"] = {task: params}
    grid["train"]["steps"] = 2
    grid["train"]["eval_every"] = 2
    cell = expand(grid, registry).cells[0]
    sink = ListSink()
    train(cell, registry, sink)
    final = {k: v for s, m in sink.rows if s == 2 for k, v in m.items()}
    assert 0.0 <= final[f"{task}_accuracy"] <= 1.0 and 0.0 <= final[f"{task}_example_accuracy"] <= 1.0
    assert 0.0 < final[f"{task}_no_recall_baseline"] < 1.0
    assert final["val_loss"] > 0
