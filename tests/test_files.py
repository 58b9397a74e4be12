"""abl.files: a file another process may read is replaced whole, and a failed write leaves nothing behind."""

from __future__ import annotations

import json
import os

import pytest

from abl import files


def test_write_json_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "status.json"
    files.write_json(path, {"status": "running"})
    files.write_json(path, {"status": "completed"}, fsync=True)
    assert json.loads(path.read_text()) == {"status": "completed"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path):
    """A full disk (ENOSPC) while writing: the old file stays whole, the half-written temporary goes."""
    path = tmp_path / "metrics.jsonl"
    files.write_text(path, "old\n")
    with pytest.raises(OSError):
        with files.replacing(path) as tmp:
            tmp.write_text("half of the new conte")
            raise OSError(28, os.strerror(28))
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_two_processes_never_share_a_temporary_name(tmp_path):
    assert str(os.getpid()) in files.temporary_beside(tmp_path / "x.json").name
