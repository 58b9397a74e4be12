"""Issue 27, 5: a full disk, odd files and hostile input on a shared machine.

Each fault ends in a clear message: exit 2 for bad input (nothing stored), exit 1 for a fault
mid-run (what finished stays stored, no temporary file left); never a traceback.
"""

import errno
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from abl.cli import cli
from abl.contracts.config import ConfigError, run_id_of
from abl.grid.gridfile import expand
from abl.grid.parsing import parse_toml_text

GOOD = """[experiment]
name = "hostile"
seeds = [0]
[model]
d_model = 32
n_layers = 2
n_heads = 4
context = 32
[train]
steps = 2
warmup_steps = 0
[grid]
"model.norm" = ["rmsnorm", "layernorm"]
"""


def refused(tmp_path, grid: Path, *needles, args=()):
    db = tmp_path / "store.duckdb"
    r = CliRunner().invoke(cli, ["run", str(grid), "--db", str(db), *args])
    assert r.exit_code == 2, r.output
    assert isinstance(r.exception, SystemExit) and "Traceback" not in r.output
    for needle in needles:
        assert needle in r.output, r.output
    assert not db.exists() and not (tmp_path / "runs").exists()
    return r.output


# ---------------------------------------------------------------- grid files that are not grid files


def test_a_grid_file_that_is_a_symlink_loop_is_named_as_one(tmp_path):
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.symlink_to(b)
    b.symlink_to(a)
    out = refused(tmp_path, a, "loop of symbolic links")
    assert "no such file" not in out
    dangling = tmp_path / "gone.toml"
    dangling.symlink_to(tmp_path / "nowhere.toml")
    refused(tmp_path, dangling, "symbolic link whose target does not exist")


@pytest.mark.parametrize("kind", ["char device", "fifo"])
def test_a_grid_file_that_is_not_a_regular_file_is_refused_before_it_is_read(tmp_path, kind):
    if kind == "char device":
        path = Path("/dev/zero")  # read whole, it grows memory until a MemoryError
    else:
        path = tmp_path / "pipe.toml"
        os.mkfifo(path)  # opening it to read would block forever
    refused(tmp_path, path, "not a regular file")


def test_a_grid_file_too_large_to_be_one_is_refused_by_its_size(tmp_path):
    from abl.grid.parsing import MAX_GRID_BYTES

    big = tmp_path / "big.toml"
    with open(big, "wb") as f:
        f.truncate(MAX_GRID_BYTES + 1)  # sparse: no disk used
    refused(tmp_path, big, "too large for a grid file")


@pytest.mark.parametrize("opener", ["[", "{a="])
def test_deeply_nested_toml_is_a_clear_error_not_a_recursion_error(tmp_path, opener):
    grid = tmp_path / "deep.toml"
    grid.write_text(GOOD + "x = " + opener * 100_000 + "\n")
    refused(tmp_path, grid, "nested too deeply")
    with pytest.raises(ConfigError, match="nested too deeply"):
        parse_toml_text("x = " + opener * 100_000, "t")


def test_an_override_nested_too_deeply_is_a_clear_error(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(GOOD)
    refused(tmp_path, grid, "nested too deeply", args=["--set", "train.lr=" + "[" * 100_000])


# ---------------------------------------------------------------- values the schema let through


@pytest.mark.parametrize("name", ["a\x00b", "two\nlines", "bell\x07", "esc\x1b[31mred", "del\x7f", "sep\u2028x"])
def test_an_experiment_name_with_control_characters_is_refused(tmp_path, name):
    grid = tmp_path / "g.toml"
    grid.write_text(GOOD.replace('name = "hostile"', f"name = {json.dumps(name)}"))
    out = refused(tmp_path, grid, "experiment.name holds a control character")
    assert name not in out  # never echoed raw into the terminal


def test_a_description_may_hold_line_breaks_but_no_other_control_character(registry):
    ok = parse_toml_text(GOOD.replace('name = "hostile"', 'name = "hostile"\ndescription = "a\\nb\\tc"'), "g")
    assert expand(ok, registry).cells
    bad = parse_toml_text(GOOD.replace('name = "hostile"', 'name = "hostile"\ndescription = "a\\u0000b"'), "g")
    with pytest.raises(ConfigError, match="experiment.description holds a control character"):
        expand(bad, registry)


def test_negative_seeds_are_refused(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(GOOD.replace("seeds = [0]", "seeds = [-1]"))
    refused(tmp_path, grid, "experiment.seeds must be >= 0, got -1")


ABSURD = [("model", "n_layers", 100_000), ("model", "d_model", 2**40), ("model", "context", 2**40),
          ("train", "batch_size", 2**63 - 1), ("model", "n_heads", 10**6), ("model", "vocab_size", 2**40),
          ("train", "eval_batches", 10**9), ("train", "threads", 10**6), ("train", "devices", 10**6),
          ("model", "head_dim", 2**40)]


@pytest.mark.parametrize("section,key,value", ABSURD, ids=[f"{s}.{k}" for s, k, _ in ABSURD])
def test_absurd_sizes_are_refused_by_the_schema_range_before_any_memory_check(tmp_path, monkeypatch, section, key,
                                                                              value):
    import abl.run.admission as admission

    def no_memory_check(*a, **k):
        raise AssertionError("reached the memory check")

    monkeypatch.setattr(admission, "check_run", no_memory_check)
    monkeypatch.setattr(admission, "check_grid", no_memory_check, raising=False)
    import re

    text = re.sub(rf"^{key} = .*\n", "", GOOD, flags=re.M).replace(f"[{section}]\n", f"[{section}]\n{key} = {value}\n")
    grid = tmp_path / "g.toml"
    grid.write_text(text)
    refused(tmp_path, grid, f"{section}.{key} must be <=")


def test_a_warm_up_longer_than_the_run_is_warned_about(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(GOOD.replace("warmup_steps = 0", "warmup_steps = 1000").replace("steps = 2\n", "steps = 5\n"))
    r = CliRunner().invoke(cli, ["run", str(grid), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "train.warmup_steps=1000 is more than train.steps=5" in r.output
    assert "never reaches train.lr" in r.output
    grid.write_text(GOOD.replace("warmup_steps = 0", "warmup_steps = 2"))  # equal: the peak is reached
    assert "warmup_steps" not in CliRunner().invoke(cli, ["run", str(grid), "--dry-run"]).output
    # the default warm-up (20 steps) over a 2-step smoke test is not warned about: the grid did not ask for it
    grid.write_text(GOOD.replace("warmup_steps = 0\n", ""))
    assert "warmup_steps" not in CliRunner().invoke(cli, ["run", str(grid), "--dry-run"]).output
    swept = GOOD.replace("warmup_steps = 0\n", "") + '"train.warmup_steps" = [0, 50]\n'
    grid.write_text(swept)
    assert "train.warmup_steps=50 is more than train.steps=2" in \
        CliRunner().invoke(cli, ["run", str(grid), "--dry-run"]).output


# ---------------------------------------------------------------- data


def test_a_text_file_that_is_not_utf8_is_trained_on_as_bytes_and_says_so(tmp_path):
    from abl.data.corpus import from_text_file

    good = tmp_path / "good.txt"
    good.write_text("héllo wörld " * 50)
    assert "UTF-8" not in from_text_file(good, 0.1).description
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(("hello " * 20).encode() + "héllo".encode("latin-1") + b" more" * 20)
    corpus = from_text_file(bad, 0.1)
    assert "not UTF-8 from byte 121" in corpus.description and "raw bytes" in corpus.description
    assert b"".join(corpus.train_docs + corpus.val_docs) == bad.read_bytes()


@pytest.mark.parametrize("kind", ["empty jsonl", "blank jsonl", "zero-row parquet", "zero-row save_to_disk",
                                  "csv header only"])
def test_an_empty_hugging_face_dataset_says_empty(tmp_path, kind):
    pytest.importorskip("datasets")
    from abl.data.corpus import DataError
    from abl.plugins.datasets import hf_dataset

    if kind == "empty jsonl":
        path = tmp_path / "e.jsonl"
        path.write_text("")
    elif kind == "blank jsonl":
        path = tmp_path / "b.jsonl"
        path.write_text("\n\n")
    elif kind == "zero-row parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "z.parquet"
        pq.write_table(pa.table({"text": pa.array([], pa.string())}), path)
    elif kind == "zero-row save_to_disk":
        import datasets

        path = tmp_path / "saved"
        datasets.Dataset.from_dict({"text": []}).save_to_disk(str(path))
    else:
        path = tmp_path / "h.csv"
        path.write_text("text\n")
    with pytest.raises(DataError, match="is empty"):
        hf_dataset(str(path))


# ---------------------------------------------------------------- a full disk


def enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device", "somewhere")


def test_a_full_disk_during_the_token_store_commit_leaves_no_temporary_folder(tmp_path, registry, monkeypatch):
    from abl.data import tokenstore

    cell = expand(parse_toml_text(GOOD, "g"), registry).cells[0]
    prepared = tokenstore.prepare_tokens(cell.components["dataset"], cell.components["tokenizer"], registry,
                                         tmp_path, tokenstore.default_tokenizer(cell))
    monkeypatch.setattr(Path, "write_text", enospc)
    with pytest.raises(OSError):
        tokenstore.commit(prepared, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [], "a half-written entry was left behind"


def test_a_full_disk_mid_run_is_a_clear_message_exit_1_and_no_lock_or_temporary_file(tmp_path, monkeypatch):
    from abl.data import tokenstore

    monkeypatch.setattr(tokenstore, "commit", enospc)
    grid = tmp_path / "g.toml"
    grid.write_text(GOOD)
    db = tmp_path / "store.duckdb"
    r = CliRunner().invoke(cli, ["run", str(grid), "--db", str(db)])
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output and isinstance(r.exception, SystemExit)
    assert "No space left on device writing somewhere" in r.output and "run the same command to resume" in r.output
    assert not list(tmp_path.rglob("*.tmp*")) and not list(tmp_path.rglob("*.lock"))


def test_a_full_disk_while_setting_up_a_run_folder_stops_the_run_and_keeps_the_store_consistent(
        tmp_path, monkeypatch):
    """The parent's own write (a run folder's config.json, rundir.write_json) fails as the first cell
    starts: exit 1 with a message, the temporary file gone, no cell left "running"."""
    from abl import files

    real = files.write_text

    def full_for_configs(path, text, fsync=False):
        if path.name == "config.json":
            with files.replacing(path, fsync=fsync) as tmp:
                tmp.write_text(text[: len(text) // 2])  # half written, then the disk is full
                raise OSError(errno.ENOSPC, "No space left on device", str(tmp))
        real(path, text, fsync)

    monkeypatch.setattr(files, "write_text", full_for_configs)
    grid = tmp_path / "g.toml"
    grid.write_text(GOOD)
    db = tmp_path / "store.duckdb"
    r = CliRunner().invoke(cli, ["run", str(grid), "--db", str(db)])
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output and "No space left on device" in r.output
    assert "interrupted" not in r.output.lower() or "stopping" in r.output
    assert not list(tmp_path.rglob("*.tmp"))
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM runs WHERE status = 'running'").fetchone() == (0,)
    finally:
        con.close()


# ---------------------------------------------------------------- the store's lock and abl ingest


def test_no_lock_file_is_left_after_a_release_or_a_refusal(tmp_path, monkeypatch):
    import duckdb

    from abl.store.lock import StoreLock, lock_path

    db = tmp_path / "x.duckdb"
    duckdb.connect(str(db)).close()  # an existing store: the lock's file is not removed as "untouched"
    StoreLock(db).acquire().release()
    assert not lock_path(db).exists()
    import abl.run.admission as admission

    monkeypatch.setattr(admission, "check_run", lambda *a, **k: ["cell x: needs 501 GiB, 8 GiB free"])
    grid = tmp_path / "g.toml"
    grid.write_text(GOOD)
    r = CliRunner().invoke(cli, ["run", str(grid), "--db", str(db)])
    assert r.exit_code == 2 and "does not fit in memory" in r.output, r.output
    assert not lock_path(db).exists()


def test_a_waiter_on_a_deleted_lock_file_takes_the_new_one(tmp_path):
    """The holder deletes the lock file as it releases: a process that opened the old file before
    must not believe it holds the lock once it gets the old file's flock."""
    import fcntl

    from abl.store.lock import StoreBusy, StoreLock, lock_path

    db = tmp_path / "x.duckdb"
    first = StoreLock(db).acquire()
    stale = os.open(lock_path(db), os.O_RDWR)  # a waiter opened the file the first holder now has
    first.release()
    fcntl.flock(stale, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the waiter gets the old, deleted file's lock
    second = StoreLock(db).acquire()  # a newcomer makes a new file and holds it
    try:
        waiter = StoreLock(db)
        waiter.path = lock_path(db)
        with pytest.raises(StoreBusy):
            waiter.acquire()  # the new file is held: the old file's flock counts for nothing
    finally:
        second.release()
        os.close(stale)


def test_ingest_wait_lists_the_run_folders_after_it_holds_the_lock(tmp_path, monkeypatch):
    """The holder writes run folders while ingest --wait queues: they are ingested too."""
    import abl.cli.ingest as ingest_cli

    db = tmp_path / "x.duckdb"
    runs = tmp_path / "runs"
    runs.mkdir()
    real = ingest_cli.take_store_lock

    def holder_writes_meanwhile(db_path, wait):
        config = {"experiment": "x", "seed": 0, "train": {"steps": 1}}
        d = runs / run_id_of(config)  # a worker's folder is named by its config's run id
        d.mkdir()
        (d / "config.json").write_text(json.dumps(config))
        (d / "status.json").write_text(json.dumps({"status": "failed", "error": "boom"}))
        return real(db_path, wait)

    monkeypatch.setattr(ingest_cli, "take_store_lock", holder_writes_meanwhile)
    r = CliRunner().invoke(cli, ["ingest", "--db", str(db), "--wait"])
    assert r.exit_code == 0, r.output
    assert "ingested 1 run folder(s)" in r.output and "1 failed" in r.output


def test_a_run_folder_without_status_json_is_reported_not_silently_queued(tmp_path):
    import duckdb

    db = tmp_path / "x.duckdb"
    runs = tmp_path / "runs"
    configs = [{"experiment": "x", "seed": seed, "train": {"steps": 2}} for seed in (0, 1)]
    never, ran = (runs / run_id_of(c) for c in configs)  # named by their run ids, as workers leave them
    for d, config in zip((never, ran), configs):
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(config))
    (ran / "metrics.jsonl").write_text('{"step": 1, "train_loss": 3.0}\n')
    r = CliRunner().invoke(cli, ["ingest", "--db", str(db)])
    assert r.exit_code == 1, r.output
    assert f"queued: {never}: no readable status.json" in r.output
    assert f"incomplete: {ran}: status.json is missing, yet metrics.jsonl holds 1 row(s)" in r.output
    con = duckdb.connect(str(db), read_only=True)
    try:
        got = dict(con.execute("SELECT run_id, status FROM runs").fetchall())
        errors = [e for (e,) in con.execute("SELECT error FROM runs ORDER BY run_id").fetchall()]
    finally:
        con.close()
    assert got == {never.name: "queued", ran.name: "incomplete"}
    assert all(e and "status.json is missing" in e for e in errors)


# ---------------------------------------------------------------- Ctrl-C / SIGTERM: leave at once


def test_after_ctrl_c_abl_run_skips_the_interpreters_teardown_once_the_store_is_settled(tmp_path, monkeypatch):
    """The exit after SIGINT/SIGTERM took 8.8-14.3 s under load: the cells were stopped and stored within
    a second, the rest was Python's finalisation (torch's teardown alone: 2 s). abl run now leaves with
    os._exit(130), after the lock is released (nothing of the store is left to the teardown)."""
    from abl.run import runner
    from abl.store.lock import lock_path

    db = tmp_path / "x.duckdb"
    seen = {}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    def fake_exit(code):
        seen["code"], seen["lock_left"] = code, lock_path(db).exists()
        raise SystemExit(code)

    monkeypatch.setattr(runner, "run_grid", interrupted)
    monkeypatch.setattr(os, "_exit", fake_exit)
    grid = tmp_path / "g.toml"
    grid.write_text(GOOD)
    r = CliRunner().invoke(cli, ["run", str(grid), "--db", str(db)])
    assert r.exit_code == 130, r.output
    assert seen == {"code": 130, "lock_left": False}
    assert "run the same command to resume" in r.output


def test_a_full_disk_under_duckdb_is_the_same_clear_fault(tmp_path, monkeypatch):
    """DuckDB reports a full disk as its own IOException: abl ingest (and abl run's per-cell ingest)
    turn it into the storage fault, exit 1 with a message, not a traceback."""
    import duckdb

    from abl.store import database

    runs = tmp_path / "runs"
    d = runs / "r1"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"experiment": "x", "seed": 0, "train": {"steps": 1}}))
    (d / "status.json").write_text(json.dumps({"status": "failed", "error": "boom"}))

    def full(con, run_dir, status_override=None):
        raise duckdb.IOException('IO Error: Could not write file "x.duckdb.wal": No space left on device')

    monkeypatch.setattr(database, "ingest_run", full)
    r = CliRunner().invoke(cli, ["ingest", "--db", str(tmp_path / "x.duckdb")])
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output and "No space left on device" in r.output
    assert "run abl ingest again" in r.output and not list(tmp_path.glob("*.lock"))
    from abl.run import runner

    with pytest.raises(OSError) as err:
        runner._ingest(tmp_path / "x.duckdb", d, None)
    assert err.value.errno == errno.ENOSPC
