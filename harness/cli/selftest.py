"""``abl selftest``: validate this machine in one command (the checks: abl.bench.selftest)."""

from __future__ import annotations

import json
import sys
import time

import click

from ..store.workspace import DEFAULT_DB, Workspace
from .common import fail, user_errors

STATUS_STYLE = {"pass": "green", "fail": "bold red", "skip": "yellow", "info": ""}


@click.command("selftest")
@click.option("--quick", is_flag=True, help="Small sizes, one shape per op and dtype, short cells (what CI runs; "
              "on a CPU the kernels run in the Triton interpreter).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout (progress goes to stderr).")
@click.option("--db", "db_path", default=DEFAULT_DB, show_default=True,
              help="DuckDB file to write the report's rows to (table selftest); its JSON file goes beside it, "
                   "in selftest/.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
def command(quick, as_json, db_path, device):
    """Validate this machine in one command: environment, kernels, peaks, kernel bench, training.

    Reports the device and versions, which precisions are real here and which
    optional kernel providers import; checks every kernel op forward and
    backward against its reference; measures matmul and copy peaks beside the
    recorded ones; times the kernels against those peaks; trains short cells
    per precision, kernel backend and compile mode and checks that their
    losses agree. Writes a table, a JSON file and rows in the store; exits 1
    when a check fails.
    """
    import torch

    from ..kernels import enable_interpreter

    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        fail(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")
    from ..run.preflight import db_problems

    ws = Workspace.at(db_path)  # --db has a default: no rule to apply
    problems = db_problems(ws.db)  # a store that cannot take the rows (damaged, a folder): before any check
    if problems:
        fail("\n".join(problems))
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        # before anything imports triton: on a CPU the kernels run in its interpreter
        enable_interpreter()
    from .. import files
    from ..bench.selftest import SECTIONS, run_selftest, store_report
    from ..train.loop import resolve_device

    try:
        dev = resolve_device(device)
    except (RuntimeError, ValueError) as exc:
        fail(str(exc))
    t0 = time.perf_counter()
    report = run_selftest(dev, quick, log=lambda msg: click.echo(f"[{time.perf_counter() - t0:6.1f} s] {msg}", err=True),
                          cache_dir=ws.shapes)
    out = report.as_json()
    json_path = ws.selftest / f"{report.created:%Y%m%d-%H%M%S}-{report.selftest_id}.json"
    try:
        store_report(ws.db, report)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        files.write_json(json_path, out)
    except user_errors() as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {json_path}: {exc.strerror or exc}")
    if as_json:
        click.echo(json.dumps(out, indent=1, default=str))
    else:
        print_report(report, SECTIONS)
    verdict = (f"{len(report.failed)} check(s) FAILED" if report.failed
               else f"all {sum(c.status == 'pass' for c in report.checks)} checks passed")
    took = f"{time.perf_counter() - t0:.0f} s"
    if report.timings_s:  # the sections' share of it
        took += f" ({', '.join(f'{k} {v:.0f} s' for k, v in report.timings_s.items())})"
    click.echo(f"abl selftest{' --quick' if quick else ''} on {report.device}: {verdict} in {took}; JSON {json_path}; "
               f"{len(report.checks)} rows in {db_path} (table selftest)", err=as_json)
    if report.failed:
        sys.exit(1)


def print_report(report, sections) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.width = max(console.width, 150)  # one row per line, also when piped
    for section in sections:
        checks = [c for c in report.checks if c.section == section]
        if not checks:
            continue
        table = Table(title=f"abl selftest: {section}", title_justify="left")
        table.add_column("check")
        table.add_column("status")
        table.add_column("value", justify="right")
        table.add_column("detail", overflow="fold")
        for c in checks:
            value = "" if c.value is None else f"{c.value:.4g} {c.unit}".strip()
            table.add_row(c.name, f"[{STATUS_STYLE[c.status]}]{c.status}[/]" if STATUS_STYLE[c.status] else c.status,
                          value, c.detail)
        console.print(table)
