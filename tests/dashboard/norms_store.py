"""A store shaped like ablations/norms.toml's (13 cells x 2 seeds), written in place in a second.

No training: runs rows and metric rows are synthetic but shaped like the real
ones (train_loss and tokens_per_s per step, val_loss every 50 steps, the final
figures once, ``contended`` set on some runs as ingest does).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import duckdb

NORMS = ["layernorm", "rmsnorm", "scalenorm", "none"]
BLOCKS = ["pre", "post", "sandwich", "post_branch"]
EXCLUDED = {("none", "post"), ("none", "sandwich"), ("none", "post_branch")}
GRID_PATHS = ["model.norm", "model.block"]  # what each run records of its grid (abl.contracts.config.Cell)
SEEDS = (0, 1)
STEPS = 200
EXPERIMENT = "norms"
# (norm, block, seed) pairs measured on a contended machine
CONTENDED = {("rmsnorm", "post", 1), ("scalenorm", "sandwich", 0), ("scalenorm", "sandwich", 1)}


def cells() -> list[tuple[str, str]]:
    return [(n, b) for n in NORMS for b in BLOCKS if (n, b) not in EXCLUDED]


def config(norm: str, block: str, seed: int, seeds=SEEDS) -> dict:
    return {"experiment": {"name": EXPERIMENT, "seeds": list(seeds)}, "seed": seed,
            "model": {"d_model": 64, "n_layers": 4, "n_heads": 4, "context": 128, "position": "rope",
                      "mixer": "mha", "ffn": "gelu", "norm": norm, "block": block},
            "train": {"steps": STEPS, "batch_size": 16, "lr": 3e-3, "warmup_steps": 20, "eval_every": 50,
                      "eval_batches": 8},
            "data": {"dataset": "pystdlib"},
            "components": {"norm": {"name": norm, "params": {}}, "block": {"name": block, "params": {}}}}


def build(folder: Path, seeds=SEEDS) -> Path:
    """Write ``folder/abl.duckdb`` (and an empty ``folder/runs``); returns the database path."""
    from abl.store import database as abl_store

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "runs").mkdir(exist_ok=True)
    db = folder / "abl.duckdb"
    abl_store.open_store(db).close()
    con = duckdb.connect(str(db))
    t0 = datetime(2026, 1, 1, 12, 0, 0)
    runs, rows = [], []
    for i, (norm, block) in enumerate(cells()):
        key = f"{norm[:4]}{block[:4]}{i:02d}".ljust(16, "0")
        for seed in seeds:
            run_id = f"{key}s{seed}"
            started = t0 + timedelta(minutes=3 * (2 * i + seed))
            runs.append((run_id, EXPERIMENT, key, f"norm={norm}, block={block}", seed, "completed",
                         json.dumps(config(norm, block, seed, seeds)), started, started + timedelta(seconds=150),
                         "abc1234", "cpu", "ablations/norms.toml", json.dumps(GRID_PATHS),
                         NORMS.index(norm) * len(BLOCKS) + BLOCKS.index(block),
                         json.dumps({"model.norm": norm, "model.block": block})))
            floor = 2.0 + 0.07 * i + 0.02 * seed
            contended = (norm, block, seed) in CONTENDED
            speed = (9000.0 + 150 * i + 90 * seed) * (0.55 if contended else 1.0)
            for step in range(1, STEPS + 1, 5):
                rows.append((run_id, step, "train_loss", floor + 3.0 / (1 + step / 15) + 0.01 * ((step * 7) % 5)))
                rows.append((run_id, step, "tokens_per_s", speed * (1 + 0.03 * ((step * 3) % 4))))
                rows.append((run_id, step, "mfu", speed / 2e5))
                rows.append((run_id, step, "elapsed_s", step * 0.7))
            for step in (50, 100, 150, STEPS):
                rows.append((run_id, step, "val_loss", floor + 0.1 + 3.0 / (1 + step / 15)))
            rows.append((run_id, STEPS, "train_loss", floor + 3.0 / (1 + STEPS / 15)))
            for name, value in (("peak_mem_bytes", 601_620_070.0 + 1e6 * i), ("n_params", 215_872.0 + 64 * i),
                                ("wall_s", 140.0 + i), ("flops_per_step_measured", 4.2e9 + 1e7 * i),
                                ("cpu_util", 0.45 if contended else 0.97),
                                ("load_per_core", 1.8 if contended else 0.6),
                                ("contended", 1.0 if contended else 0.0)):
                rows.append((run_id, STEPS, name, value))
    con.executemany("INSERT INTO runs (run_id, experiment, cell_key, label, seed, status, config, started, "
                    "finished, git_commit, device, grid_file, grid_paths, grid_index, grid_varied) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", runs)
    con.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?)", rows)
    con.close()
    return db
