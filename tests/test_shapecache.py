"""FLOP counting and memory tracking once per model shape per store, then reused."""

import pytest

torch = pytest.importorskip("torch")

from abl.grid.gridfile import expand  # noqa: E402
from abl.model.shapecache import ShapeCache  # noqa: E402
from abl.train.loop import train  # noqa: E402


def grid(**train_kw):
    return {"experiment": {"name": "t", "seeds": [0, 1]},
            "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
            "train": {"steps": 3, "batch_size": 2, "eval_every": 3, "eval_batches": 1, "threads": 1, **train_kw},
            "eval": {"decode": False, "extrapolation": False},
            "dataset": {"pystdlib": {"max_bytes": 300_000}}}


class Sink:
    def __init__(self):
        self.rows = []

    def log(self, step, metrics):
        self.rows.append((step, dict(metrics)))

    def at(self, step):
        return {k: v for s, m in self.rows if s == step for k, v in m.items()}


def shape_entries(root):
    """The FLOP/memory entries (the step times of abl.model.shapecache.StepTimes live beside them)."""
    return [p for p in root.glob("*.json") if not p.name.startswith("steps-")]


def run(cell, registry, root):
    sink, info = Sink(), {}
    train(cell, registry, sink, on_info=info.update, shape_cache=root)
    return sink, info


def test_the_second_seed_reuses_the_first_seeds_flop_count_and_tracked_memory(registry, tmp_path, monkeypatch):
    import abl.model.flops
    import abl.model.memory

    first_cell, second_cell = expand(grid(), registry).cells
    a, info_a = run(first_cell, registry, tmp_path)
    assert info_a["shape_cache"] == {"flops": "measured", "memory": "measured"}
    assert len(shape_entries(tmp_path)) == 1

    def refuse(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(abl.model.flops, "count_step_flops", refuse)
    monkeypatch.setattr(abl.model.memory, "StepMemory", refuse)
    b, info_b = run(second_cell, registry, tmp_path)
    assert info_b["shape_cache"] == {"flops": "reused", "memory": "reused"}
    assert b.at(0)["flops_per_step_measured"] == a.at(0)["flops_per_step_measured"] > 0
    assert b.at(2)["peak_tensor_bytes"] == a.at(2)["peak_tensor_bytes"] > 0
    assert "tokens_per_s" in b.at(2) and "tokens_per_s" not in a.at(2)  # the reused step is timed
    assert b.at(1)["train_loss"] != a.at(1)["train_loss"]  # another seed all the same


def test_another_shape_is_measured_anew(registry, tmp_path):
    run(expand(grid(), registry).cells[0], registry, tmp_path)
    _, info = run(expand(grid(batch_size=4), registry).cells[0], registry, tmp_path)
    assert info["shape_cache"] == {"flops": "measured", "memory": "measured"}
    assert len(shape_entries(tmp_path)) == 2


def test_a_damaged_entry_is_measured_again(tmp_path):
    (tmp_path / "k.json").write_text('{"flops": {"flops_per_step_measured": "x"}')
    cache = ShapeCache(tmp_path, "k")
    assert cache.get("flops") is None and not cache.reused
    cache.put("flops", {"flops_per_step_measured": 3.0})
    assert ShapeCache(tmp_path, "k").get("flops") == {"flops_per_step_measured": 3.0}
