"""Memory admission (harness/admission.py): a grid that cannot fit is refused before anything starts (issue 13, 3)."""

import json
import sys
import types

import pytest
from click.testing import CliRunner
from conftest import tiny_grid_text

from abl.cli import cli
from abl.grid.gridfile import expand
from abl.model.costmodel import MEMORY_BAND, predict
from abl.run import admission

GiB = 1024**3

SMALL = {"experiment": {"name": "adm", "seeds": [0]},
         "model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "context": 32},
         "train": {"steps": 2, "batch_size": 4, "eval_batches": 1},
         "eval": {"decode": False, "extrapolation": False},
         "dataset": {"pystdlib": {"max_bytes": 300000}}}

# the case, larger: abl cost predicts 450-500 GiB per cell (fp32, large batch and context)
HUGE_GRID = """[experiment]
name = "huge"
seeds = [0]
[model]
d_model = 2048
n_layers = 24
n_heads = 16
context = 4096
[train]
steps = 2
batch_size = 32
[grid]
"model.norm" = ["rmsnorm", "layernorm"]
"""


def cells(registry, **train):
    raw = json.loads(json.dumps(SMALL))
    raw["train"].update(train)
    return expand(raw, registry).cells


def test_a_cell_needs_its_predicted_peak_at_the_top_of_the_band_plus_the_process(registry):
    (cell,) = cells(registry)
    need = admission.cell_need(cell, registry, gpus=[])
    peak = predict(cell, registry)["train_peak_bytes"]
    assert need.predicted == peak and need.device == "cpu"
    assert need.per_process == pytest.approx(peak * MEMORY_BAND[1] + admission.PROCESS_BYTES["cpu"])
    # a DDP cell: each process trains its share of the batch, and all of them use this machine's RAM
    (ddp,) = cells(registry, devices=2)
    two = admission.cell_need(ddp, registry, gpus=[])
    assert two.processes == 2 and two.predicted < peak
    assert two.host_bytes == pytest.approx(2 * two.per_process)


def test_cells_that_fit_are_admitted_and_ones_that_do_not_are_named(registry):
    cs = cells(registry)
    need = admission.cell_need(cs[0], registry, []).per_process
    assert admission.admit(cs, registry, slots=1, gpus=[], ram_free=lambda: int(need * 1.01)) == []
    msgs = admission.admit(cs, registry, slots=1, gpus=[], ram_free=lambda: int(need * 0.99))
    text = "\n".join(msgs)
    assert "1 cell(s) need more memory than this machine has free" in text
    assert cs[0].run_id in text and "predicted peak" in text and "--force" in text


def test_workers_at_once_must_fit_together(registry):
    raw = json.loads(json.dumps(SMALL))
    raw["grid"] = {"model.norm": ["rmsnorm", "layernorm", "scalenorm"]}
    cs = expand(raw, registry).cells
    one = max(admission.cell_need(c, registry, []).per_process for c in cs)
    free = lambda: int(one * 2.5)  # noqa: E731 - two cells fit at once, three do not
    assert admission.admit(cs, registry, slots=2, gpus=[], ram_free=free) == []
    msgs = admission.admit(cs, registry, slots=3, gpus=[], ram_free=free)
    assert msgs and "3 cells at once (--workers 3)" in msgs[0] and "smaller --workers" in "\n".join(msgs)
    assert sum(c.run_id in "\n".join(msgs) for c in cs) == 3


def test_gpu_cells_are_checked_against_each_gpus_free_memory(registry):
    cs = cells(registry)
    asked = []

    def gpu_free(indices):
        asked.append(indices)
        return {i: 10 * GiB if i == 0 else int(0.5 * GiB) for i in indices}

    ram = lambda: 0  # noqa: E731 - the host RAM is not what a GPU cell is checked against
    assert admission.admit(cs, registry, slots=1, gpus=[0], ram_free=ram, gpu_free=gpu_free) == []
    # GPU 1 is too small, but GPU 0 holds the cells: they run there (Placement puts them only where they fit)
    assert admission.admit(cs, registry, slots=2, gpus=[0, 1], ram_free=ram, gpu_free=gpu_free) == []
    msgs = admission.admit(cs, registry, slots=1, gpus=[1, 2], ram_free=ram, gpu_free=gpu_free)
    assert asked == [[0], [0, 1], [1, 2]]
    assert "need more GPU memory than is free (GPU 1: 512.0 MiB, GPU 2: 512.0 MiB)" in msgs[0]
    # a cell that asks for the CPU is checked against RAM even where GPUs exist
    (cpu_cell,) = cells(registry, device="cpu")
    assert admission.admit([cpu_cell], registry, slots=1, gpus=[0], ram_free=lambda: 1,
                           gpu_free=gpu_free)[0].startswith("1 cell(s) need more memory than this machine")


def test_cuda_free_bytes_asks_torch_mem_get_info(monkeypatch):
    """The one CUDA branch, with the device query mocked (there is no GPU here)."""
    import torch

    calls = []

    def fake_mem_get_info(i):
        calls.append(i)
        return (1000 + i, 5000)

    monkeypatch.setattr(torch.cuda, "mem_get_info", fake_mem_get_info)
    assert admission.cuda_free_bytes([0, 3]) == {0: 1000, 3: 1003}
    assert calls == [0, 3]


def test_gpu_free_bytes_asks_in_a_child_process(monkeypatch):
    """The parent never creates a CUDA context of its own: the query runs in a child."""
    seen = {}

    def fake_run(argv, **kw):
        seen["argv"] = argv
        return types.SimpleNamespace(stdout='{"0": 123, "1": 456}\n')

    monkeypatch.setattr(admission.subprocess, "run", fake_run)
    assert admission.gpu_free_bytes([0, 1]) == {0: 123, 1: 456}
    argv = seen["argv"]
    assert argv[0] == sys.executable and "-P" in argv  # abl.pyexec: the working directory is not on the path
    assert "cuda_free_bytes" in argv[argv.index("-c") + 1]
    monkeypatch.setattr(admission.subprocess, "run", lambda *a, **k: types.SimpleNamespace(stdout="boom"))
    assert admission.gpu_free_bytes([0]) is None  # unknown: nothing refused on a guess


def test_free_ram_is_capped_by_the_cgroup_limit(monkeypatch):
    monkeypatch.setattr(admission, "cgroup_free_bytes", lambda: 1234)
    assert admission.ram_free_bytes() == 1234
    monkeypatch.setattr(admission, "cgroup_free_bytes", lambda: None)
    free = admission.ram_free_bytes()
    assert free is None or free > 1234


def test_the_cli_refuses_a_grid_that_cannot_fit_with_exit_2_and_an_untouched_store(tmp_path, registry):
    grid = tmp_path / "huge.toml"
    grid.write_text(HUGE_GRID)
    db = tmp_path / "x.duckdb"
    from abl.grid.gridfile import load_grid

    peaks = [predict(c, registry)["train_peak_bytes"] for c in load_grid(grid, registry).cells]
    free = admission.ram_free_bytes()
    assert free is not None and min(peaks) * MEMORY_BAND[1] > free  # the premise: this machine cannot hold it
    r = CliRunner().invoke(cli, ["run", str(grid), "--db", str(db)])
    assert r.exit_code == 2, r.output
    assert "the grid does not fit in memory" in r.output and "2 cell(s) need more memory" in r.output
    for c in load_grid(grid, registry).cells:
        assert f"{c.label} seed=0 (run {c.run_id}): predicted peak" in r.output
    assert f"{min(peaks) / GiB:.1f} GiB" in r.output
    assert not db.exists() and not (tmp_path / "runs").exists()


def test_force_runs_a_grid_the_admission_would_refuse(tmp_path, monkeypatch):
    grid = tmp_path / "g.toml"
    grid.write_text(tiny_grid_text(experiment={"name": "forced", "seeds": None},
                                   train={"steps": 1, "eval_every": None, "threads": None}, grid=None))
    db = tmp_path / "x.duckdb"
    monkeypatch.setattr(admission, "ram_free_bytes", lambda: 1024)  # "1 KiB free"
    refused = CliRunner().invoke(cli, ["run", str(grid), "--db", str(db)])
    assert refused.exit_code == 2 and "need more memory" in refused.output
    assert not db.exists()
    forced = CliRunner().invoke(cli, ["run", str(grid), "--db", str(db), "--force"])
    assert forced.exit_code == 0, forced.output
    assert "warning (--force)" in forced.output
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT status FROM runs").fetchall() == [("completed",)]
    con.close()


@pytest.mark.parametrize("exc,oom", [
    (MemoryError(), True),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried "
                  "to allocate 10000000000000 bytes. Error code 12 (Cannot allocate memory)"), True),
    (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (RuntimeError("shape mismatch"), False),
    (ValueError("out of memory"), False),
])
def test_the_worker_records_allocation_failures_as_oom(exc, oom):
    from abl.run.worker import _is_oom

    assert _is_oom(exc) is oom


def test_a_real_cpu_allocation_failure_reads_as_oom():
    """What torch actually raises when the CPU allocator fails (the issue's run ended failed, not oom)."""
    import torch

    from abl.run.worker import _is_oom

    with pytest.raises(Exception) as err:
        torch.empty(2**62, dtype=torch.uint8)
    assert _is_oom(err.value)


def test_oom_kills_reads_the_cgroup_counter(tmp_path, monkeypatch):
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n")
    real = admission.Path

    monkeypatch.setattr(admission, "Path", lambda p: events if p.endswith("memory.events") else real(p))
    assert admission.oom_kills() == 2
