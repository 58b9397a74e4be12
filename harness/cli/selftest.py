"""``abl selftest``: validate this machine in one command (options: abl.cli; the checks: abl.bench.selftest)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from .common import fail, user_errors

STATUS_STYLE = {"pass": "green", "fail": "bold red", "skip": "yellow", "info": ""}


def selftest(quick, as_json, db_path, device):
    """The body of ``abl selftest``: its options and help are declared in abl.cli."""
    import torch

    from ..kernels import enable_interpreter

    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        fail(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")
    from ..run.preflight import db_problems

    problems = db_problems(Path(db_path))  # a store that cannot take the rows (damaged, a folder): before any check
    if problems:
        fail("\n".join(problems))
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        # before anything imports triton: on a CPU the kernels run in its interpreter
        enable_interpreter()
    from .. import files
    from ..bench.selftest import SECTIONS, run_selftest, store_report
    from ..run.train import resolve_device

    try:
        dev = resolve_device(device)
    except (RuntimeError, ValueError) as exc:
        fail(str(exc))
    t0 = time.perf_counter()
    from ..store.rundir import SHAPES_DIR

    report = run_selftest(dev, quick, log=lambda msg: click.echo(f"[{time.perf_counter() - t0:6.1f} s] {msg}", err=True),
                          cache_dir=Path(db_path).parent / SHAPES_DIR)
    out = report.as_json()
    json_path = Path(db_path).parent / "selftest" / f"{report.created:%Y%m%d-%H%M%S}-{report.selftest_id}.json"
    try:
        store_report(Path(db_path), report)
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
    click.echo(f"abl selftest on {report.device}: {verdict}; JSON {json_path}; "
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
