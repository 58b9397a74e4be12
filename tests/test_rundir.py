"""The run-folder protocol (harness/rundir.py) and the one status vocabulary, as runner, store and dashboard use it."""

import hashlib
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from abl.contracts.config import run_id_of
from abl.run import runner
from abl.store import database as store
from abl.store import rundir
from abl.contracts.status import (COMPLETED, EXIT_CODES, INCOMPLETE, NOT_COMPLETED, RETRY_FAILED, STATUSES, STORE_ONLY,
                                  TERMINAL, runs_again)

# ---------------------------------------------------------------- the vocabulary


def test_which_statuses_run_again_follow_the_readme():
    # README "When things go wrong": completed cells are skipped; running, killed and
    # incomplete ones restart; failed, diverged (and oom) ones re-run only with --retry failed
    plain = {s for s in [*STATUSES, None] if runs_again(s)}
    retry = {s for s in [*STATUSES, None] if runs_again(s, retry_failed=True)}
    assert plain == {None, "queued", "running", "killed", "incomplete"}
    assert retry == {None, "queued", "running", "killed", "incomplete", "failed", "diverged", "oom"}
    assert set(RETRY_FAILED) == {"failed", "diverged", "oom"}


def test_killed_did_not_complete_but_is_not_a_failure_to_retry():
    assert "killed" in TERMINAL and "killed" in NOT_COMPLETED
    assert "killed" not in RETRY_FAILED
    assert set(NOT_COMPLETED) == set(TERMINAL) - {"completed"}
    assert set(TERMINAL) == set(STATUSES) - {"queued", "running"}
    # every final status a worker can end with has its own exit code, 0 only for completed;
    # incomplete is the store's verdict on a folder, never a worker's
    assert set(EXIT_CODES) == set(TERMINAL) - set(STORE_ONLY)
    assert set(STORE_ONLY) == {"incomplete"} and "incomplete" in NOT_COMPLETED
    assert len(set(EXIT_CODES.values())) == len(EXIT_CODES)
    assert [s for s, c in EXIT_CODES.items() if c == 0] == ["completed"]


# a whole one-step run, as abl.train.loop writes it
WHOLE = [{"step": 0, "n_params": 10}, {"step": 1, "train_loss": 3.1, "val_loss": 3.0},
         {"step": 1, "wall_s": 1.0, "peak_mem_bytes": 1e6}]


def _config(name):
    """A one-step run's config, one seed per name: its folder is named by its run id, as a worker leaves it."""
    return {"experiment": "e", "seed": int(hashlib.sha256(name.encode()).hexdigest()[:6], 16), "train": {"steps": 1}}


def rid(name):
    return run_id_of(_config(name))


def _folder(runs_dir, run_id, status, **status_fields):
    d = runs_dir / rid(run_id)
    d.mkdir(parents=True)
    rundir.write_json(d / rundir.CONFIG, _config(run_id))
    rundir.write_json(d / rundir.META, {"cell_key": f"cell_{run_id}", "label": run_id})
    lines = "".join(json.dumps(r) + "\n" for r in WHOLE)
    if status == "incomplete":  # the worker completed; its metrics file was cut afterwards
        status, lines = "completed", lines[:-20]
    if status != "queued":  # a folder without status.json (and without metrics: issue 27) is queued
        rundir.write_status(d, {"status": status, **status_fields})
    else:
        lines = ""
    (d / rundir.METRICS).write_text(lines)
    return d


def test_runner_store_and_dashboard_agree_on_every_status(tmp_path):
    runs_dir, db = tmp_path / "runs", tmp_path / "abl.duckdb"
    ids = [rid(s) for s in STATUSES]
    name = {rid(s): s for s in STATUSES}
    dirs = [_folder(runs_dir, s, s) for s in STATUSES]
    assert store.ingest_dirs(db, dirs) == {rid(s): s for s in STATUSES}

    # store: the run summary (abl.present.summary) counts completed and did-not-complete runs per cell
    from abl.analysis.verdicts import cell_inputs
    from abl.present import summary

    by_cell = {c.key: c.statuses for c in cell_inputs(summary.load(db, run_ids=ids))}
    for s in STATUSES:
        assert by_cell[f"cell_{s}"].get("completed", 0) == (s == "completed"), s
        assert sum(n for st, n in by_cell[f"cell_{s}"].items() if st in NOT_COMPLETED) == \
            (s in NOT_COMPLETED), s

    # runner: which cells a plain re-run and a --retry failed run start
    cells = [SimpleNamespace(run_id=s) for s in ids]
    known = store.statuses(db, ids)
    done, skipped, busy, todo = runner.plan(cells, known)
    assert [name[c.run_id] for c in done] == ["completed"] and busy == []
    assert {name[c.run_id] for c in skipped} == {"failed", "diverged", "oom"}
    assert {name[c.run_id] for c in todo} == {"queued", "running", "killed", "incomplete"}
    _, skipped, _, todo = runner.plan(cells, known, retry_failed=True)
    assert skipped == [] and {c.run_id for c in todo} == set(ids) - {rid("completed")}

    # dashboard: the experiments overview and the "did not complete" list
    pytest.importorskip("pandas", reason="the dashboard extra is not installed")
    from abl.dashboard import queries as q

    exp = q.experiments(q.Store(str(db), str(runs_dir))).iloc[0]
    assert (exp["runs"], exp["completed"], exp["running"], exp["not_completed"]) == (8, 1, 2, 5)


def test_reconcile_marks_a_dead_worker_killed_and_a_plain_rerun_restarts_it(tmp_path):
    runs_dir, db = tmp_path / "runs", tmp_path / "abl.duckdb"
    _folder(runs_dir, "gone", "running")  # no pid: the worker is gone
    _folder(runs_dir, "bad", "diverged")
    cells = [SimpleNamespace(run_id=rid("gone")), SimpleNamespace(run_id=rid("bad"))]
    known = runner.reconcile(cells, runs_dir, db)
    assert known == {rid("gone"): "killed", rid("bad"): "diverged"}
    assert rundir.read_status(runs_dir / rid("gone"))["status"] == "killed"
    assert store.statuses(db, [rid("gone"), rid("bad")]) == known
    assert [c.run_id for c in runner.plan(cells, known)[3]] == [rid("gone")]


def test_worker_exit_status_matches_the_status_it_writes(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    rundir.write_json(d / rundir.CONFIG, {"experiment": "e", "seed": 0, "model": {"d_model": "wide"}})
    r = subprocess.run([sys.executable, "-m", "abl.run.worker", str(d)], capture_output=True, text=True, timeout=300)
    st = rundir.read_status(d)
    assert st["status"] == "failed" and st["error"] and st["finished"] >= st["started"]
    assert r.returncode == EXIT_CODES["failed"] == 1, r.stderr
    assert not list(d.glob("*.tmp"))


def test_runner_does_not_import_the_worker():
    from test_architecture import import_graph

    assert "abl.run.worker" not in import_graph()["abl.run.runner"]


# ---------------------------------------------------------------- JSON files


def test_json_files_are_written_whole_and_damaged_ones_read_as_missing(tmp_path):
    p = tmp_path / "status.json"
    rundir.write_json(p, {"status": "running", "pid": 1})
    assert rundir.read_json(p) == {"status": "running", "pid": 1}
    assert not list(tmp_path.glob("*.tmp"))
    p.write_text('{"status": "runn')  # not possible through write_json, but a hand edit
    assert rundir.read_json(p, {}) == {} and rundir.read_status(tmp_path) is None
    p.write_text("[1, 2]")
    assert rundir.read_status(tmp_path) is None
    assert rundir.read_status(tmp_path / "nowhere") is None


def test_prepare_writes_config_and_meta_and_drops_the_old_status_but_not_metrics(tmp_path):
    d = _folder(tmp_path, "r", "failed")
    rundir.prepare(d, {"experiment": "e", "seed": 1}, {"attempts": 2})
    assert rundir.read_json(d / rundir.CONFIG)["seed"] == 1 and rundir.read_json(d / rundir.META) == {"attempts": 2}
    assert rundir.read_status(d) is None and (d / rundir.METRICS).exists()


def test_log_tail(tmp_path):
    assert rundir.log_tail(tmp_path) == "worker exited without a status"
    (tmp_path / rundir.LOG).write_text("".join(f"line {i}\n" for i in range(20)))
    assert rundir.log_tail(tmp_path, 3) == "line 17\nline 18\nline 19"
    # a restarted cell's worker appends to the log: the tail stored for this attempt is this attempt's only
    offset = rundir.log_size(tmp_path)
    assert rundir.log_tail(tmp_path, 3, offset=offset) == "worker exited without a status"
    with open(tmp_path / rundir.LOG, "a") as f:
        f.write("attempt 2 died here\n")
    assert rundir.log_tail(tmp_path, 3, offset=offset) == "attempt 2 died here"


# ---------------------------------------------------------------- metrics.jsonl

DAMAGED = "".join([
    '{"step": 0, "n_params": 10}\n',
    "not json\n",
    "[1, 2]\n",  # JSON, but not a metrics object
    '{"step": "x", "train_loss": 9.0}\n',  # a step that is not a number
    '{"train_loss": 5.0}\n',  # no step: step 0
    '{"step": 1, "train_loss": 2.5, "flag": true, "note": "text", "lr": 0.001}\n',
    '{"step": 2, "train_loss": 2.0}\n',
    '{"step": 3, "train_lo',  # torn: the writer was killed mid-line
])


def test_read_metrics_skips_damaged_lines_and_a_torn_tail(tmp_path):
    p = tmp_path / rundir.METRICS
    p.write_text(DAMAGED)
    assert rundir.read_metrics(p) == [(0, "n_params", 10.0), (0, "train_loss", 5.0), (1, "train_loss", 2.5),
                                      (1, "lr", 0.001), (2, "train_loss", 2.0)]
    assert rundir.read_metrics(tmp_path / "missing.jsonl") == []


def test_truncate_keeps_the_intact_rows_up_to_the_step_verbatim(tmp_path):
    p = tmp_path / rundir.METRICS
    p.write_text(DAMAGED)
    rundir.truncate_metrics(p, 1)
    lines = DAMAGED.splitlines(keepends=True)
    assert p.read_text() == lines[0] + lines[4] + lines[5]
    assert not list(tmp_path.glob("*.tmp"))
    rundir.truncate_metrics(p, None)
    assert not p.exists()
    rundir.truncate_metrics(p, 3)  # nothing to truncate
    assert not p.exists()


def test_tail_reads_complete_lines_as_they_arrive_and_restarts_after_a_truncation(tmp_path):
    p = tmp_path / rundir.METRICS
    assert rundir.tail_metrics(p, 0) == (0, [])
    p.write_text('{"step": 1, "train_loss": 3.0}\n{"step": 2, "tra')
    off, objs = rundir.tail_metrics(p, 0)
    assert objs == [{"step": 1, "train_loss": 3.0}] and off == len('{"step": 1, "train_loss": 3.0}\n')
    assert rundir.tail_metrics(p, off) == (off, [])  # only the torn line: nothing new
    with open(p, "a") as f:
        f.write('in_loss": 2.0}\nnot json\n')
    off2, objs = rundir.tail_metrics(p, off)
    assert objs == [{"step": 2, "train_loss": 2.0}] and off2 == p.stat().st_size
    p.write_text('{"step": 1, "val_loss": 4.0}\n')  # a resumed worker truncated the file
    assert rundir.tail_metrics(p, off2) == (p.stat().st_size, [{"step": 1, "val_loss": 4.0}])


def test_the_executor_follows_progress_through_the_tail(tmp_path):
    from abl.run.executors import Job, tail

    job = Job(cell=None, run_dir=tmp_path, index=0)
    (tmp_path / rundir.METRICS).write_text(DAMAGED)
    assert tail(job) is True
    assert (job.step, job.train_loss, job.val_loss) == (2, 2.0, None)
    assert tail(job) is False


def test_the_sink_appends_whole_lines_that_readers_see_at_once(tmp_path):
    p = tmp_path / rundir.METRICS
    sink = rundir.JsonlSink(p)
    sink.log(1, {"train_loss": 3.0})
    assert rundir.read_metrics(p) == [(1, "train_loss", 3.0)]  # flushed before close
    sink.log(2, {"train_loss": 2.0, "val_loss": 2.5})
    sink.close()
    again = rundir.JsonlSink(p)  # a resumed worker appends
    again.log(3, {"train_loss": 1.0})
    again.close()
    assert [s for s, n, _ in rundir.read_metrics(p) if n == "train_loss"] == [1, 2, 3]


# ---------------------------------------------------------------- completeness (issue 13, 6)


def test_check_complete_names_what_a_completed_run_is_missing(tmp_path):
    p = tmp_path / rundir.METRICS
    whole = "".join(json.dumps(r) + "\n" for r in
                    [{"step": 0, "n_params": 10}, *({"step": s, "train_loss": 3.0} for s in range(1, 5)),
                     {"step": 4, "val_loss": 2.0}, {"step": 4, "wall_s": 1.0, "peak_mem_bytes": 5.0}])
    p.write_text(whole)
    assert rundir.check_complete(rundir.scan_metrics(p), 4) == []
    p.write_text(whole[:-10])
    assert rundir.check_complete(rundir.scan_metrics(p), 4) == [
        "metrics.jsonl ends in a cut line", "no wall_s, peak_mem_bytes at step 4"]
    lines = whole.splitlines(keepends=True)
    p.write_text("".join(lines[:2] + ["garbage\n"] + lines[3:] + [lines[1]]))  # step 2 gone, step 1 twice
    assert rundir.check_complete(rundir.scan_metrics(p), 4) == [
        "metrics.jsonl has 1 damaged line(s) (line 3)", "train_loss of 1 of 4 steps is missing (2)",
        "train_loss of 1 step(s) is written more than once (1)"]
    p.write_text('{"step": 99999999999, "train_loss": 1.0}\n' + whole)  # a step the store cannot hold
    assert rundir.scan_metrics(p).damaged_lines == [1]
    assert rundir.check_complete(rundir.scan_metrics(tmp_path / "none.jsonl"), 4) == ["metrics.jsonl is missing"]


def test_a_killed_run_with_a_garbled_line_keeps_its_status_and_says_so(tmp_path):
    runs_dir, db = tmp_path / "runs", tmp_path / "abl.duckdb"
    d = _folder(runs_dir, "k", "killed")
    with open(d / rundir.METRICS, "a") as f:
        f.write("garbage\n")
    assert store.ingest_dirs(db, [d]) == {rid("k"): "killed"}
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    assert "1 damaged line(s) skipped" in con.execute("SELECT notes FROM runs").fetchone()[0]
    con.close()


def test_the_plan_sentence_says_what_is_skipped_resumed_and_run(tmp_path):
    """run_grid's opening line, from its named step: completed, to run, resuming, incomplete, failed, busy."""
    runs_dir = tmp_path / "runs"
    ids = ["completed", "failed", "busy", "killed", "incomplete", "queued"]
    cells = [SimpleNamespace(run_id=s, cell_key=s[:3]) for s in ids]
    grid = SimpleNamespace(cells=[SimpleNamespace(**vars(c), experiment=SimpleNamespace(name="exp")) for c in cells])
    known = {"completed": "completed", "failed": "failed", "busy": runner.BUSY, "killed": "killed",
             "incomplete": INCOMPLETE}
    (runs_dir / "killed").mkdir(parents=True)
    (runs_dir / "killed" / rundir.CHECKPOINT).write_bytes(b"")
    completed, failed, busy, todo = runner.plan(grid.cells, known)
    line = runner.plan_sentence(grid, runs_dir, known, completed, failed, busy, todo, retry_failed=False)
    assert line == ("[bold]exp[/]: 6 runs (6 cells x seeds); 1 already completed, skipped; 3 to run "
                    "(1 resuming from a checkpoint); 1 stored incomplete (their run folder was not whole), "
                    "trained again; 1 failed or diverged, skipped (--retry failed re-runs them); "
                    "1 running in another abl process, left alone.")
    _, failed, _, todo = runner.plan(grid.cells, known, retry_failed=True)
    line = runner.plan_sentence(grid, runs_dir, known, [], failed, [], todo, retry_failed=True)
    assert "4 to run" in line and "failed or diverged" not in line


def test_run_folder_file_names_are_spelled_only_in_rundir():
    """Every other module names a run folder's files through abl.store.rundir (CONFIG, STATUS, LOG ...)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    # META is left out: "meta.json" is also the token store's own entry file (abl.data.tokenstore)
    names = {rundir.CONFIG, rundir.STATUS, rundir.INFO, rundir.METRICS, rundir.CHECKPOINT, rundir.LOG}
    found = []
    for folder in ("harness", "dashboard"):
        for path in sorted((root / folder).rglob("*.py")):
            if path.name == "rundir.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in names:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value!r}")
    assert not found, "run-folder file names spelled outside abl.store.rundir:\n" + "\n".join(found)


def _status_words_spelled(source: str, words) -> list[int]:
    """Lines of ``source`` that assign a status word to a name or compare a status with a literal word.

    ``COMPLETED = "completed"`` (a second definition) and ``r.status == "completed"`` /
    ``status in ("failed", "oom")`` (a word spelled where the name belongs). A comparison
    counts when one side mentions a status (``status``, ``r.status``, ``row["status"]``),
    so ``retry == "failed"`` (the --retry option's value) does not.
    """
    import ast

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value in words:
            lines.append(node.lineno)
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            literal = any(isinstance(c, ast.Constant) and c.value in words for s in sides for c in ast.walk(s))
            about_status = any("status" in ast.unparse(s).lower() for s in sides
                               if not isinstance(s, (ast.Constant, ast.Tuple, ast.List, ast.Set)))
            if literal and about_status:
                lines.append(node.lineno)
    return lines


def test_the_status_scan_sees_literal_comparisons():
    """The scan saw only assignments; ``r.status == "completed"`` passed it (abl.present.summary, abl.run.lr_sweep)."""
    from abl.contracts import status

    words = status.STATUSES
    assert _status_words_spelled('DONE = "completed"\n', words) == [1]
    assert _status_words_spelled('ok = [r for r in rows if r.status == "completed"]\n', words) == [1]
    assert _status_words_spelled('if row["status"] in ("failed", "oom"):\n    pass\n', words) == [1]
    assert _status_words_spelled('if retry == "failed":\n    pass\nok = r.status == COMPLETED\n', words) == []


def test_the_status_words_are_defined_once():
    """abl.contracts.status is the only module that assigns a status word to a name (verdicts.py had its own)
    or compares a status with a literal word."""
    from pathlib import Path

    from abl.contracts import status

    root = Path(__file__).resolve().parent.parent
    found = []
    for folder in ("harness", "dashboard", "plugins"):
        for path in sorted((root / folder).rglob("*.py")):
            if path == root / "harness" / "contracts" / "status.py":
                continue
            found += [f"{path.relative_to(root)}:{n}" for n in _status_words_spelled(path.read_text(), status.STATUSES)]
    assert not found, "status words spelled outside abl.contracts.status: " + ", ".join(found)
    assert COMPLETED is status.COMPLETED and runs_again is status.runs_again
    assert not hasattr(rundir, "COMPLETED") and not hasattr(rundir, "runs_again")  # one path per name
