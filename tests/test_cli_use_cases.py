"""Commands as use cases: each cli/<command>.py declares its command beside its body, and how a summary is
printed is passed along, never set on a module (no process-global presentation state)."""

import ast
import inspect
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "harness" / "cli"


def test_each_command_is_declared_in_its_own_module():
    import abl.cli
    from abl.cli import bench, compare, cost, dashboard, ingest, ladder, plugins, report, run, selftest

    modules = {"run": run, "plugins": plugins, "ingest": ingest, "dashboard": dashboard, "cost": cost,
               "report": report, "compare": compare, "ladder": ladder, "bench": bench, "selftest": selftest}
    assert set(abl.cli.cli.commands) == set(modules)
    for name, module in modules.items():
        cmd = abl.cli.cli.commands[name]
        assert cmd is module.command and isinstance(cmd, click.Command)
        assert inspect.getmodule(cmd.callback) is module  # its body is in the same module as its options
    # the group's module declares no option of a command: only the group's own
    tree = ast.parse((CLI / "__init__.py").read_text())
    options = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in ("option", "argument")]
    assert options == []


def test_no_process_global_presentation():
    """The summary's layout and format reach it as an argument: no module-level Presentation to mutate."""
    from abl.present import termlayout
    from abl.run import lr_sweep, runner

    for module in (termlayout, runner, lr_sweep):
        assert not [k for k, v in vars(module).items() if isinstance(v, termlayout.Presentation)], module
    assert "presentation" in inspect.signature(runner.run_grid).parameters
    assert "presentation" in inspect.signature(lr_sweep.run_sweep).parameters
    for path in [*(ROOT / "harness").rglob("*.py"), *(ROOT / "dashboard").rglob("*.py")]:
        assert "PRESENTATION" not in path.read_text(), path


def test_no_callback_is_injected_where_a_direct_call_does():
    """abl compare is its own use case: present/ takes no ``compared=`` or ``default_db`` hook from the CLI."""
    for path in (ROOT / "harness" / "present").rglob("*.py"):
        text = path.read_text()
        assert "default_db" not in text and "compared=" not in text, path
