"""The report as a document: headings, paragraphs, tables, figures; written as Markdown or HTML.

The blocks are written once as Markdown (``report.md``); the HTML report is
that Markdown rendered by markdown-it-py, with the plots embedded, so the two
say the same thing.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from html import escape
from typing import Any

from ...analysis import stats
from ...analysis.formats import fmt_bytes


@dataclass
class Doc:
    blocks: list[tuple] = field(default_factory=list)

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", level, text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def table(self, headers: list[str], rows: list[list[Any]], caption: str = "") -> None:
        self.blocks.append(("table", headers, [[("-" if x is None else str(x)) for x in r] for r in rows],
                            caption))

    def image(self, name: str, png: bytes | None, caption: str) -> None:
        if png:
            self.blocks.append(("img", name, png, caption))

    def pre(self, text: str) -> None:
        self.blocks.append(("pre", text))

    def details(self, summary: str, headers: list[str], rows: list[list[Any]], caption: str = "") -> None:
        """A table folded away in HTML (a <details> block); left out of Markdown."""
        self.blocks.append(("details", summary, headers,
                            [[("-" if x is None else str(x)) for x in r] for r in rows], caption))

    def markdown(self) -> str:
        """The report as Markdown, the PNGs beside it by file name (``report.md``)."""
        return self._markdown(html=False)

    def html(self, title: str) -> str:
        """One self-contained HTML page: the same Markdown, plots embedded as data URIs and the folded
        tables as <details>, rendered by markdown-it-py (CommonMark with GFM tables)."""
        from markdown_it import MarkdownIt

        body = MarkdownIt("commonmark", {"html": True}).enable("table").render(self._markdown(html=True))
        return (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
                f"<style>{STYLE}</style></head><body>\n{body}</body></html>\n")

    def _markdown(self, html: bool) -> str:
        # for HTML, text is text: a "<task>" in a sentence must not become a tag
        e = _entities if html else str
        out = []
        for b in self.blocks:
            if b[0] == "h":
                out.append("#" * b[1] + " " + e(b[2]))
            elif b[0] == "p":
                out.append(e(b[1]))
            elif b[0] == "table":
                _, headers, rows, caption = b
                out.append(_table([e(h) for h in headers], [[e(x) for x in r] for r in rows], e(caption)))
            elif b[0] == "img":
                _, name, png, caption = b
                src = f"data:image/png;base64,{base64.b64encode(png).decode()}" if html else name
                out.append(f"![{name.rsplit('.', 1)[0].replace('_', ' ')}]({src})\n\n*{e(caption)}*")
            elif b[0] == "pre":
                out.append("```\n" + b[1] + "\n```")
            elif b[0] == "details" and html:  # Markdown has no folding: left out of report.md
                _, summary, headers, rows, caption = b
                out.append(f"<details><summary>{escape(summary)}</summary>\n\n"
                           f"{_table([e(h) for h in headers], [[e(x) for x in r] for r in rows], e(caption))}"
                           "\n\n</details>")
        return "\n\n".join(out) + "\n"


def _entities(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;")


def _table(headers: list[str], rows: list[list[str]], caption: str = "") -> str:
    def cell(x: str) -> str:
        return x.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(cell, headers)) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(map(cell, r)) + " |" for r in rows]
    if caption:
        lines += ["", f"*{caption}*"]
    return "\n".join(lines)


# wide tables scroll inside themselves, figures shrink to the window: the page never scrolls sideways
STYLE = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
         "table{border-collapse:collapse;font-size:13px;margin:.5em 0;display:block;overflow-x:auto;max-width:100%}"
         "td,th{border:1px solid #ccc;padding:3px 7px;text-align:left}th{background:#f3f3f3}"
         "table+p em,img+em,p>em:only-child{font-size:12px;color:#555}"
         "img{max-width:100%;height:auto}pre{background:#f6f6f6;padding:8px;overflow-x:auto}"
         "details{margin:.5em 0}summary{cursor:pointer}")


def cell_num(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if isinstance(x, int) or (x.is_integer() and abs(x) < 1e15):
        return f"{int(x):,}"
    return f"{x:.4g}"


def cell_bytes(n: float | None) -> str:
    return fmt_bytes(n, decimals=2)


def cell_pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def cell_ci(lo: float | None, hi: float | None) -> str:
    return "-" if lo is None or hi is None else f"[{stats.fmt(lo)}, {stats.fmt(hi)}]"


def cell_signed(x: float | None) -> str:
    return "-" if x is None else f"{x:+.4f}"

