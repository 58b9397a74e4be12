"""GPUs with unequal free memory (issue 37, item 1): a cell is refused only when it fits no GPU (a k-device cell:
no k GPUs), it is placed only where it fits, and the smallest GPU does not shrink the default cap of the others.

The device queries are stood in for: the needs are given, and the free memory is a dict.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from abl.run import admission
from abl.run.admission import Placement
from abl.run.executors import LocalExecutor

GiB = 1024**3


def _need(run_id: str, per_process: float, processes: int = 1) -> admission.Need:
    cell = SimpleNamespace(run_id=run_id, label=run_id, seed=0)
    n = admission.Need(cell=cell, predicted=0.0, processes=processes, device="cuda")  # type: ignore[arg-type]
    n.predicted = (per_process - admission.PROCESS_BYTES["cuda"]) / n.band
    return n


def _admit(monkeypatch, needs: list[admission.Need], free: dict[int, int], plan=None) -> list[str]:
    by_cell = {id(n.cell): n for n in needs}
    monkeypatch.setattr(admission, "cell_need", lambda cell, registry, gpus: by_cell[id(cell)])
    return admission.admit([n.cell for n in needs], None, slots=1, gpus=sorted(free),  # type: ignore[arg-type]
                           ram_free=lambda: None, gpu_free=lambda idx: dict(free), plan=plan)


def test_a_cell_that_fits_a_larger_gpu_is_admitted_though_a_smaller_gpu_is_too_small(monkeypatch):
    msgs = _admit(monkeypatch, [_need("big", 6 * GiB), _need("small", 1.5 * GiB)], {0: 2 * GiB, 1: 10 * GiB})
    assert msgs == []


def test_a_cell_that_fits_no_gpu_is_still_refused_and_named(monkeypatch):
    msgs = _admit(monkeypatch, [_need("huge", 12 * GiB), _need("small", 1.5 * GiB)], {0: 2 * GiB, 1: 10 * GiB})
    assert msgs and "1 cell(s) need more GPU memory than is free" in msgs[0]
    assert "GPU 0: 2.0 GiB" in msgs[0] and "GPU 1: 10.0 GiB" in msgs[0]
    assert any("huge" in m for m in msgs) and not any("small seed" in m for m in msgs)


def test_a_two_device_cell_needs_two_gpus_where_it_fits(monkeypatch):
    free = {0: 2 * GiB, 1: 10 * GiB, 2: 10 * GiB}
    assert _admit(monkeypatch, [_need("ddp", 6 * GiB, processes=2)], free) == []
    free[2] = 3 * GiB  # only GPU 1 holds a 6 GiB process now: no pair does
    msgs = _admit(monkeypatch, [_need("ddp", 6 * GiB, processes=2)], free)
    assert msgs and "ddp" in "\n".join(msgs) and "x 2 processes" in "\n".join(msgs)


def test_a_cell_is_placed_only_on_a_gpu_where_it_fits_and_waits_for_it():
    p = Placement([0, 1], cap=4, free={0: 2 * GiB, 1: 10 * GiB},
                  needs={"big": 6 * GiB, "big2": 6 * GiB, "small": 1 * GiB})
    assert p.choose("big") == [1]  # not the empty GPU 0, where 6 GiB does not fit
    p.take("big", [1])
    assert p.choose("big2") is None  # GPU 1 is full for it and GPU 0 too small: it waits, not OOMs on GPU 0
    assert p.choose("small") == [0]  # a small cell still takes the small GPU
    p.release("big")
    assert p.choose("big2") == [1]


def test_a_forced_cell_that_fits_no_gpu_still_gets_an_empty_one():
    """--force: admission let through a cell that fits no GPU; it runs alone (and may run out of memory)
    rather than waiting for ever."""
    p = Placement([0, 1], cap=4, free={0: 2 * GiB, 1: 3 * GiB}, needs={"huge": 12 * GiB, "a": 1 * GiB})
    assert p.choose("huge") == [1]  # the empty GPU with the most free memory
    p.take("a", [1])
    assert p.choose("huge") == [0]


def test_a_two_device_cell_takes_the_gpus_where_it_fits():
    p = Placement([0, 1, 2], cap=4, free={0: 2 * GiB, 1: 10 * GiB, 2: 10 * GiB}, needs={"ddp": 6 * GiB})
    assert p.choose("ddp", devices=2) == [1, 2]
    p.take("x", [2])  # an unknown need fills GPU 2
    assert p.choose("ddp", devices=2) is None  # GPU 0 cannot hold a 6 GiB process: it waits


def test_the_executor_sends_a_large_cell_to_the_gpu_it_fits(monkeypatch, tmp_path):
    monkeypatch.setenv("ABL_ZYGOTE", "0")
    ex = LocalExecutor(gpus=[0, 1], cells_per_gpu=2)
    needs = [_need("big", 6 * GiB), _need("small", 1 * GiB)]
    msgs = _admit(monkeypatch, needs, {0: 2 * GiB, 1: 10 * GiB}, plan=ex.plan_devices)
    assert msgs == []
    assert ex.placement.choose("big") == [1]


def test_the_smallest_gpu_does_not_shrink_the_default_cap_of_the_others():
    """A GPU mostly taken by another user's job leaves the others' default cap alone: memory is checked per
    GPU when a cell is placed, so the small one still takes only what fits it."""
    needs = [_need("a", 2 * GiB), _need("b", 2 * GiB)]
    cap = admission.default_cells_per_gpu(needs, {0: 3 * GiB, 1: 80 * GiB})
    assert cap == admission.MAX_DEFAULT_CELLS_PER_GPU  # from GPU 1, not 1 from GPU 0
    p, _ = admission.placement_for([0, 1], None, [_need(f"c{i}", 2 * GiB) for i in range(12)],
                                   {0: 3 * GiB, 1: 80 * GiB})
    placed = []
    for i in range(12):
        gpus = p.choose(f"c{i}")
        if gpus is not None:
            p.take(f"c{i}", gpus)
            placed.append(gpus[0])
    assert placed.count(1) == admission.MAX_DEFAULT_CELLS_PER_GPU
    assert placed.count(0) == 1  # 2 + 2 + the reserve do not fit 3 GiB: GPU 0 holds one


@pytest.mark.parametrize("free", [None, {}])
def test_unknown_free_memory_keeps_one_cell_per_gpu(free):
    assert admission.default_cells_per_gpu([_need("a", 2 * GiB)], free) == 1


def test_the_executor_runs_at_once_what_each_gpu_holds(monkeypatch):
    """The slots follow each GPU's free memory: 8 on the large GPU, 1 on the nearly full one, not 8 on each
    (the host threads of each GPU cell and the grid's ETA are shared among the slots)."""
    monkeypatch.setenv("ABL_ZYGOTE", "0")
    ex = LocalExecutor(gpus=[0, 1])
    ex.plan_devices([_need(f"c{i}", 2 * GiB) for i in range(12)], {0: 3 * GiB, 1: 80 * GiB})
    assert ex.placement.cap == admission.MAX_DEFAULT_CELLS_PER_GPU
    assert ex.slots == admission.MAX_DEFAULT_CELLS_PER_GPU + 1
    given = LocalExecutor(gpus=[0, 1], cells_per_gpu=3)  # --cells-per-gpu: that many on every GPU, as before
    given.plan_devices([_need(f"c{i}", 2 * GiB) for i in range(12)], {0: 3 * GiB, 1: 80 * GiB})
    assert given.slots == 6
