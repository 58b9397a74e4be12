"""Every cell of a comparison is scored on the same validation targets: whatever its number of
processes (abl.train.loop.evaluate), and never a longer-context loss on a task (abl.grid.validation)."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pytest
import torch
from conftest import run_abl

from abl.contracts.config import ConfigError
from abl.data.corpus import Batches, TokenData
from abl.grid.gridfile import expand
from abl.plugins.probes import MQAR
from abl.train.taskdata import TaskBatches

TASK_GRID = {
    "experiment": {"name": "probe_t", "seeds": [0]},
    "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "context": 32},
    "train": {"steps": 6, "batch_size": 8, "warmup_steps": 1, "eval_every": 3, "eval_batches": 2},
    "data": {"dataset": "mqar"},
    "dataset": {"mqar": {"vocab_size": 64, "num_kv_pairs": 4, "eval_kv_pairs": [2, 4]}},
    "eval": {"decode": False, "extrapolation": True},
}


def _text_data(n_val=3000, vocab=48):
    rng = np.random.default_rng(0)
    return TokenData(rng.integers(0, vocab, 5000).astype(np.uint16), rng.integers(0, vocab, n_val).astype(np.uint16),
                     vocab, "x", "random", "bytes", val_bytes=np.ones(n_val, dtype=np.uint8))


# ------------------------------------------------------------ extrapolation on a task


def test_extrapolation_on_a_task_is_refused_before_training(registry):
    with pytest.raises(ConfigError, match="dataset 'mqar' is a task.*set eval.extrapolation = false"):
        expand(TASK_GRID, registry)
    text = {**TASK_GRID, "data": {"dataset": "pystdlib"}, "dataset": {"pystdlib": {"max_bytes": 100_000}}}
    assert expand(text, registry).cells[0].eval.extrapolation  # text data keeps it


def test_abl_run_exits_2_on_extrapolation_over_a_task(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text('[experiment]\nname = "t"\nseeds = [0]\n[model]\ncontext = 32\n[data]\ndataset = "mqar"\n'
                    '[eval]\nextrapolation = true\n')
    db = tmp_path / "x.duckdb"
    r = run_abl(["run", str(grid), "--db", str(db)])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "is a task" in r.stderr and "Traceback" not in r.stderr and not db.exists()


# ------------------------------------------------------------ the same windows for any number of processes


def test_validation_windows_are_the_global_batch_whatever_the_process_count():
    data = _text_data()
    one = Batches(data, 16, 8, seed=0)
    ranks = [Batches(data, 16, 4, seed=0, stream=r, val_batch_size=8) for r in range(2)]
    whole = torch.cat([y for _, y in one.val_batches(3)])
    for b in ranks:  # every process sees every window, in pieces of its own batch size
        pieces = list(b.val_batches(3))
        assert all(x.size(0) == 4 for x, _ in pieces)
        assert torch.equal(torch.cat([y for _, y in pieces]), whole)
        assert torch.equal(b.val_targets(3), one.val_targets(3))
        assert b.val_target_counts(3) == one.val_target_counts(3) == (3 * 8 * 16, 3 * 8 * 16)


def test_task_validation_examples_are_the_global_batch_whatever_the_process_count():
    task = MQAR(vocab_size=64, num_kv_pairs=4)
    one = TaskBatches(task, 32, 8, seed=0)
    rank = TaskBatches(task, 32, 4, seed=0, stream=1, val_batch_size=8)
    assert torch.equal(torch.cat([y for _, y in rank.val_batches(2)]), torch.cat([y for _, y in one.val_batches(2)]))
    assert torch.equal(rank.val_targets(2), one.val_targets(2))


def test_evaluate_on_one_process_is_the_mean_of_its_batch_means(registry):
    """The batch means are sums over scored targets / their count: on text, the mean cross-entropy."""
    from abl.contracts.precision import Precision
    from abl.model.decoder import DecoderLM, ForwardContext
    from abl.train.loop import evaluate

    cell = expand({"experiment": {"name": "e", "seeds": [0]},
                   "model": {"d_model": 32, "n_layers": 1, "n_heads": 4, "context": 16, "vocab_size": 48},
                   "dataset": {"pystdlib": {"max_bytes": 100_000}}}, registry).cells[0]
    torch.manual_seed(0)
    model = DecoderLM(cell.model, cell.components, registry)
    batches = Batches(_text_data(), 16, 4, seed=0)
    with torch.no_grad():
        losses = []
        for x, y in batches.val_batches(3):
            logits, _, _ = model(x, ctx=ForwardContext(position=model.position))
            losses.append(float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())))
    assert evaluate(model, batches, 3, Precision(), torch.device("cpu")) == pytest.approx(np.mean(losses), rel=1e-5)


DDP_GRID = """
[experiment]
name = "ddp_scoring"
seeds = [0]
[model]
d_model = 32
n_layers = 1
n_heads = 4
context = 32
[train]
steps = 2
batch_size = 4
lr = 0.0
eval_every = 50
eval_batches = 3
threads = 1
[eval]
decode = false
extrapolation = true
[dataset.pystdlib]
max_bytes = 300000
[grid]
"train.devices" = [1, 2]
"""


@pytest.mark.slow
def test_a_ddp_cell_is_scored_on_the_windows_of_its_single_process_twin(tmp_path):
    """At lr 0 the model stays at its seeded initialisation, the same under 1 and 2 processes: its
    val_loss may differ only if the windows scored differ (they did: 2 processes scored half of them)."""
    grid = tmp_path / "g.toml"
    grid.write_text(DDP_GRID)
    db = tmp_path / "x.duckdb"
    r = run_abl(["run", str(grid), "--db", str(db)], timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    con = duckdb.connect(str(db), read_only=True)
    try:
        got = con.execute("SELECT r.env, m.name, m.value FROM runs r JOIN metrics m USING (run_id) "
                          "WHERE m.name IN ('val_loss', 'val_loss_x1', 'val_loss_x2', 'val_loss_x4')").fetchall()
    finally:
        con.close()
    by_processes: dict[int, dict] = {}
    for env, name, value in got:
        info = json.loads(env)
        by_processes.setdefault(info["processes"], {"scored_targets": info["scored_targets"]})[name] = value
    assert set(by_processes) == {1, 2}
    one, two = by_processes[1], by_processes[2]
    assert one["scored_targets"] == two["scored_targets"]  # the same targets, fingerprinted on rank 0
    assert set(one) == set(two) == {"scored_targets", "val_loss", "val_loss_x1", "val_loss_x2", "val_loss_x4"}
    for name in ("val_loss", "val_loss_x1", "val_loss_x2", "val_loss_x4"):
        assert two[name] == pytest.approx(one[name], rel=1e-5), name
