"""The per-cell worker process: ``python -m harness.worker RUN_DIR``.

Reads ``RUN_DIR/config.json`` (a resolved cell config), trains, and writes
only files in RUN_DIR; it never opens the database:

- ``metrics.jsonl``: one JSON object per line, ``{"step": N, name: value, ...}``,
  flushed as each line is written (append-only, safe to read while growing);
- ``info.json``: the environment and data facts of the run;
- ``status.json``: written atomically; ``status`` is running, completed,
  diverged, oom or failed, with ``error`` for the last case.

Exit status: 0 completed, 3 diverged, 4 oom, 5 killed, 1 failed.

A cell with ``train.checkpoint_every`` keeps ``checkpoint.pt`` until it
completes; a restarted worker resumes from it, keeping the metric rows up to
the checkpoint's step and writing the later ones again.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

EXIT = {"completed": 0, "failed": 1, "diverged": 3, "oom": 4, "killed": 5}


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


class Killed(BaseException):
    """SIGTERM / SIGINT reached the worker (or its parent died)."""


def _on_signal(signum, frame):
    raise Killed(f"stopped by signal {signal.Signals(signum).name}")


def die_with_parent() -> None:
    """Linux: have the kernel send SIGTERM to this worker when the parent dies.

    A worker must not outlive an ``abl run`` that was killed with SIGKILL,
    otherwise a resumed grid would have two writers on one run folder.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() == 1:  # the parent is already gone
        os.kill(os.getpid(), signal.SIGTERM)


def truncate_metrics(path: Path, last_step: int | None) -> None:
    """Keep rows up to ``last_step`` (all of them dropped if None): the rows a resumed run will write again."""
    if not path.exists():
        return
    if last_step is None:
        path.unlink()
        return
    kept = []
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                break
            try:
                if json.loads(line).get("step", 0) <= last_step:
                    kept.append(line)
            except json.JSONDecodeError:
                continue
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


class NullSink:
    """Ranks other than 0 of a multi-process cell record nothing."""

    def log(self, step: int, metrics: dict) -> None:
        pass

    def close(self) -> None:
        pass


def prepare_kernels(run_dir: Path) -> None:
    """Switch the Triton interpreter on for a CPU cell with ``train.kernels = "triton"``.

    Triton decides at import whether it interprets, and loading the plugins
    imports it, so this runs first, from the cell's config.json.
    """
    try:
        tc = json.loads((run_dir / "config.json").read_text()).get("train", {})
    except (OSError, ValueError):
        return  # train() reports a broken config
    if tc.get("kernels") != "triton":
        return
    from .kernels import enable_interpreter
    from .train import resolve_device

    try:
        device = resolve_device(str(tc.get("device", "auto")))
    except (RuntimeError, ValueError):
        return  # train() reports an unusable device
    if device.type == "cpu":
        enable_interpreter()


def run_rank(run_dir: Path) -> int:
    """A non-zero rank of a torchrun cell: train, write nothing; rank 0 owns the folder."""
    from .config import cell_from_config
    from .plugin_manager import get_registry
    from .train import train

    registry = get_registry()
    cell = cell_from_config(json.loads((run_dir / "config.json").read_text()), registry)
    checkpoint = run_dir / "checkpoint.pt"
    train(cell, registry, NullSink(), checkpoint_path=checkpoint if cell.train.checkpoint_every else None)
    return 0


def run(run_dir: Path) -> int:
    die_with_parent()
    prepare_kernels(run_dir)
    if int(os.environ.get("RANK", "0")) != 0:
        return run_rank(run_dir)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    status_path = run_dir / "status.json"
    started = time.time()
    status = {"status": "running", "pid": os.getpid(), "started": started}
    write_json_atomic(status_path, status)
    metrics_path = run_dir / "metrics.jsonl"
    checkpoint = run_dir / "checkpoint.pt"
    sink = None
    try:
        from .config import cell_from_config
        from .plugin_manager import get_registry
        from .train import Diverged, checkpoint_step, train

        # a restarted cell keeps the rows up to its checkpoint and writes the rest again
        resume_step = checkpoint_step(checkpoint)
        if resume_step is None:
            checkpoint.unlink(missing_ok=True)
        else:
            status["resumed_from_step"] = resume_step
            write_json_atomic(status_path, status)
        truncate_metrics(metrics_path, resume_step)
        sink = JsonlSink(metrics_path)
        registry = get_registry()
        config = json.loads((run_dir / "config.json").read_text())
        cell = cell_from_config(config, registry)
        summary = train(cell, registry, sink,
                        on_info=lambda info: write_json_atomic(run_dir / "info.json", info),
                        checkpoint_path=checkpoint if cell.train.checkpoint_every else None)
        status.update(status="completed")
        checkpoint.unlink(missing_ok=True)
        if summary.get("notes"):
            status["notes"] = "; ".join(summary["notes"])
    except Killed as exc:
        status.update(status="killed", error=str(exc))
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
        if sink is not None:
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
