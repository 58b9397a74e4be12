"""Limits checked before work (issue 39, finding 6): ``--max-cells`` counts the runs as grid points times
seeds before any cell is resolved, and ``--dry-run`` of a 100,000-run grid stays fast."""

import time

import pytest

from abl.contracts.config import ConfigError
from abl.grid import gridfile
from abl.grid.gridfile import count_points, expand
from abl.grid.parsing import parse_toml_text

from conftest import run_abl

FIVE_AXES = {  # 5 axes of 10 values: 100,000 grid points
    "train.lr": [round(0.001 * (i + 1), 4) for i in range(10)],
    "train.warmup_steps": list(range(10)),
    "train.weight_decay": [round(0.01 * i, 2) for i in range(10)],
    "model.init_std": [round(0.01 + 0.001 * i, 4) for i in range(10)],
    "train.grad_clip": [round(0.1 * (i + 1), 1) for i in range(10)],
}


def big_grid_text(seeds=(0,), exclude: str = "") -> str:
    axes = "\n".join(f'"{p}" = {values!r}' for p, values in FIVE_AXES.items())
    return f"""
[experiment]
name = "big"
seeds = {list(seeds)!r}
[model]
d_model = 16
n_layers = 1
n_heads = 2
context = 16
[train]
steps = 2
batch_size = 2
[grid]
{axes}
{exclude}
"""


def test_points_are_counted_without_walking_the_free_axes():
    raw = parse_toml_text(big_grid_text(), "big.toml")
    axes = raw["grid"]
    assert count_points(axes, [], raw) == (100_000, True)
    ex = [{"train.lr": 0.001, "train.warmup_steps": 0}, {"train.lr": 0.002}, {"model.d_model": 16}]
    # model.d_model = 16 is the grid file's fixed setting: that exclude removes every point
    assert count_points(axes, ex[:2], raw) == (100_000 - 1000 - 10_000, True)
    assert count_points(axes, ex, raw) == (0, True)
    assert count_points(axes, [{"model.d_model": 32}], raw) == (100_000, True)
    points, exact = count_points(axes, ex[:1], raw, stop_above=50)
    assert points > 50 and not exact


@pytest.mark.parametrize("text", [
    """[experiment]\nseeds = [0, 1, 2]\n[grid]\n"model.norm" = ["rmsnorm", "layernorm"]\n"model.block" = ["pre", "post"]
exclude = [{"model.norm" = "rmsnorm", "model.block" = "post"}]""",
    """[experiment]\nseeds = [3]\n[grid]\n"model.norm" = ["rmsnorm", "layernorm", "none"]\n"train.lr" = [0.01, 0.02]
exclude = [{"model.norm" = "none"}, {"train.lr" = 0.02, "model.norm" = "rmsnorm"}]""",
])
def test_the_count_is_the_number_of_runs_expand_resolves(registry, text):
    raw = parse_toml_text(text, "g.toml")
    grid = dict(raw["grid"])
    excludes = grid.pop("exclude", [])
    points, exact = count_points(grid, excludes, raw)
    seeds = raw["experiment"]["seeds"]
    assert exact and points * len(seeds) == len(expand(raw, registry).cells)
    with pytest.raises(ConfigError, match=f"the grid has {points * len(seeds)} runs"):
        expand(raw, registry, max_cells=points * len(seeds) - 1)
    assert len(expand(raw, registry, max_cells=points * len(seeds)).cells) == points * len(seeds)


def test_max_cells_refuses_a_huge_grid_before_resolving_any_cell(registry, monkeypatch):
    def resolved(*a, **k):
        raise AssertionError("a cell was resolved before --max-cells was checked")

    monkeypatch.setattr(gridfile, "resolve_cell", resolved)
    raw = parse_toml_text(big_grid_text(seeds=(0, 1)), "big.toml")
    with pytest.raises(ConfigError, match=r"200,000 runs \(100,000 grid points x 2 seeds\), more than --max-cells=1000"):
        expand(raw, registry, source="big.toml", max_cells=1000)
    raw = parse_toml_text(big_grid_text(exclude='exclude = [{"train.lr" = 0.001}]'), "big.toml")
    with pytest.raises(ConfigError, match=r"has 90,000 runs \(90,000 grid points x 1 seed\), more than --max"):
        expand(raw, registry, source="big.toml", max_cells=1000)
    raw = parse_toml_text(big_grid_text(exclude='exclude = [{"train.lr" = 0.001}]') + '"model.n_layers" = [1, 2]',
                          "big.toml")  # 180,000 points: counted up to 100,000, then refused
    with pytest.raises(ConfigError, match=r"at least 1\d\d,\d\d\d runs \(.* x 1 seed\), more than --max"):
        expand(raw, registry, source="big.toml", max_cells=1000)


@pytest.mark.slow
def test_cli_refuses_a_100k_grid_as_fast_as_a_2_run_one(tmp_path):
    """The refusal costs no more than abl's start (importing torch and the plugins, seconds on a loaded
    2-core machine): measured against the same refusal of a grid of 2 runs."""
    (tmp_path / "big.toml").write_text(big_grid_text())
    (tmp_path / "small.toml").write_text(big_grid_text().split("[grid]")[0] + '[grid]\n"train.lr" = [0.1, 0.2]\n')
    took = {}
    for name, extra in (("small", []), ("big", []), ("big", ["--dry-run"])):
        t0 = time.monotonic()
        r = run_abl(["run", f"{name}.toml", "--max-cells", "1", *extra], cwd=tmp_path, timeout=120)
        took[name, bool(extra)] = time.monotonic() - t0
        assert r.returncode == 2 and "more than --max-cells=1" in r.stderr and "Traceback" not in r.stderr
    assert "100,000 runs" in r.stderr
    for key in (("big", False), ("big", True)):
        assert took[key] - took["small", False] < 5, took
    assert not (tmp_path / "results").exists() and not list(tmp_path.glob("*.duckdb"))


def _child_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.mark.slow
def test_dry_run_of_a_100k_grid_within_60_s(tmp_path):
    """The dry run of 100,000 runs resolves them all (their run ids) and lists the first and last; its CPU
    time is bounded, not its wall time, which a loaded machine stretches."""
    (tmp_path / "big.toml").write_text(big_grid_text())
    cpu0 = _child_cpu_s()
    r = run_abl(["run", "big.toml", "--dry-run", "--max-cells", "100000"], cwd=tmp_path, timeout=600)
    took = _child_cpu_s() - cpu0
    assert r.returncode == 0, r.stderr
    assert "100000 runs (100000 cells" in r.stdout and "99,980 more runs" in r.stdout
    assert "│ 100000 │" in r.stdout and "│      1 │" in r.stdout
    assert "design: not worked out for a grid of 100,000 runs" in r.stdout
    assert took < 60, f"the dry run took {took:.0f} s of CPU"
    assert not list(tmp_path.glob("*.duckdb")) and not (tmp_path / "results").exists()


@pytest.mark.slow
@pytest.mark.bench
def test_bench_expand_100k_runs(benchmark, registry):
    """pytest-benchmark: the expansion a dry run of 100,000 runs makes (run it by path with
    --benchmark-enable -m bench)."""
    raw = parse_toml_text(big_grid_text(), "big.toml")
    grid = benchmark.pedantic(lambda: expand(raw, registry, source="big.toml", max_cells=100_000),
                              rounds=1, iterations=1)
    assert len(grid.cells) == 100_000 and grid.cells[-1].grid_index == 99_999
