"""A silently-dead worker's stored error names no path of the machine that ran it (issue 39): the parent
stores the last lines of its log, and a crash in native code, a Python fatal error (faulthandler) or
torchrun's report print absolute paths there: tracebacks' ``File "..."`` lines and bare paths under the
home folder, site-packages, the repository and the run folder. They are shortened as a worker's own
traceback is (abl.files.short_path)."""

import os
import signal
import sys
import sysconfig
from pathlib import Path

from conftest import ROOT


def machine_paths(run_dir: Path) -> list[str]:
    return [p for p in {str(ROOT), sys.prefix, os.path.expanduser("~"), os.path.dirname(os.__file__),
                        sysconfig.get_paths()["purelib"], str(run_dir)} if len(p) > 1]


def a_log(run_dir: Path) -> str:
    site = sysconfig.get_paths()["purelib"]
    home = os.path.expanduser("~")
    return "\n".join([
        "Fatal Python error: Segmentation fault",
        "",
        "Current thread 0x00007f (most recent call first):",
        f'  File "{site}/torch/nn/modules/module.py", line 1775 in _call_impl',
        f'  File "{ROOT}/harness/train/loop.py", line 88 in train',
        "Traceback (most recent call last):",
        f'  File "{os.path.dirname(os.__file__)}/runpy.py", line 198, in _run_module_as_main',
        f"E1128 api.py:1002] failed (exitcode: -11) local_rank: 0 (pid: 6235) of binary: {sys.executable}",
        f"  error_file: {run_dir}/error.json",
        f"could not open {home}/data/corpus.txt; see {run_dir}/worker.log",
        "Signal 11 (SIGSEGV) received by PID 6235",
    ])


def test_a_log_tail_names_no_machine_folder(tmp_path):
    from abl.store import rundir

    run_dir = tmp_path / "runs" / "abc"
    run_dir.mkdir(parents=True)
    (run_dir / rundir.LOG).write_text(a_log(run_dir))
    tail = rundir.log_tail(run_dir)
    assert not any(p in tail for p in machine_paths(run_dir)), tail
    assert 'File "/' not in tail, tail
    # what the lines say is kept: the files named the way a worker's own traceback names them
    assert 'File "torch/nn/modules/module.py", line 1775' in tail, tail
    assert "runs/abc/worker.log" in tail and "~/data/corpus.txt" in tail, tail
    assert "https://" not in tail or "https://pytorch.org" in tail


def test_a_url_and_a_ratio_are_not_paths():
    from abl.files import scrub_paths

    text = "see https://pytorch.org/docs/stable/elastic/errors.html; 3/4 done; a/b relative"
    assert scrub_paths(text) == text


def test_a_worker_dead_of_a_signal_is_stored_without_machine_paths(tmp_path):
    from abl.run.executors import Job
    from abl.run.runner import CellEvents
    from abl.store import rundir

    run_dir = tmp_path / "runs" / "abc"
    run_dir.mkdir(parents=True)
    (run_dir / rundir.LOG).write_text(a_log(run_dir))
    cell = type("C", (), {"run_id": "abc", "label": "x", "seed": 0,
                          "train": type("T", (), {"devices": 1})()})()
    job = Job(cell=cell, run_dir=run_dir, index=0, handle=object(), returncode=-signal.SIGSEGV)
    events = CellEvents(tmp_path / "x.duckdb", tmp_path / "runs", {}, {}, None)
    assert events.settled(job, {}) == "failed"
    error = rundir.read_status(run_dir)["error"]
    assert "SIGSEGV" in error.splitlines()[-1], error
    assert not any(p in error for p in machine_paths(run_dir)), error


def test_a_failed_write_stored_as_the_stopped_cells_reason_names_no_machine_folder(tmp_path):
    import errno

    from abl.run.runner import stop_reason

    home = os.path.expanduser("~")
    exc = OSError(errno.ENOSPC, "No space left on device", f"{home}/results/runs/abc/metrics.jsonl")
    reason = stop_reason(exc)
    assert reason.startswith("stopped: abl run could not write") and "No space left on device" in reason
    assert home not in reason and "results/runs/abc/metrics.jsonl" in reason, reason
    assert stop_reason(KeyboardInterrupt()) == "stopped by SIGINT to abl run"
