"""Terminal layout shared by the verdict tables (abl.present.summary), the task-accuracy table (abl.present.taskreport)
and the lr-sweep table (abl.run.lr_sweep): how they are printed (``abl run --wide / --format``) and the
helpers that fit a table to the terminal or stack it into wrapped lines. Imports nothing of abl."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass
class Presentation:
    """How the summary is printed: ``layout`` auto (a table when it fits the terminal, else the stacked
    layout), wide (the full tables) or stacked; ``fmt`` table (the terminal), json, csv or md."""

    layout: str = "auto"
    fmt: str = "table"

def fits(console, renderable) -> bool:
    from rich.measure import Measurement

    return Measurement.get(console, console.options.update(width=10_000), renderable).maximum <= console.width


def print_wide(console, renderable) -> None:
    """Print at the renderable's full width, wider than the terminal if need be (the terminal wraps)."""
    from rich.measure import Measurement

    saved = console.width
    need = Measurement.get(console, console.options.update(width=10_000), renderable).maximum
    console.width = max(saved, need)
    try:
        console.print(renderable)
    finally:
        console.width = saved


def wrap(text: str, width: int, indent: str, first: str | None = None) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width=max(20, width), initial_indent=indent if first is None else first,
                         subsequent_indent=indent, break_on_hyphens=False) or [indent.rstrip()]


def pack(items: Sequence[str], width: int, indent: str) -> list[str]:
    """Items on indented lines, as many per line as fit (an item too long for a line is wrapped)."""
    lines: list[str] = []
    cur = ""
    for item in (i for i in items if i):
        if cur and len(indent) + len(cur) + 3 + len(item) <= width:
            cur += "   " + item
            continue
        if cur:
            lines.append(indent + cur)
        if len(indent) + len(item) <= width:
            cur = item
        else:
            lines += wrap(item, width, indent + "  ", first=indent)
            cur = ""
    if cur:
        lines.append(indent + cur)
    return lines


LOG_WIDTH = 200  # the width of output that is not a terminal (a log file, a pipe) unless COLUMNS says


def output_console():
    """The console for a command's output: the terminal's width in a terminal; elsewhere (a log
    file, a pipe, CI) ``COLUMNS`` when it is set, else ``LOG_WIDTH``, so a log keeps the full tables."""
    import os

    from rich.console import Console

    console = Console()
    if console.is_terminal:
        return console
    cols = os.environ.get("COLUMNS", "")
    return Console(width=int(cols) if cols.isdigit() and int(cols) > 0 else max(console.width, LOG_WIDTH))


def print_wrapped(console, text: str, indent: str = "    ") -> None:
    """Print ``text`` wrapped at the console's width (a terminal's, or ``COLUMNS`` in a log: see
    ``output_console``), each paragraph's continuation lines indented; no markup, no highlighting."""
    lines = []
    for para in text.splitlines() or [""]:
        lead = para[:len(para) - len(para.lstrip())]
        lines += wrap(para.strip(), console.width, lead + indent, first=lead) if para.strip() else [""]
    console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
