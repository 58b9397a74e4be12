"""train.compile: the compiled training path, its compile time kept apart from tokens/s."""

import math

import pytest

torch = pytest.importorskip("torch")

from conftest import ListSink, tiny_grid_raw, tiny_grid_text  # noqa: E402

from abl.grid.gridfile import expand  # noqa: E402
from abl.train.loop import train  # noqa: E402


def grid(compile_):
    """One cell of the tiny grid (tests/conftest.py), two heads of 8, compiled or not."""
    return tiny_grid_raw(experiment={"name": "t"}, model={"d_model": 16, "n_heads": 2},
                         train={"steps": 4, "eval_every": 4, "compile": compile_, "warmup_steps": 0}, grid=None)


def test_compiled_cell_trains_like_the_eager_one_and_records_compile_time_apart(registry):
    from torch._dynamo.utils import counters

    eager, compiled = ListSink(), ListSink()
    train(expand(grid(False), registry).cells[0], registry, eager)
    counters.clear()
    summary = train(expand(grid(True), registry).cells[0], registry, compiled)
    assert not counters["graph_break"], dict(counters["graph_break"])  # one graph, no fallbacks
    assert not eager.series("compile_s")
    [(step, compile_s)] = compiled.series("compile_s")
    assert step == 0 and compile_s > 0
    # the same losses (same init, data order and RNG: the compile warm-up left them untouched)
    a = [v for _, v in eager.series("train_loss")]
    b = [v for _, v in compiled.series("train_loss")]
    assert len(a) == len(b) == 4
    assert all(math.isclose(x, y, rel_tol=1e-4) for x, y in zip(a, b)), (a, b)
    # step 2 is timed too (no memory tracker under compile), and no step time holds the compile
    tps = [v for _, v in compiled.series("tokens_per_s")]
    assert len(tps) == 4
    step_s = [2 * 16 / v for v in tps]
    assert max(step_s) < compile_s
    [(_, rate)] = compiled.series("train_tokens_per_s")
    assert rate > 2 * 16 * 4 / compile_s  # the loop's rate does not include compile time
    assert "mfu" in summary or any("mfu" in n for n in summary["notes"])


def test_the_cells_true_rate_is_recorded_once_beside_the_step_rates(registry):
    sink = ListSink()
    train(expand(grid(False), registry).cells[0], registry, sink)
    [(step, rate)] = sink.series("train_tokens_per_s")
    assert step == 4 and rate > 0
    steps = [v for _, v in sink.series("tokens_per_s")]
    # the true rate covers every step and the evaluation: never above the fastest step's rate
    assert rate <= max(steps)


def test_compile_with_several_processes_is_refused_before_training(tmp_path):
    from conftest import run_abl

    g = tmp_path / "g.toml"
    g.write_text('[experiment]\nname = "c"\n[train]\ncompile = true\ndevices = 2\n')
    r = run_abl(["run", str(g), "--db", str(tmp_path / "x.duckdb")])
    assert r.returncode == 2 and "train.compile = true needs train.devices = 1" in r.stderr + r.stdout
    assert not (tmp_path / "x.duckdb").exists()


def test_one_abl_run_compares_eager_and_compiled_with_compile_time_apart(tmp_path):
    from conftest import run_abl

    g = tmp_path / "g.toml"
    g.write_text(tiny_grid_text(experiment={"name": "c"}, model={"d_model": 16, "n_heads": 2},
                                train={"steps": 3, "eval_every": 3, "threads": None}, grid={"train.compile": [False, True]}))
    r = run_abl(["run", str(g), "--db", str(tmp_path / "x.duckdb")], env={"COLUMNS": "250"})
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("torch.compile time")]
    assert len(lines) == 1 and "compile=true" in lines[0], r.stdout  # labels as the grid writes values (abl.grid.labels)
    import duckdb

    con = duckdb.connect(str(tmp_path / "x.duckdb"), read_only=True)
    got = con.execute("SELECT json_extract(r.config, '$.train.compile')::BOOLEAN, m.value FROM runs r "
                      "JOIN metrics m USING (run_id) WHERE m.name = 'train_tokens_per_s'").fetchall()
    con.close()
    assert sorted(c for c, _ in got) == [False, True] and all(v > 0 for _, v in got)
