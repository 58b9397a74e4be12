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


def cut_middle(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, cut from the middle (``softm…tion``): its start and
    its end, where the levels of an axis usually differ, both stay."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:max(0, width)]
    head = width // 2
    tail = width - 1 - head
    return text[:head] + "…" + (text[len(text) - tail:] if tail else "")


def _reads_as(shown: str, level: str) -> bool:
    """Whether a reader of ``shown`` (a level whole, or cut by ``cut_middle``) could take it for ``level``."""
    if "…" not in shown:
        return shown == level
    head, _, tail = shown.partition("…")
    return len(level) >= len(shown) and level.startswith(head) and level.endswith(tail)


def distinct_width(levels: Sequence[str], floor: int = 5) -> int:
    """The fewest characters (at least ``floor``) each of an axis's levels can be cut to
    (``cut_middle``) so that each reads as itself only (``soft…tion`` cannot be taken for another
    level): below it, a cut label would lose which level the cell has."""
    distinct = list(dict.fromkeys(levels))
    longest = max((len(v) for v in distinct), default=0)
    for width in range(min(floor, longest), longest + 1):
        if all(sum(_reads_as(cut_middle(v, width), u) for u in distinct) == 1 for v in distinct):
            return width
    return longest


def fit_varied(parts: Sequence[tuple[str, str]], room: int, levels: Sequence[Sequence[str]] | None = None,
               sep: str = ", ", names: bool | None = None) -> str:
    """A cell's varied values (``(axis, value)`` pairs, in the grid's order) in ``room`` characters,
    without losing any: ``norm=rmsnorm, block=post`` whole when it fits; else the values alone
    (``rmsnorm, post``); else each value cut from the middle, the longest first, but never below the
    width that keeps it apart from the other levels of its axis (``levels``, one list per part; without
    them, 5 characters). Where even that does not fit, the result is longer than ``room``: the caller's
    column cuts its end, but every level stays readable up to there. ``names`` False drops the axis
    names even where they would fit (the same form on every line of a grid whose longest label needs it)."""
    full = sep.join(f"{a}={v}" if a else v for a, v in parts)
    if (len(full) <= room and names is not False) or not parts:
        return full
    values = [v for _, v in parts]
    if len(sep.join(values)) <= room:
        return sep.join(values)
    floors = [distinct_width(list(levels[i]) if levels is not None and i < len(levels) and levels[i] else [v])
              for i, v in enumerate(values)]
    widths = [len(v) for v in values]

    def length() -> int:
        return sum(widths) + len(sep) * (len(widths) - 1)

    while length() > room:
        i = max((j for j in range(len(widths)) if widths[j] > floors[j]), key=lambda j: widths[j], default=None)
        if i is None:
            break
        widths[i] -= 1
    return sep.join(cut_middle(v, w) for v, w in zip(values, widths))
