"""The per-cell worker process: ``python -m harness.worker RUN_DIR``.

Reads ``RUN_DIR/config.json`` (a resolved cell config), trains, and writes
only files in RUN_DIR; it never opens the database:

- ``metrics.jsonl``: one JSON object per line, ``{"step": N, name: value, ...}``,
  flushed as each line is written (append-only, safe to read while growing);
- ``info.json``: the environment and data facts of the run;
- ``status.json``: written atomically; ``status`` is running, completed,
  diverged, oom or failed, with ``error`` for the last case.

Exit status: 0 completed, 3 diverged, 4 oom, 1 failed.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

EXIT = {"completed": 0, "failed": 1, "diverged": 3, "oom": 4}


def write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class JsonlSink:
    def __init__(self, path: Path):
        self.f = open(path, "a", buffering=1)

    def log(self, step: int, metrics: dict) -> None:
        self.f.write(json.dumps({"step": step, **metrics}) + "\n")
        self.f.flush()

    def close(self) -> None:
        os.fsync(self.f.fileno())
        self.f.close()


def run(run_dir: Path) -> int:
    status_path = run_dir / "status.json"
    started = time.time()
    status = {"status": "running", "pid": os.getpid(), "started": started}
    write_json_atomic(status_path, status)
    # a restarted cell starts its metrics from scratch
    metrics_path = run_dir / "metrics.jsonl"
    if metrics_path.exists():
        metrics_path.unlink()
    sink = JsonlSink(metrics_path)
    try:
        from .config import cell_from_config
        from .plugins import get_registry
        from .train import Diverged, train

        registry = get_registry()
        config = json.loads((run_dir / "config.json").read_text())
        cell = cell_from_config(config, registry)
        summary = train(cell, registry, sink,
                        on_info=lambda info: write_json_atomic(run_dir / "info.json", info))
        status.update(status="completed")
        if summary.get("notes"):
            status["notes"] = "; ".join(summary["notes"])
    except Diverged as exc:
        status.update(status="diverged", error=str(exc))
    except MemoryError as exc:
        status.update(status="oom", error=f"MemoryError: {exc}")
    except Exception as exc:  # noqa: BLE001 - any failure is recorded, never lost
        import torch

        kind = "oom" if isinstance(exc, torch.OutOfMemoryError) else "failed"
        tail = traceback.format_exc().strip().splitlines()[-12:]
        status.update(status=kind, error="\n".join(tail))
    finally:
        sink.close()
    status["finished"] = time.time()
    write_json_atomic(status_path, status)
    return EXIT[status["status"]]


def main() -> None:
    if len(sys.argv) != 2:
        print("usage: python -m harness.worker RUN_DIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(Path(sys.argv[1])))


if __name__ == "__main__":
    main()
