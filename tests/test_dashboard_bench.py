"""Benchmark (not a timed test): the Compare page on a store of 1,000 runs x 2,000 steps.

Not run by default (the project's pytest options disable benchmarks):

    python -m pytest tests/test_dashboard_bench.py --benchmark-enable

Each round renders the page cold: Streamlit's caches are cleared first, so
every query of the page and of the sidebar runs against the store again.
"""

import sys
import time

import pytest
from conftest import ROOT

pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install 'abl[dashboard]'")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytestmark = pytest.mark.slow

RUNS, STEPS, SEEDS, EVAL_EVERY = 1000, 2000, 5, 50
NORMS = ["layernorm", "rmsnorm", "scalenorm", "none"]
BLOCKS = ["pre", "post", "sandwich", "post_branch", "parallel"]
LRS = [1e-3, 2e-3, 3e-3, 4e-3, 6e-3, 8e-3, 1e-2, 1.5e-2, 2e-2, 3e-2]  # 4 x 5 x 10 = 200 cells x 5 seeds


def build_synthetic_store(db) -> int:
    """A store shaped like a real grid: runs with resolved configs, metrics every step."""
    import duckdb

    from abl.store import database as store

    store.open_store(db).close()  # the real schema, through the migrations
    con = duckdb.connect(str(db))
    con.execute("""
        CREATE TEMP TABLE r AS
        SELECT i, i // ? AS cell, i % ? AS seed,
               (?::VARCHAR[])[(i // ?) % 4 + 1] AS norm,
               (?::VARCHAR[])[(i // (? * 4)) % 5 + 1] AS block,
               (?::DOUBLE[])[(i // (? * 20)) % 10 + 1] AS lr
        FROM range(?) t(i)
    """, [SEEDS, SEEDS, NORMS, SEEDS, BLOCKS, SEEDS, LRS, SEEDS, RUNS])
    con.execute("""
        INSERT INTO runs (run_id, experiment, cell_key, label, seed, status, config, started, finished,
                          git_commit, versions, device, env, data_fingerprint, grid_file)
        SELECT printf('run%05d', i), 'synthetic', printf('cell%04d', cell),
               printf('norm=%s, block=%s, lr=%s', norm, block, lr::VARCHAR), seed, 'completed',
               json_object('experiment', 'synthetic', 'seed', seed,
                           'model', json_object('d_model', 64, 'n_layers', 4, 'n_heads', 4, 'context', 128,
                                                'norm', norm, 'block', block, 'position', 'rope',
                                                'mixer', 'mha', 'ffn', 'gelu'),
                           'train', json_object('steps', ?, 'batch_size', 16, 'lr', lr, 'eval_every', ?),
                           'data', json_object('dataset', 'pystdlib'),
                           'components', json_object('norm', json_object('name', norm, 'params',
                                                                          json_object('eps', 1e-6)))),
               TIMESTAMP '2026-01-01' + to_seconds((i * 60)::BIGINT), TIMESTAMP '2026-01-01' + to_seconds((i * 60 + 50)::BIGINT),
               'abc123', '{}', 'cpu', '{}', 'fp', 'synthetic.toml'
        FROM r
    """, [STEPS, EVAL_EVERY])
    # per step: train_loss, lr, grad_norm, tokens_per_s, elapsed_s; val_loss every EVAL_EVERY; once-per-run figures
    con.execute("""
        INSERT INTO metrics
        SELECT printf('run%05d', r.i), s.step, n.name,
               CASE n.name
                 WHEN 'train_loss' THEN 2.0 + 3.0 * exp(-s.step / 400.0) + 0.01 * (r.cell % 17) + 0.05 * random()
                 WHEN 'lr' THEN r.lr
                 WHEN 'grad_norm' THEN 0.5 + random()
                 WHEN 'tokens_per_s' THEN 8000 + 100 * (r.cell % 7) + 500 * random()
                 ELSE s.step * 0.12 END
        FROM r, range(1, ? + 1) s(step),
             (VALUES ('train_loss'), ('lr'), ('grad_norm'), ('tokens_per_s'), ('elapsed_s')) n(name)
    """, [STEPS])
    con.execute("""
        INSERT INTO metrics
        SELECT printf('run%05d', r.i), s.step, 'val_loss',
               2.1 + 3.0 * exp(-s.step / 400.0) + 0.01 * (r.cell % 17) + 0.02 * random()
        FROM r, range(?, ? + 1, ?) s(step)
    """, [EVAL_EVERY, STEPS, EVAL_EVERY])
    con.execute("""
        INSERT INTO metrics
        SELECT printf('run%05d', r.i), ?, n.name,
               CASE n.name WHEN 'n_params' THEN 200000 + 1000 * (r.cell % 5)
                           WHEN 'peak_mem_bytes' THEN 4e8 + 1e6 * (r.cell % 9) ELSE 250.0 END
        FROM r, (VALUES ('n_params'), ('peak_mem_bytes'), ('wall_s')) n(name)
    """, [STEPS])
    n = con.execute("SELECT count(*) FROM metrics").fetchone()[0]
    con.execute("CHECKPOINT")
    con.close()
    return n


@pytest.fixture(scope="module")
def synthetic_db(request, tmp_path_factory):
    if request.config.getoption("benchmark_disable") and not request.config.getoption("benchmark_enable"):
        pytest.skip("benchmark: run with --benchmark-enable")
    db = tmp_path_factory.mktemp("dash_bench") / "abl.duckdb"
    t0 = time.perf_counter()
    rows = build_synthetic_store(db)
    print(f"\nsynthetic store: {RUNS} runs x {STEPS} steps, {rows:,} metric rows, "
          f"built in {time.perf_counter() - t0:.1f} s")
    return db


def test_compare_page_renders_under_2_s_on_1000_runs_x_2000_steps(benchmark, synthetic_db, monkeypatch):
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("ABL_DB", str(synthetic_db))
    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    at.switch_page("views/compare.py")

    def render():
        at.run()

    benchmark.pedantic(render, setup=st.cache_data.clear, rounds=5, iterations=1, warmup_rounds=1)
    assert not at.exception, [e.message for e in at.exception]
    assert len(at.dataframe[-1].value) == RUNS // SEEDS  # one row per cell
    assert len(at.get("vega_lite_chart")) == 2
    assert benchmark.stats["median"] < 2.0, f"Compare took {benchmark.stats['median']:.2f} s (median)"
