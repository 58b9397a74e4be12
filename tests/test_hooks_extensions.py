"""Hooks beyond components (issue 38, 6): executors, metrics and post-training evaluations are registered by plugins
through register_executors, register_metrics and register_evaluations, abl's own through the same hooks; a
third-party executor and a third-party metric, each a --plugins-dir file, work end to end."""

import json
import os
import subprocess
import sys

import duckdb
import pytest
from conftest import ROOT, run_abl, write_plugins

# a third-party executor: every cell as a plain subprocess of the worker, two at once; it declares its capabilities
EXECUTOR_PLUGIN = '''
"""Cells as plain worker subprocesses on this machine, two at once (a third party's executor)."""
import os
import subprocess

from abl import hookimpl
from abl.pyexec import child_env
from abl.run.executors import Executor, worker_command


class TwoAtOnce(Executor):
    name = "two-at-once"
    local = True  # this machine: the memory check and the thread choice apply

    def __init__(self, slots):
        super().__init__()
        self.slots = slots

    def launch(self, job):
        with open(job.run_dir / "worker.log", "ab") as log:
            job.handle = subprocess.Popen(worker_command(job.run_dir, 1), stdout=log, stderr=log,
                                          stdin=subprocess.DEVNULL, env=child_env(dict(os.environ)))

    def poll(self, job):
        return job.handle.poll()

    def stop(self, job):
        job.handle.terminate()


@hookimpl
def register_executors(register):
    register("two-at-once", lambda options: TwoAtOnce(options.workers or 2), doc="two plain subprocesses at once")
'''

# a third-party metric: declared with its unit (register_metrics) and logged after training (register_evaluations)
METRIC_PLUGIN = '''
"""The root mean square of a trained model's weights (a third party's metric)."""
from abl import hookimpl


def param_rms(run):
    """Root mean square of every trained weight."""
    total, count = 0.0, 0
    for p in run.model.parameters():
        total += float(p.detach().float().pow(2).sum())
        count += p.numel()
    return {"param_rms": (total / count) ** 0.5}, []


@hookimpl
def register_metrics(register):
    register("param_rms", label="parameter RMS", unit="rms", kind="health", final="last", better="none",
             shown=True, description="root mean square of every trained weight")


@hookimpl
def register_evaluations(register):
    register("param_rms", param_rms, metrics=("param_rms",))
'''

TINY = """
[experiment]
name = "hooks"
seeds = [0]
[model]
d_model = 32
n_layers = 1
n_heads = 4
context = 16
[train]
steps = 4
batch_size = 2
eval_every = 4
eval_batches = 1
threads = 1
[eval]
decode = false
[dataset.pystdlib]
max_bytes = 100000
[grid]
"model.norm" = ["rmsnorm", "layernorm"]
"""


@pytest.fixture
def plugin_dir(tmp_path):
    return write_plugins(tmp_path / "plugins", {"two_at_once.py": EXECUTOR_PLUGIN, "param_rms.py": METRIC_PLUGIN})


def test_the_built_ins_come_through_the_hooks_and_abl_plugins_lists_where_each_came_from(plugin_dir):
    r = run_abl(["plugins", "--json", "--plugins-dir", str(plugin_dir)])
    assert r.returncode == 0, r.stderr
    rows = {(x["axis"], x["name"]): x for x in json.loads(r.stdout)}
    for name in ("local", "slurm", "ray"):
        assert rows[("executor", name)]["plugin"] == "executors" and rows[("executor", name)]["package"] == "abl"
    for name in ("decode", "extrapolation", "probes"):
        assert rows[("evaluation", name)]["plugin"] == "evaluations"
    assert rows[("metric", "val_loss")]["plugin"] == "metrics" and rows[("metric", "val_loss")]["shown"]
    assert rows[("executor", "two-at-once")]["origin"] == "two_at_once.py from --plugins-dir"
    assert rows[("evaluation", "param_rms")]["origin"] == "param_rms.py from --plugins-dir"
    metric = rows[("metric", "param_rms")]
    assert (metric["unit"], metric["label"], metric["kind"], metric["shown"]) == ("rms", "parameter RMS", "health", True)
    text = run_abl(["plugins", "--plugins-dir", str(plugin_dir)]).stdout
    assert "two-at-once  two_at_once.py from --plugins-dir" in text and "param_rms [rms]" in text


def test_executor_choices_come_from_the_registry(tmp_path, plugin_dir):
    grid = tmp_path / "g.toml"
    grid.write_text(TINY)
    r = run_abl(["run", str(grid), "--dry-run", "--executor", "two-at-once"])  # not installed without the folder
    assert r.returncode == 2 and "two-at-once" in r.stderr and "local" in r.stderr and "Traceback" not in r.stderr
    r = run_abl(["run", str(grid), "--dry-run", "--executor", "two-at-once", "--plugins-dir", str(plugin_dir)])
    assert r.returncode == 0, r.stderr


def test_a_broken_metric_declaration_is_named_not_a_traceback(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "bad_metric.py").write_text(
        "from abl import hookimpl\n\n@hookimpl\ndef register_metrics(register):\n"
        "    register('odd', unit='x', final='mean')\n")
    r = run_abl(["plugins", "--plugins-dir", str(folder)])
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "'file:bad_metric'" in r.stderr and "final 'mean' is not one of last, median, max" in r.stderr
    (folder / "bad_metric.py").write_text(
        "from abl import hookimpl\n\n@hookimpl\ndef register_metrics(register):\n    register('val_loss', unit='x')\n")
    r = run_abl(["plugins", "--plugins-dir", str(folder)])
    assert r.returncode == 2 and "metric 'val_loss' is declared twice" in r.stderr, r.stderr


@pytest.mark.slow
def test_a_third_party_executor_runs_a_grid_and_its_metric_reaches_compare_report_and_dashboard(tmp_path, plugin_dir):
    grid = tmp_path / "g.toml"
    grid.write_text(TINY)
    db = tmp_path / "store" / "abl.duckdb"
    plugins = ["--plugins-dir", str(plugin_dir)]
    r = run_abl([*plugins, "run", str(grid), "--db", str(db), "--executor", "two-at-once"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "parameter RMS" in r.stdout  # declared shown by default: the run summary shows it
    con = duckdb.connect(str(db), read_only=True)
    executors = con.execute("SELECT executor, status, count(*) FROM runs GROUP BY ALL").fetchall()
    logged = con.execute("SELECT count(DISTINCT run_id) FROM metrics WHERE name = 'param_rms'").fetchone()[0]
    con.close()
    assert executors == [("two-at-once", "completed", 2)]
    assert logged == 2

    r = run_abl([*plugins, "compare", str(grid), "--db", str(db), "--metric", "val_loss", "--metric", "param_rms",
                 "--format", "json"])
    assert r.returncode == 0, r.stderr
    assert "param_rms" in r.stdout
    r = run_abl([*plugins, "compare", str(grid), "--db", str(db), "--wide"])
    assert r.returncode == 0, r.stderr
    assert "parameter RMS (rms)" in r.stdout  # its label and its unit, by default (shown)

    out = tmp_path / "report"
    r = run_abl([*plugins, "report", str(grid), "--db", str(db), "--out", str(out)])
    assert r.returncode == 0, r.stdout + r.stderr
    report = "\n".join(p.read_text() for p in out.rglob("*.md"))
    assert "parameter RMS (rms)" in report and "0.1" in report and " rms |" in report

    # the dashboard's Python side: the catalogue it reads knows the plugin's metric and unit
    code = ("from abl.dashboard import queries as q\n"
            f"store = q.Store({str(db)!r}, {str(db.parent / 'runs')!r})\n"
            "sel = q.Selection(experiments=('hooks',))\n"
            "names = q.metric_names(store, sel)\n"
            "assert 'param_rms' in names, names\n"
            "info = q.metric_info('param_rms')\n"
            "assert (info.unit, info.label) == ('rms', 'parameter RMS'), info\n"
            "from abl.analysis.metrics import shown_by_default\n"
            "assert 'param_rms' in shown_by_default(), shown_by_default()\n"
            "finals = q.finals(store, sel, ['param_rms'])\n"
            "print(finals.to_json())\n")
    env = dict(os.environ, ABL_PLUGINS_DIR=str(plugin_dir))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "param_rms" in done.stdout


def test_a_reader_loads_the_metric_declarations_without_torch_and_a_later_full_load_keeps_the_built_ins_first(
        tmp_path):
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "aaa_norm.py").write_text(  # sorts first among the files; its norm still comes after abl's own
        "from abl import hookimpl\n\nclass Ident:\n    def __init__(self, dim):\n        pass\n\n"
        "@hookimpl\ndef register_components(register):\n    register('norm', 'aaa_ident', Ident)\n\n"
        "@hookimpl\ndef register_metrics(register):\n    register('aaa_score', unit='points', better='higher')\n")
    code = ("import sys\n"
            "from abl.analysis import metrics\n"
            "m = metrics.metric('aaa_score')\n"
            "assert (m.unit, m.better, m.plugin) == ('points', 'higher', 'file:aaa_norm'), m\n"
            "assert metrics.metric('val_loss').plugin == 'metrics'\n"
            "assert 'torch' not in sys.modules, 'the light load imported torch'\n"
            "from abl.contracts.plugin_manager import get_registry, ordered_impls, pm\n"
            "assert get_registry().get('norm', 'aaa_ident')\n"
            "order = [i.plugin_name for i in ordered_impls(pm.hook.register_components)]\n"
            "assert order[0] == 'norms' and order[-1] == 'file:aaa_norm', order\n"
            "from abl.run.executors import registered\n"
            "assert list(registered()) == ['local', 'slurm', 'ray']\n")
    env = dict(os.environ, ABL_PLUGINS_DIR=str(folder))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr


def test_capabilities_are_declared_not_probed(tmp_path, monkeypatch):
    from abl.contracts.plugin_manager import PluginLoadError
    from abl.run import admission, executors

    class Remote(executors.Executor):
        name = "remote"  # local stays False: its cells run elsewhere, so this machine's memory is not checked

    def admit(*a, **k):
        raise AssertionError("a remote executor's cells were checked against this machine's memory")

    monkeypatch.setattr(admission, "admit", admit)
    assert admission.check_run([], None, tmp_path, Remote(), retry_failed=False) == []  # type: ignore[arg-type]
    local = executors.LocalExecutor(workers=3, gpus=[])
    assert (local.local, local.slots, local.use_gpus, local.free_gpus) == (True, 3, False, [])
    monkeypatch.setattr(executors, "registered", lambda: {"odd": executors.ExecutorEntry("odd", lambda o: object(),
                                                                                         plugin="file:odd")})
    with pytest.raises(PluginLoadError, match="'odd' .*built a object, not an abl.run.executors.Executor"):
        executors.make_executor("odd", executors.ExecutorOptions())
    with pytest.raises(PluginLoadError, match="unknown executor 'nope'; registered: odd"):
        executors.make_executor("nope", executors.ExecutorOptions())
