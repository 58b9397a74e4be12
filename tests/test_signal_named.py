"""A signal is named as abl run received it (issue 40, finding 7): a Ctrl-C (SIGINT to abl run) stops the
running cells with SIGTERM to their workers, and a worker writes "stopped by signal SIGTERM"; the cell's
status must say SIGINT to abl run, the signal the user sent, not the one abl passed on."""

import json

import pytest
from test_statuses_agree import _Display, copy_of, finished, rows, status_json  # noqa: F401 - the fixture

from abl.contracts.status import EXIT_CODES, KILLED


@pytest.mark.slow
@pytest.mark.parametrize("sent", ["SIGINT", "SIGTERM"])
def test_a_cell_stopped_by_abl_run_names_the_signal_abl_run_received(finished, tmp_path, sent):  # noqa: F811
    from abl.run.executors import Job
    from abl.run.runner import CellEvents

    db, runs, run_dir = copy_of(finished, tmp_path)
    st = status_json(run_dir)
    st.update(status=KILLED, error="stopped by signal SIGTERM")  # what the worker writes on abl's SIGTERM
    (run_dir / "status.json").write_text(json.dumps(st))
    cell = type("C", (), {"run_id": run_dir.name, "label": "x", "seed": 0,
                          "config": json.loads((run_dir / "config.json").read_text())})()
    job = Job(cell=cell, run_dir=run_dir, index=0, handle=object(), returncode=EXIT_CODES[KILLED], killed=True)
    display = _Display()
    events = CellEvents(db, runs, {}, {}, display)
    events.stop_reason = f"stopped by {sent} to abl run"
    events.on_done(job)
    status, error = rows(db, "SELECT status, error FROM runs WHERE run_id = ?", [run_dir.name])[0]
    assert status == "killed" and error.startswith(f"stopped by {sent} to abl run"), error
    assert (status_json(run_dir)["status"], status_json(run_dir)["error"]) == (status, error)
    assert any(f"{sent} to abl run" in line for line in display.printed), display.printed
