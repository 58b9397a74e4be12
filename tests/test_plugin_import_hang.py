"""A plugin whose import never returns (issue 39): plugins load when a command starts, so every ``abl``
command that loads plugins must bound that load, and end with exit 2 naming the plugin file and line,
no lock left, nothing trained (``ABL_PLUGIN_TIMEOUT`` or ``abl run --plugin-timeout`` gives the limit)."""

import time
from pathlib import Path

import pytest
from conftest import run_abl, tiny_grid_text, write_plugins

HANGS = {
    "sleep": "import time\n\nX = 1\ntime.sleep(10**6)\n",
    "loop": "X = 0\nwhile True:\n    X += 1\n",
}
LINE = {"sleep": (4,), "loop": (2, 3)}  # the loop is caught on its test or its body


def _check(r, started, kind):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert time.time() - started < 50
    assert "Traceback" not in r.stderr, r.stderr
    assert "hang_at_import.py" in r.stderr and any(f"line {n}." in r.stderr for n in LINE[kind]), r.stderr
    assert "did not return within 2 s" in r.stderr, r.stderr


@pytest.mark.parametrize("kind", sorted(HANGS))
@pytest.mark.parametrize("args", [["plugins"], ["cost", "{grid}"], ["report", "{grid}", "--db", "{db}"],
                                  ["compare", "{grid}", "--db", "{db}"], ["selftest", "--help-unknown-plugin-cmd"]],
                         ids=["plugins", "cost", "report", "compare", "plugin-command"])
def test_every_command_stops_on_a_plugin_whose_import_hangs(tmp_path, kind, args):
    plugins = write_plugins(tmp_path / "plug", {"hang_at_import.py": HANGS[kind]})
    grid = tmp_path / "g.toml"
    grid.write_text(tiny_grid_text())
    db = tmp_path / "x.duckdb"
    if args[0] == "selftest":  # a command abl does not have: the plugins are loaded to look for it
        args = ["no-such-command"]
    args = [a.format(grid=grid, db=db) for a in args]
    started = time.time()
    r = run_abl(["--plugins-dir", str(plugins), *args], env={"ABL_PLUGIN_TIMEOUT": "2"}, timeout=60)
    _check(r, started, kind)


@pytest.mark.parametrize("kind", sorted(HANGS))
def test_abl_run_stops_on_a_plugin_whose_import_hangs_with_no_lock_and_nothing_trained(tmp_path, kind):
    plugins = write_plugins(tmp_path / "plug", {"hang_at_import.py": HANGS[kind]})
    grid = tmp_path / "g.toml"
    grid.write_text(tiny_grid_text())
    db, runs = tmp_path / "x.duckdb", tmp_path / "runs"
    started = time.time()
    r = run_abl(["--plugins-dir", str(plugins), "run", str(grid), "--db", str(db), "--runs-dir", str(runs),
                 "--plugin-timeout", "2"], env={"ABL_ZYGOTE": "0"}, timeout=60)
    # (the plugins load while `abl run` reads its options: --plugin-timeout, read first, bounds that load;
    # tests/test_guard_plugin_limits.py checks it before and after --executor with ABL_PLUGIN_TIMEOUT unset)
    _check(r, started, kind)
    assert not Path(str(db) + ".lock").exists()
    assert not runs.exists() or not any(runs.iterdir())


def test_a_register_commands_hook_that_never_returns_stops_the_command_it_was_asked_for(tmp_path):
    """An unknown command makes abl ask the plugins for their commands (register_commands): a hook that never
    returns there is bounded like the import."""
    plugin = ("import time\n\nfrom abl import hookimpl\n\n\n@hookimpl\ndef register_commands(cli):\n"
              "    time.sleep(10**6)\n")
    plugins = write_plugins(tmp_path / "plug", {"hang_at_import.py": plugin})
    started = time.time()
    r = run_abl(["--plugins-dir", str(plugins), "no-such-command"], env={"ABL_PLUGIN_TIMEOUT": "2"}, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert time.time() - started < 50 and "Traceback" not in r.stderr, r.stderr
    assert "register_commands" in r.stderr and "hang_at_import.py, line 8" in r.stderr, r.stderr
