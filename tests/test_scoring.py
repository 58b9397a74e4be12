"""Every cell of a comparison is scored on the same validation targets: whatever its number of
processes (abl.run.train.evaluate), and never a longer-context loss on a task (abl.grid.validation)."""

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
from abl.run.taskdata import TaskBatches

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
    from abl.run.train import evaluate

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
        got = con.execute("SELECT r.env, m.value FROM runs r JOIN metrics m USING (run_id) "
                          "WHERE m.name = 'val_loss'").fetchall()
    finally:
        con.close()
    by_processes = {json.loads(env)["processes"]: v for env, v in got}
    assert set(by_processes) == {1, 2}
    assert by_processes[2] == pytest.approx(by_processes[1], rel=1e-5)


# ------------------------------------------------------------ the fingerprint of the scored targets


def _cell(registry, **model):
    grid = {"experiment": {"name": "f", "seeds": [0]},
            "model": {"d_model": 32, "n_layers": 1, "n_heads": 4, "context": 16, "position": "rope", **model},
            "train": {"steps": 2, "batch_size": 4, "eval_every": 2, "eval_batches": 2, "threads": 1},
            "eval": {"decode": False, "extrapolation": True},
            "dataset": {"pystdlib": {"max_bytes": 100_000}}}
    return expand(grid, registry).cells[0]


def test_scored_targets_fingerprints_say_what_each_figure_is_scored_on(registry):
    from abl.data.corpus import targets_fingerprint
    from abl.model.decode import extrapolation_ends, scored_targets
    from abl.run.evaluations import scored_targets_fingerprints

    cell, data = _cell(registry), _text_data()
    one = scored_targets_fingerprints(Batches(data, 16, 4, seed=0), cell, "corpus")
    ddp = scored_targets_fingerprints(Batches(data, 16, 2, seed=0, stream=1, val_batch_size=4), cell, "corpus")
    assert one == ddp and set(one) == {"val_loss", "val_bpb", "extrapolation"}
    assert one["val_loss"] == targets_fingerprint(Batches(data, 16, 4, seed=0).val_targets(2))
    ends = extrapolation_ends(len(data.val), 16, 2 * 4)
    assert one["extrapolation"] == targets_fingerprint(scored_targets(Batches(data, 16, 4, 0).val, 16, ends))
    # other windows (another global batch), or the same offsets of other text: other fingerprints
    other = scored_targets_fingerprints(Batches(data, 16, 8, seed=0), cell, "corpus")
    assert other["val_loss"] != one["val_loss"] and other["extrapolation"] != one["extrapolation"]
    assert scored_targets_fingerprints(Batches(data, 16, 4, seed=0), cell, "another")["val_bpb"] != one["val_bpb"]
    cell.eval.extrapolation = False
    assert "extrapolation" not in scored_targets_fingerprints(Batches(data, 16, 4, seed=0), cell, "corpus")


def test_a_run_stores_its_scored_targets_in_its_info(registry):
    from abl.run.train import train

    class Sink:
        def log(self, step, metrics):
            pass

    infos = []
    train(_cell(registry), registry, Sink(), on_info=infos.append)
    fps = infos[0]["scored_targets"]
    assert set(fps) == {"val_loss", "val_bpb", "extrapolation"}
    assert all(isinstance(v, str) and len(v) == 64 for v in fps.values())


def _records(targets_b):
    from abl.analysis.verdicts import RunRecord

    out = []
    for cell, (offset, fp) in {"a": (0.0, "f" * 64), "b": (0.1, targets_b)}.items():
        for seed in range(3):
            out.append(RunRecord(cell, cell, seed, "completed", {"model": {"context": 16}}, "data",
                                 {"val_loss": 2.0 + offset + 0.01 * seed, "val_bpb": 3.0 + offset},
                                 scored_targets={"val_loss": fp, "val_bpb": "e" * 64} if fp else {}))
    return out


def test_a_comparison_across_different_scored_targets_is_flagged_with_the_reason():
    from abl.analysis.verdicts import NOT_COMPARABLE, analyse_runs

    _, analysis, _ = analyse_runs(_records("0" * 64), metric="val_loss", baseline="a")
    (row,) = analysis.comparisons
    assert row.verdict == NOT_COMPARABLE and "scored on different validation targets" in row.note
    assert "00000000" in row.note and "ffffffff" in row.note
    # the same targets, or runs that do not say: judged as before
    for fp in ("f" * 64, None):
        _, analysis, _ = analyse_runs(_records(fp), metric="val_loss", baseline="a")
        assert analysis.comparisons[0].verdict != NOT_COMPARABLE
    # the fingerprint of the figure compared: here the bytes of val_bpb are the same
    _, analysis, _ = analyse_runs(_records("0" * 64), metric="val_bpb", baseline="a")
    assert analysis.comparisons[0].verdict != NOT_COMPARABLE
    # a figure not scored on validation targets (speed) is never flagged
    _, analysis, _ = analyse_runs(_records("0" * 64), metric="wall_s", baseline="a")
    assert analysis.comparisons[0].verdict != NOT_COMPARABLE


def test_the_report_shows_length_extrapolation_with_its_reason():
    from types import SimpleNamespace

    from abl.analysis.metrics import label
    from abl.present.report.document import Doc
    from abl.present.report.runs import Run, group_cells
    from abl.present.report.sections import extrapolation_section

    def run(cell, seed, final):
        return Run(f"{cell}{seed}", "e", cell, cell, seed, "completed", {}, "c", {}, "cpu", {}, "d", "", "",
                   final=final)

    runs = [run("alibi", s, {"val_loss_x1": 3.0 + s, "val_loss_x2": 2.9 + s, "val_loss_x4": 2.8 + s})
            for s in range(2)] + [run("learned", 0, {"val_loss_x1": 3.2})]
    ctx = SimpleNamespace(doc=Doc(), cells=group_cells(runs), cond="conditions")
    extrapolation_section(ctx)
    text = ctx.doc.markdown()
    assert "Length extrapolation" in text and label("val_loss_x2") in text
    assert "3.5000" in text and "-0.1000" in text and "-0.2000" in text  # alibi: the means and the change
    assert "same target tokens" in text and "cannot reach that length" in text
    quiet = SimpleNamespace(doc=Doc(), cells=group_cells([run("x", 0, {"val_loss": 3.0})]), cond="")
    extrapolation_section(quiet)
    assert "extrapolation" not in quiet.doc.markdown()
