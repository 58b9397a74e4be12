"""train.lr_sweep: every cell at every LR on the tuning seed, then each variant at its own best LR."""

import json
import math
import time

import pytest

from abl.run.executors import Executor

GRID = """
[experiment]
name = "sweep"
seeds = [0, 1, 2, 3]
[model]
d_model = 32
n_heads = 4
n_layers = 2
context = 16
[train]
steps = 10
batch_size = 4
lr_sweep = [1e-3, 3e-3, 1e-2]
[grid]
"model.ffn" = ["gelu", "swiglu"]
"""

# the loss each variant reaches at each LR: gelu likes 3e-3, swiglu likes 1e-2; swiglu at 3e-3 (the
# LR a single shared setting might have used) looks worse than gelu
LOSS = {("gelu", 1e-3): 2.3, ("gelu", 3e-3): 2.0, ("gelu", 1e-2): 2.6,
        ("swiglu", 1e-3): 2.4, ("swiglu", 3e-3): 2.1, ("swiglu", 1e-2): 1.9}


class FakeExecutor(Executor):
    """Writes what a worker would, with the loss from LOSS (plus a small seed effect); no training."""

    name = "fake"

    def __init__(self, loss=None, fail=()):
        self.running = []
        self.trained = []
        self.loss = loss or LOSS
        self.fail = set(fail)  # ffn names whose runs end "failed"

    def run(self, jobs, on_progress, on_done, poll_s=0.2, on_launch=None):
        for job in jobs:
            if on_launch is not None:  # the runner sets the folder up as the worker starts
                on_launch(job)
            c = job.cell
            self.trained.append((c.experiment.name, c.model.ffn, c.train.lr, c.seed))
            final = self.loss[(c.model.ffn, round(c.train.lr, 6))] + 0.01 * math.sin(3 * c.seed) + 0.001 * c.seed
            lines = [{"step": 0, "n_params": 1000.0}] + \
                    [{"step": s, "train_loss": final + 1 / s} for s in range(1, 11)] + \
                    [{"step": 10, "val_loss": final, "wall_s": 1.0, "peak_mem_bytes": 1e6}]
            (job.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
            (job.run_dir / "info.json").write_text(json.dumps({"data_fingerprint": "f" * 64,
                                                               "unigram_floor": 3.26}))
            status = "failed" if c.model.ffn in self.fail else "completed"
            (job.run_dir / "status.json").write_text(json.dumps({"status": status, "started": time.time(),
                                                                 "finished": time.time()}))
            on_done(job)

    def stop_all(self):
        pass


def test_each_variant_is_compared_at_its_own_best_lr(tmp_path, monkeypatch):
    from rich.console import Console

    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid
    from abl.run.lr_sweep import run_sweep

    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.toml").write_text(GRID)
    reg = get_registry()
    grid = load_grid(tmp_path / "g.toml", reg)
    ex = FakeExecutor()
    console = Console(record=True, width=250)
    db = tmp_path / "r" / "abl.duckdb"
    assert run_sweep(grid, reg, db, tmp_path / "r" / "runs", executor=ex, console=console) == 0
    tuning = [t for t in ex.trained if t[0] == "sweep.lr_tuning"]
    final = [t for t in ex.trained if t[0] == "sweep"]
    # phase 1: 2 variants x 3 LRs on seed 0; phase 2: each variant at its best LR on seeds 1-3
    assert sorted(tuning) == sorted(("sweep.lr_tuning", f, lr, 0) for f in ("gelu", "swiglu")
                                    for lr in (1e-3, 3e-3, 1e-2))
    assert sorted(final) == sorted([("sweep", "gelu", 3e-3, s) for s in (1, 2, 3)]
                                   + [("sweep", "swiglu", 1e-2, s) for s in (1, 2, 3)])
    text = console.export_text()
    assert "lr sweep" in text and "2.0000 *" in text and "1.9000 *" in text
    # the summary says which LR each variant got, and compares them (swiglu at its LR wins)
    from click.testing import CliRunner

    from abl.cli import cli

    r = CliRunner().invoke(cli, ["compare", "sweep", "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)[0]
    labels = {c["label"]: c for c in out["cells"]}
    assert set(labels) == {"ffn=gelu, lr=0.003", "ffn=swiglu, lr=0.01"}
    assert labels["ffn=swiglu, lr=0.01"]["rank"] == 1 and labels["ffn=swiglu, lr=0.01"]["n"] == 3
    # --by model.ffn pairs the variants although their LRs differ (the LR was tuned, not chosen)
    r = CliRunner().invoke(cli, ["compare", "sweep", "--db", str(db), "--json", "--by", "model.ffn"])
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.output)[0]["comparisons"]) == 1
    # the run summary's lr column
    assert "lr" in text and "0.01" in text
    # running it again trains nothing
    ex2 = FakeExecutor()
    assert run_sweep(grid, reg, db, tmp_path / "r" / "runs", executor=ex2, console=Console(width=250)) == 0
    assert ex2.trained == []


@pytest.mark.parametrize("sets, message", [
    (["experiment.seeds=[0]"], "needs at least 2 seeds"),
    (["train.lr_sweep=[1e-3, -1.0]"], "positive learning rates"),
    (["train.lr_sweep=[1e-3, 1e-3]"], "duplicates"),
    (['grid.train.lr=[1e-3, 3e-3]'], "both a grid axis"),
    (['experiment.summary=[]'], "experiment.summary"),
    (['experiment.summary="val_loss"'], "experiment.summary"),
    (["train.lr_tuning_seeds=3", "experiment.seeds=[0, 1, 2]"], "needs at least 4 seeds"),
    (["train.lr_tuning_seeds=0"], "lr_tuning_seeds"),
    (["grid.train.lr_tuning_seeds=[1, 2]"], "cannot be a grid axis"),
])
def test_bad_sweeps_and_summaries_are_refused_before_training(tmp_path, sets, message):
    from abl.contracts.config import ConfigError
    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid

    (tmp_path / "g.toml").write_text(GRID)
    with pytest.raises(ConfigError) as exc:
        load_grid(tmp_path / "g.toml", get_registry(), sets)
    assert message in str(exc.value)


def test_shipped_grids_name_their_summary_metrics():
    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid

    reg = get_registry()
    assert load_grid("ablations/position.toml", reg).cells[0].experiment.summary == \
        ["val_loss", "val_loss_x1", "val_loss_x2", "val_loss_x4"]
    assert "kv_bytes_per_token" in load_grid("ablations/attention.toml", reg).cells[0].experiment.summary


def test_dry_run_shows_the_tuning_phase(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from abl.cli import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.toml").write_text(GRID)
    r = CliRunner().invoke(cli, ["run", "g.toml", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "phase 1" in r.output and "6 runs" in r.output and "train.lr" in r.output
    assert not (tmp_path / "results").exists()


def test_a_variant_that_learned_at_no_lr_is_compared_flagged(tmp_path, monkeypatch):
    """A variant at its floor at every lr of the sweep (on MQAR: a mixer that never leaves the no-recall
    baseline) is the finding, not a failure: phase 2 trains it at its lowest tuning loss, with a warning,
    and it is flagged "did not learn" there."""
    from rich.console import Console

    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid
    from abl.run.lr_sweep import run_sweep

    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.toml").write_text(GRID)
    reg = get_registry()
    grid = load_grid(tmp_path / "g.toml", reg)
    stuck = {k: 3.3 for k in LOSS}  # every tuning run at the unigram floor (3.26): none learned
    stuck[("gelu", 3e-3)] = 2.5  # except gelu at 3e-3
    stuck[("swiglu", 1e-2)] = 3.28  # swiglu's least bad
    ex = FakeExecutor(stuck)
    console = Console(record=True, width=250)
    failures = run_sweep(grid, reg, tmp_path / "r" / "abl.duckdb", tmp_path / "r" / "runs", executor=ex,
                         console=console)
    assert failures == 0
    assert sorted(t[1:] for t in ex.trained if t[0] == "sweep") == sorted(
        [("gelu", 3e-3, s) for s in (1, 2, 3)] + [("swiglu", 1e-2, s) for s in (1, 2, 3)])
    text = console.export_text()
    assert "did not learn at any lr of the sweep (ffn=swiglu)" in text
    assert "3.2800 (did not learn) *" in text  # the tuning table shows the loss it was chosen by
    assert "edge of" not in text  # gelu's best is inside the sweep; swiglu's "best" is no tuning result


def test_a_variant_without_a_completed_tuning_run_is_left_out(tmp_path, monkeypatch):
    from rich.console import Console

    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid
    from abl.run.lr_sweep import run_sweep

    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.toml").write_text(GRID)
    reg = get_registry()
    ex = FakeExecutor(LOSS, fail={"swiglu"})
    console = Console(record=True, width=250)
    failures = run_sweep(load_grid(tmp_path / "g.toml", reg), reg, tmp_path / "r" / "abl.duckdb",
                         tmp_path / "r" / "runs", executor=ex, console=console)
    assert failures == 3 + 1  # swiglu's 3 tuning runs, and swiglu left without a learning rate
    assert sorted(t[1:] for t in ex.trained if t[0] == "sweep") == [("gelu", 3e-3, s) for s in (1, 2, 3)]
    assert "left out of phase 2" in console.export_text()


# ---------------------------------------------------------------- warnings (issue 26)


def test_too_few_comparison_seeds_warn_and_dry_run_says_so(tmp_path, monkeypatch):
    """With 3 seeds one tunes and 2 remain: fewer than the statistics need for a verdict
    (abl.analysis.stats.MIN_SEEDS), so every comparison would end "too few seeds to decide"."""
    from click.testing import CliRunner

    from abl.analysis.stats.power import MIN_SEEDS
    from abl.cli import cli
    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid
    from abl.run.lr_sweep import seed_warnings

    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.toml").write_text(GRID.replace("seeds = [0, 1, 2, 3]", "seeds = [0, 1, 2]"))
    grid = load_grid(tmp_path / "g.toml", get_registry())
    (warning,) = seed_warnings(grid)
    assert "2 seed(s)" in warning and f"at least {MIN_SEEDS}" in warning and "too few seeds to decide" in warning
    assert "no axis can get a verdict either" in warning  # one axis, 2 runs per level
    # a product grid can still decide an axis from 2 seeds pooled over the other axis: the warning says so
    product = GRID.replace("seeds = [0, 1, 2, 3]", "seeds = [0, 1, 2]")
    product = product.replace('[grid]', '[grid]\n"model.norm" = ["rmsnorm", "layernorm", "scalenorm"]', 1)
    (tmp_path / "p.toml").write_text(product)
    (w,) = seed_warnings(load_grid(tmp_path / "p.toml", get_registry()))
    assert "the design can still decide" in w and "model.norm (levels" in w
    r = CliRunner().invoke(cli, ["run", "g.toml", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "warning" in r.output and "too few seeds to decide" in r.output
    # enough seeds: no warning
    enough = GRID.replace("seeds = [0, 1, 2, 3]", f"seeds = {list(range(MIN_SEEDS + 1))}")
    (tmp_path / "g.toml").write_text(enough)
    assert seed_warnings(load_grid(tmp_path / "g.toml", get_registry())) == []
    r = CliRunner().invoke(cli, ["run", "g.toml", "--dry-run"])
    assert r.exit_code == 0 and "too few seeds" not in r.output


def test_a_best_lr_at_an_edge_of_the_sweep_warns():
    """Both variants picking the top edge (1e-2, as in the issue) says the sweep may not contain the best
    learning rate; a best lr inside the sweep says nothing. A synthetic phase-1 result, no training."""
    from abl.run.lr_sweep import best_lrs, edge_warnings

    sweep = [1e-3, 3e-3, 1e-2]
    results = {'{"model.ffn": "relu"}': {1e-3: (2.6, ""), 3e-3: (2.4, ""), 1e-2: (2.27, "")},
               '{"model.ffn": "swiglu"}': {1e-3: (2.5, ""), 3e-3: (2.3, ""), 1e-2: (2.2, "")},
               '{"model.ffn": "gelu"}': {1e-3: (2.5, ""), 3e-3: (2.1, ""), 1e-2: (2.2, "")},
               '{"model.ffn": "geglu"}': {1e-3: (2.0, ""), 3e-3: (2.1, ""), 1e-2: (None, "did not learn")}}
    best, _ = best_lrs(results)
    warnings = edge_warnings(best, sweep)
    assert len(warnings) == 3
    text = "\n".join(warnings)
    assert "relu" in text and "swiglu" in text and "gelu" not in text.replace("geglu", "")
    assert "top edge" in text and "bottom edge" in text and "0.01" in text and "0.001" in text


def test_run_sweep_prints_the_edge_warning(tmp_path, monkeypatch):
    from rich.console import Console

    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid
    from abl.run.lr_sweep import run_sweep

    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.toml").write_text(GRID)
    reg = get_registry()
    console = Console(record=True, width=250)
    run_sweep(load_grid(tmp_path / "g.toml", reg), reg, tmp_path / "r" / "abl.duckdb", tmp_path / "r" / "runs",
              executor=FakeExecutor(), console=console)
    text = console.export_text()
    # swiglu's best (1e-2) is the sweep's top edge, gelu's (3e-3) is inside it
    edge = [line for line in text.splitlines() if "edge of" in line]
    assert edge and all("swiglu" in line for line in edge if "ffn=" in line)
    assert not any("gelu" in line for line in edge)


# ---------------------------------------------------------------- several tuning seeds (issue 24)


def test_two_tuning_seeds_refuse_an_lr_that_learned_on_one_seed_only(tmp_path, monkeypatch):
    """The selective-copy failure, in small: swiglu's lowest loss on seed 0 is at 1e-2, the edge of its
    stability, where seed 1 never leaves the plateau. One tuning seed picks 1e-2 and phase 2 inherits the
    failure; with train.lr_tuning_seeds = 2 the lr that learned on both seeds (3e-3) is chosen, phase 2 runs
    on the seeds after both, and the table shows each seed's loss."""
    from rich.console import Console

    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid
    from abl.run.lr_sweep import run_sweep

    class Unstable(FakeExecutor):
        def run(self, jobs, on_progress, on_done, poll_s=0.2, on_launch=None):
            for job in jobs:
                c = job.cell
                self.loss = dict(LOSS)
                if c.seed in (1, 4) and c.model.ffn == "swiglu":
                    self.loss[("swiglu", 1e-2)] = 3.3  # at the unigram floor (3.26): did not learn
                super().run([job], on_progress, on_done, poll_s, on_launch)

    monkeypatch.chdir(tmp_path)
    reg = get_registry()
    one = GRID.replace("seeds = [0, 1, 2, 3]", "seeds = [0, 1, 2, 3, 4]")
    (tmp_path / "one.toml").write_text(one)
    ex = Unstable()
    run_sweep(load_grid(tmp_path / "one.toml", reg), reg, tmp_path / "a.duckdb", tmp_path / "a", executor=ex,
              console=Console(width=250))
    assert sorted(t[2:] for t in ex.trained if t[0] == "sweep" and t[1] == "swiglu") == \
        [(1e-2, s) for s in (1, 2, 3, 4)]  # one tuning seed: the unstable edge, failing on seeds 1 and 4

    two = one.replace("lr_sweep = [", "lr_tuning_seeds = 2\nlr_sweep = [")
    (tmp_path / "two.toml").write_text(two)
    grid = load_grid(tmp_path / "two.toml", reg)
    ex = Unstable()
    console = Console(record=True, width=250)
    assert run_sweep(grid, reg, tmp_path / "b.duckdb", tmp_path / "b", executor=ex, console=console) == 0
    assert sorted(t[1:] for t in ex.trained if t[0] == "sweep.lr_tuning") == sorted(
        (f, lr, s) for f in ("gelu", "swiglu") for lr in (1e-3, 3e-3, 1e-2) for s in (0, 1))
    assert sorted(t[1:] for t in ex.trained if t[0] == "sweep") == sorted(
        [("gelu", 3e-3, s) for s in (2, 3, 4)] + [("swiglu", 3e-3, s) for s in (2, 3, 4)])
    text = console.export_text()
    assert "seeds [0, 1]" in text and "phase 2 trains each variant at its own best lr on seeds [2, 3, 4]" in text
    assert "did not learn on seed 1" in text  # swiglu at 1e-2: the mean, why it lost, and each seed's loss
    assert "[1.9000, 3.3" in text and "tuning seeds 0, 1, then each seed's in brackets" in text
    # the phase-2 runs record the tuning seeds; a tuning run of seed 0 has the run id it has with one
    # tuning seed (nothing in its config says how many seeds tuned), so a store's seed-0 runs are reused
    from abl.run.lr_sweep import final_grid, tuning_grid

    final = final_grid(grid, reg, {'{"model.ffn": "gelu"}': 3e-3})
    assert final.cells and all(c.config["lr_tuned"]["tuning_seeds"] == [0, 1] for c in final.cells)
    ids_one = {c.run_id for c in tuning_grid(load_grid(tmp_path / "one.toml", reg), reg).cells}
    ids_two = {c.run_id for c in tuning_grid(grid, reg).cells if c.seed == 0}
    assert ids_one == ids_two


def test_over_seeds_rules():
    from abl.run.lr_sweep import DID_NOT_LEARN_WHY, best_lrs, over_seeds

    assert over_seeds({0: (2.0, ""), 1: (2.2, "")}) == (pytest.approx(2.1), "")
    assert over_seeds({0: (2.0, ""), 1: (None, "diverged")}) == (None, "diverged on seed 1")
    assert over_seeds({0: (2.0, "")}) == (2.0, "")
    assert over_seeds({0: (3.3, DID_NOT_LEARN_WHY)}) == (3.3, DID_NOT_LEARN_WHY)
    assert over_seeds({0: (1.0, ""), 1: (3.0, DID_NOT_LEARN_WHY)}) == (2.0, "did not learn on seed 1")
    # a lower mean that did not learn on one seed loses to an lr that learned on both; with none that
    # learned on both, the lowest mean of the completed ones is taken (and is flagged did-not-learn)
    best, _ = best_lrs({"v": {1e-2: over_seeds({0: (0.0, ""), 1: (1.0, DID_NOT_LEARN_WHY)}),
                              3e-3: over_seeds({0: (1.2, ""), 1: (1.2, "")})}})
    assert best == {"v": 3e-3}
    best, _ = best_lrs({"v": {1e-2: over_seeds({0: (0.0, ""), 1: (1.0, DID_NOT_LEARN_WHY)}),
                              3e-3: over_seeds({0: (3.2, DID_NOT_LEARN_WHY), 1: (3.2, DID_NOT_LEARN_WHY)})}})
    assert best == {"v": 1e-2}


def test_dry_run_and_design_count_only_the_comparison_seeds(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from abl.cli import cli
    from abl.contracts.plugin_manager import get_registry
    from abl.grid.design import compared_seeds
    from abl.grid.gridfile import load_grid
    from abl.run.lr_sweep import seed_warnings

    monkeypatch.chdir(tmp_path)
    text = GRID.replace("lr_sweep = [", "lr_tuning_seeds = 2\nlr_sweep = [")
    (tmp_path / "g.toml").write_text(text)
    grid = load_grid(tmp_path / "g.toml", get_registry())
    assert compared_seeds(grid) == [2, 3]
    (w,) = seed_warnings(grid)  # 2 comparison seeds left: too few
    assert "seeds [0, 1] tune" in w and "[2, 3]" in w
    r = CliRunner().invoke(cli, ["run", "g.toml", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "seeds [0, 1]" in r.output and "12 runs" in r.output and "on seeds [2, 3]" in r.output
    # without a sweep lr_tuning_seeds changes nothing, run ids included
    plain = load_grid(tmp_path / "g.toml", get_registry(), ["train.lr_sweep=[]"])
    base = load_grid(tmp_path / "g.toml", get_registry(), ["train.lr_sweep=[]", "train.lr_tuning_seeds=1"])
    assert [c.run_id for c in plain.cells] == [c.run_id for c in base.cells]


def test_tuning_seeds_without_a_sweep_warn(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from abl.cli import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.toml").write_text(GRID.replace("lr_sweep = [1e-3, 3e-3, 1e-2]", "lr_tuning_seeds = 2"))
    r = CliRunner().invoke(cli, ["run", "g.toml", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "lr_tuning_seeds = 2 has no effect without train.lr_sweep" in r.output
    (tmp_path / "g.toml").write_text(GRID.replace("lr_sweep = [", "lr_tuning_seeds = 2\nlr_sweep = ["))
    r = CliRunner().invoke(cli, ["run", "g.toml", "--dry-run"])
    assert r.exit_code == 0 and "has no effect" not in r.output


def test_compare_and_report_of_a_sweep_grid_read_its_phase_2_as_it_resolves_now(tmp_path, monkeypatch):
    """`abl compare GRID` and `abl report GRID` of an lr-sweep grid read the phase-2 runs the store's tuning
    runs choose for the grid as it is now: not every run of the experiment (a store that ran the grid
    before with other seeds holds phase-2 runs of another config), and not nothing (the grid's own cells
    carry the sweep, so their run ids never match a phase-2 run: `abl report` found no run at all)."""
    from click.testing import CliRunner
    from rich.console import Console

    from abl.cli import cli
    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid
    from abl.run.lr_sweep import run_sweep

    monkeypatch.chdir(tmp_path)
    reg = get_registry()
    db, runs = tmp_path / "r" / "abl.duckdb", tmp_path / "r" / "runs"
    (tmp_path / "old.toml").write_text(GRID)
    run_sweep(load_grid(tmp_path / "old.toml", reg), reg, db, runs, executor=FakeExecutor(), console=Console(width=250))
    new = GRID.replace("seeds = [0, 1, 2, 3]", "seeds = [0, 1, 2, 3, 4]").replace(
        "lr_sweep = [", "lr_tuning_seeds = 2\nlr_sweep = [")
    (tmp_path / "g.toml").write_text(new)
    run_sweep(load_grid(tmp_path / "g.toml", reg), reg, db, runs, executor=FakeExecutor(), console=Console(width=250))
    r = CliRunner().invoke(cli, ["compare", "g.toml", "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    cells = json.loads(r.output)[0]["cells"]
    assert sorted(c["label"] for c in cells) == ["ffn=gelu, lr=0.003", "ffn=swiglu, lr=0.01"]
    assert all(c["n"] == 3 for c in cells)  # seeds 2-4 of this config, not seeds 1-3 of the old one too
    r = CliRunner().invoke(cli, ["report", "g.toml", "--db", str(db), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "| 2 | ffn=swiglu | swiglu | 0.01 | 3/3 | completed |" in text and "seeds 2,3,4" in text
    # --dry-run --detect sizes the seeds from the same phase-2 runs (it found none before)
    r = CliRunner().invoke(cli, ["run", "g.toml", "--db", str(db), "--dry-run", "--detect", "0.05"])
    assert r.exit_code == 0 and "seeds per cell needed to detect" in r.output and "over 2 cells" in r.output, r.output
    # the experiment name still reads every run of it, both configs
    r = CliRunner().invoke(cli, ["compare", "sweep", "--db", str(db), "--json"])
    assert r.exit_code == 0 and len(json.loads(r.output)[0]["cells"]) == 4
    # before phase 1 has run, the grid has no run to read: a clear message, exit 2
    (tmp_path / "none.toml").write_text(new.replace('name = "sweep"', 'name = "fresh"'))
    for cmd in ("compare", "report"):
        r = CliRunner().invoke(cli, [cmd, "none.toml", "--db", str(db)])
        assert r.exit_code == 2 and "abl run none.toml first" in r.output, r.output
