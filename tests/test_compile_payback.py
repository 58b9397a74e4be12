"""train.compile's payback (issue 27, 4): each shape's eager and compiled step times and its compile
time are kept in the shape cache, and a compiled cell whose steps cannot repay its compile says so, at
``abl run`` start, in ``abl run --dry-run`` and in its own notes. No real compile runs here (on CPU one
takes minutes): the figures are seeded, or torch.compile is the identity."""

import io
import statistics

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402
from conftest import tiny_grid_text  # noqa: E402

from abl.grid.gridfile import expand, load_grid  # noqa: E402
from abl.model.shapecache import StepTimes, payback_note  # noqa: E402
from abl.store.provenance import cpu_name as cpu_device  # noqa: E402
from abl.run.payback import timings_for  # noqa: E402
from abl.train.loop import train  # noqa: E402

# eager 30 ms a step, compiled 20 ms, 30 s to compile: 3000 steps repay it
EAGER, COMPILED, COMPILE_S = 0.030, 0.020, 30.0


def grid(compile_, steps=4):
    return {"experiment": {"name": "t", "seeds": [0]},
            "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
            "train": {"steps": steps, "batch_size": 2, "eval_every": steps, "eval_batches": 1, "threads": 1,
                      "compile": compile_, "warmup_steps": 0},
            "eval": {"decode": False, "extrapolation": False},
            "dataset": {"pystdlib": {"max_bytes": 300_000}}}


def grid_file(tmp_path, steps):
    path = tmp_path / "g.toml"
    path.write_text(tiny_grid_text(experiment={"name": "pay"}, model={"d_model": 16, "n_heads": 2},
                                   train={"steps": steps, "eval_every": steps, "warmup_steps": 0},
                                   grid={"train.compile": [False, True]}))
    return path


def seed(cell, shapes, registry, eager=EAGER, compiled=COMPILED, compile_s=COMPILE_S, device=None):
    timings = timings_for(cell, registry, shapes, gpu=False)
    device = device or cpu_device(1)
    if eager is not None:
        timings.put(device, "eager", {"step_s": eager})
    if compiled is not None:
        timings.put(device, "compiled", {"step_s": compiled, "compile_s": compile_s})


class Sink:
    def __init__(self):
        self.rows = []

    def log(self, step, metrics):
        self.rows.append((step, dict(metrics)))

    def values(self, name):
        return [m[name] for _, m in self.rows if name in m]


@pytest.fixture
def uncontended(monkeypatch):
    """This shared test machine may be busy: the cells' step times count as an idle machine's."""
    import abl.analysis.health

    monkeypatch.setattr(abl.analysis.health, "contended", lambda *a, **k: False)


def test_the_note_says_what_the_compile_costs_what_the_steps_save_and_what_would_repay_it():
    note = payback_note(50, EAGER, COMPILED, COMPILE_S)
    assert "compiling costs 30.0 s" in note and "50 steps save 0.5 s" in note
    assert "3000 steps would repay it" in note and "30 ms a step eager, 20 ms compiled" in note
    assert payback_note(3000, EAGER, COMPILED, COMPILE_S) is None
    assert payback_note(2999, EAGER, COMPILED, COMPILE_S) is not None
    slower = payback_note(10_000, 0.020, 0.025, 1.0)
    assert "save nothing" in slower and "no number of steps repays it" in slower


def test_a_gpu_cell_yet_to_start_takes_the_one_gpu_name_with_both_figures(registry, tmp_path, monkeypatch):
    """The GPU branch, with the device mocked (the parent starts no CUDA, so a cell's GPU name is not known
    before it runs): the note comes from the one GPU name that has both figures, and from none when two do."""
    import torch as torch_

    from abl.run.payback import planned_payback_notes, timings_for

    monkeypatch.setattr(torch_.cuda, "is_available", lambda: True)
    cells = load_grid(str(grid_file(tmp_path, steps=50)), registry, ["train.threads=0"]).cells
    compiled_cell = next(c for c in cells if c.train.compile)
    shapes = tmp_path / "shapes"
    gpu = timings_for(compiled_cell, registry, shapes, gpu=True)
    gpu.put("NVIDIA H100 80GB HBM3", "eager", {"step_s": EAGER})
    gpu.put("NVIDIA H100 80GB HBM3", "compiled", {"step_s": COMPILED, "compile_s": COMPILE_S})
    seed(compiled_cell, shapes, registry)  # CPU figures of the same shape are another device's: not used
    [note] = planned_payback_notes(cells, registry, shapes, use_gpus=True)
    assert "measured on NVIDIA H100 80GB HBM3" in note and "3000 steps would repay it" in note
    gpu.put("NVIDIA H200", "eager", {"step_s": EAGER})
    gpu.put("NVIDIA H200", "compiled", {"step_s": COMPILED, "compile_s": COMPILE_S})
    assert planned_payback_notes(cells, registry, shapes, use_gpus=True) == []  # which one is not known


def test_dry_run_notes_a_compiled_cell_whose_steps_cannot_repay_its_compile(registry, tmp_path):
    from abl.cli import cli

    db = tmp_path / "store" / "x.duckdb"
    g = grid_file(tmp_path, steps=50)
    cells = load_grid(str(g), registry, []).cells
    compiled_cell = next(c for c in cells if c.train.compile)

    args = ["run", str(g), "--db", str(db), "--dry-run"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert "compiling costs" not in r.output  # nothing measured yet: nothing said

    seed(compiled_cell, db.parent / "shapes", registry)
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    [line] = [ln for ln in r.output.splitlines() if "compiling costs" in ln]
    assert line.startswith("note: ") and "compile=true" in line
    assert "30.0 s" in line and "save 0.5 s" in line and "3000 steps would repay it" in line

    # 5000 steps save 50 s: they repay 30 s of compiling, and nothing is said
    g = grid_file(tmp_path, steps=5000)
    seed(next(c for c in load_grid(str(g), registry, []).cells if c.train.compile), db.parent / "shapes", registry)
    r = CliRunner().invoke(cli, ["run", str(g), "--db", str(db), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "compiling costs" not in r.output


def test_figures_of_another_thread_count_or_a_damaged_entry_give_no_note(registry, tmp_path):
    from abl.run.payback import planned_payback_notes

    cells = load_grid(str(grid_file(tmp_path, steps=50)), registry, []).cells
    compiled_cell = next(c for c in cells if c.train.compile)
    shapes = tmp_path / "shapes"
    seed(compiled_cell, shapes, registry, device=cpu_device(7))  # measured at 7 threads; the cell runs on 1
    assert planned_payback_notes(cells, registry, shapes) == []
    seed(compiled_cell, shapes, registry, compiled=None)  # eager only on 1 thread
    assert planned_payback_notes(cells, registry, shapes) == []
    seed(compiled_cell, shapes, registry, eager=None, compile_s=float("nan"))
    assert planned_payback_notes(cells, registry, shapes) == []
    seed(compiled_cell, shapes, registry, eager=None)
    [note] = planned_payback_notes(cells, registry, shapes)
    assert "3000 steps would repay it" in note


def test_abl_run_prints_the_note_as_it_starts(registry, tmp_path):
    from rich.console import Console

    from abl.run.executors import LocalExecutor
    from abl.run.runner import run_grid

    class Planned(LocalExecutor):  # the runner's start, without training the cells
        def run(self, jobs, on_progress, on_done, on_launch=None):
            self.planned = [j.cell for j in jobs]

    g = load_grid(str(grid_file(tmp_path, steps=50)), registry, [])
    db = tmp_path / "store" / "x.duckdb"
    seed(next(c for c in g.cells if c.train.compile), db.parent / "shapes", registry)
    out = io.StringIO()
    executor = Planned(workers=1)
    run_grid(g, registry, db, tmp_path / "runs", executor=executor, console=Console(file=out, width=300))
    assert len(executor.planned) == 2
    notes = [ln for ln in out.getvalue().splitlines() if ln.startswith("note: ") and "compiling costs" in ln]
    assert len(notes) == 1 and "3000 steps would repay it" in notes[0], out.getvalue()


def test_an_eager_cell_stores_its_median_step_time_where_its_compiled_twin_looks(registry, tmp_path, uncontended):
    eager_cell, compiled_cell = (expand(grid(c), registry).cells[0] for c in (False, True))
    sink = Sink()
    summary = train(eager_cell, registry, sink, shape_cache=tmp_path)
    assert not any("compiling costs" in n for n in summary["notes"])
    stored = timings_for(compiled_cell, registry, tmp_path, gpu=False).get(cpu_device(1), "eager")  # train.threads = 1
    # the timed steps' median (step 2 ran under the memory tracker, untimed)
    step_s = statistics.median(2 * 16 / tps for tps in sink.values("tokens_per_s"))
    assert stored is not None and stored["step_s"] == pytest.approx(step_s, rel=1e-6)


def test_a_contended_cell_stores_no_step_time(registry, tmp_path, monkeypatch):
    import abl.analysis.health

    monkeypatch.setattr(abl.analysis.health, "contended", lambda *a, **k: True)
    cell = expand(grid(False), registry).cells[0]
    train(cell, registry, Sink(), shape_cache=tmp_path)
    assert not list(tmp_path.glob("steps-*.json"))


@pytest.fixture
def no_compiling(monkeypatch):
    """torch.compile as the identity: the compiled path (warm-up, compile_s, notes) runs in seconds."""
    monkeypatch.setattr(torch, "compile", lambda fn, *a, **k: fn)


def test_a_compiled_cell_that_did_not_repay_its_compile_says_so_in_its_notes(registry, tmp_path, uncontended,
                                                                              no_compiling):
    cell = expand(grid(True), registry).cells[0]
    device = cpu_device(1)  # train.threads = 1
    # an eager twin a million times faster: no number of steps repays any compile
    timings_for(cell, registry, tmp_path, gpu=False).put(device, "eager", {"step_s": 1e-9})
    sink = Sink()
    summary = train(cell, registry, sink, shape_cache=tmp_path)
    [compile_s] = sink.values("compile_s")
    [note] = [n for n in summary["notes"] if "compiling costs" in n]
    assert f"compiling costs {compile_s:.1f} s and its 4 steps save nothing" in note
    assert "no number of steps repays it" in note
    stored = timings_for(cell, registry, tmp_path, gpu=False).get(device, "compiled")
    assert stored["compile_s"] == compile_s
    assert stored["step_s"] == pytest.approx(statistics.median(2 * 16 / t for t in sink.values("tokens_per_s")))
    assert timings_for(cell, registry, tmp_path, gpu=False).get(device, "eager") == {"step_s": 1e-9}  # the twin's kept


def test_a_compiled_cell_that_repaid_its_compile_says_nothing(registry, tmp_path, uncontended, no_compiling):
    cell = expand(grid(True), registry).cells[0]
    # an eager twin at 1000 s a step: 4 compiled steps save far more than any compile
    timings_for(cell, registry, tmp_path, gpu=False).put(cpu_device(1), "eager", {"step_s": 1000.0})
    summary = train(cell, registry, Sink(), shape_cache=tmp_path)
    assert not any("compiling costs" in n for n in summary["notes"])


def test_a_compiled_cell_without_an_eager_twin_says_nothing_and_stores_its_figures(registry, tmp_path, uncontended,
                                                                                  no_compiling):
    cell = expand(grid(True), registry).cells[0]
    summary = train(cell, registry, Sink(), shape_cache=tmp_path)
    assert not any("compiling costs" in n for n in summary["notes"])
    [entry] = StepTimes(tmp_path, timings_for(cell, registry, tmp_path, gpu=False).path.stem[len("steps-"):]).data.values()
    assert set(entry) == {"compiled"}
