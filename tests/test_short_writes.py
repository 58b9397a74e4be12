"""Storage errors recognised by what they are, short writes included (issue 39, finding 7).

numpy's ``tofile`` reports a full disk as an OSError with no error number ("N requested and M
written"), some writers as a ValueError, and a write can come up short with no error at all. Every
write of the token store checks the size it left; a short one is an OSError (ENOSPC or EIO) naming
the file, which ``abl run`` reports as a full disk: a message, exit 1, nothing half-written kept.
"""

import errno
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import tiny_grid_text

from abl import files
from abl.cli import cli
from abl.data import tokenstore


def short_array(arr, error):
    """``arr`` as an array whose ``tofile`` writes half its bytes, then fails as ``error`` says."""

    class Short(np.ndarray):
        def tofile(self, fid, *args, **kwargs):
            data = np.asarray(self).tobytes()
            Path(fid).write_bytes(data[: len(data) // 2])
            if error == "oserror":
                raise OSError(f"{len(data)} requested and {len(data) // 2} written")
            if error == "valueerror":
                raise ValueError("short write")

    return arr.view(Short)


@pytest.mark.parametrize("error", ["oserror", "valueerror", "silent"])
def test_a_short_write_is_an_oserror_with_a_storage_errno_naming_the_file(tmp_path, error):
    arr = short_array(np.arange(1000, dtype=np.uint16), error)
    target = tmp_path / "train.bin"
    with pytest.raises(OSError) as got:
        files.write_sized(target, arr.nbytes, arr.tofile)
    assert got.value.errno in (errno.ENOSPC, errno.EIO)
    assert got.value.filename == str(target)
    assert "1,000 of 2,000 bytes" in got.value.strerror


def test_an_errorless_write_of_the_right_size_passes_and_a_bug_keeps_its_error(tmp_path):
    arr = np.arange(10, dtype=np.int64)
    files.write_sized(tmp_path / "a.bin", arr.nbytes, arr.tofile)
    assert np.fromfile(tmp_path / "a.bin", dtype=np.int64).tolist() == list(range(10))

    def bug(path):  # wrote everything, then failed for a reason that is not the storage's
        path.write_bytes(b"xy")
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        files.write_sized(tmp_path / "b.bin", 2, bug)


def test_a_short_text_write_through_abl_files_leaves_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "x.json"
    files.write_text(target, "old")

    def short(self, data, *args, **kwargs):
        with open(self, "w") as f:
            f.write(data[:1])
        return 1

    monkeypatch.setattr(Path, "write_text", short)
    with pytest.raises(OSError) as got:
        files.write_text(target, "new text")
    assert got.value.errno in (errno.ENOSPC, errno.EIO)
    monkeypatch.undo()
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["x.json"]


@pytest.mark.parametrize("error", ["oserror", "valueerror", "silent"])
def test_a_short_token_store_write_is_a_full_disk_for_abl_run(tmp_path, monkeypatch, error):
    real = tokenstore.prepare_tokens

    def prepare_short(*args, **kwargs):
        prepared = real(*args, **kwargs)
        if prepared.arrays:
            prepared.arrays = {name: short_array(a, error) for name, a in prepared.arrays.items()}
        return prepared

    monkeypatch.setattr(tokenstore, "prepare_tokens", prepare_short)
    grid = tmp_path / "g.toml"
    grid.write_text(tiny_grid_text(train={"steps": 2, "batch_size": 2, "eval_every": 2, "eval_batches": 1}))
    db = tmp_path / "store.duckdb"
    r = CliRunner().invoke(cli, ["run", str(grid), "--db", str(db)])
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output and isinstance(r.exception, SystemExit), r.output
    assert "bytes" in r.output and "run the same command to resume" in r.output
    tokens = list(tmp_path.rglob("*.bin"))
    assert tokens == [], f"a half-written token store entry was left: {tokens}"
    assert not list(tmp_path.rglob("*.tmp*")) and not list(tmp_path.rglob("*.lock"))
    if db.exists():
        import duckdb

        con = duckdb.connect(str(db), read_only=True)
        try:
            assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        finally:
            con.close()
