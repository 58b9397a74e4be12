"""``abl dashboard --snapshot OUT_DIR``: a full-page PNG of every dashboard page.

Streamlit draws its pages in the browser, after the page has loaded: a plain
``chromium --headless --screenshot URL`` captures the empty shell before the
app has run, a blank image. This module serves the app on a free loopback
port, opens each page in headless Chromium (Playwright driving the system's
``chromium``: no browser download), waits until the script has finished (the app's
script state is ``notRunning``, no spinner, the main block has content, every chart has drawn its
marks, fonts loaded) and saves ``<page>-<width>.png``.

The app scrolls inside its own container, so the window is grown to the
height of that container's content before the screenshot: the PNG holds the
whole page.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from abl.dashboard import pages

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]
HEIGHT = 900  # the window's height before it is grown to the page's
MAX_HEIGHT = 12_000

# true once the script has finished and everything it drew is on screen
READY = """() => {
    const app = document.querySelector('[data-testid="stApp"]');
    // the script's state, as Streamlit's own end-to-end tests read it; a status widget or spinner: still running
    if (!app || app.getAttribute('data-test-script-state') !== 'notRunning') return false;
    if (document.querySelector('[data-testid="stStatusWidget"], [data-testid="stSpinner"]')) return false;
    const main = document.querySelector('[data-testid="stMainBlockContainer"]');
    if (!main || main.querySelector('[data-testid="stSkeleton"]')) return false;
    const blocks = main.querySelectorAll('[data-testid="stElementContainer"]');
    if (blocks.length === 0) return false;
    const charts = [...main.querySelectorAll('[data-testid="stVegaLiteChart"]')];
    const drawn = charts.every(el => {
        const svg = el.querySelector('svg.marks'), canvas = el.querySelector('canvas');
        if (svg) return svg.clientWidth > 50 && svg.clientHeight > 50;
        return canvas !== null && canvas.width > 50 && canvas.height > 50;
    });
    return drawn && document.fonts.status === 'loaded';
}"""

# every table (st.dataframe, st.table) that hides columns or rows behind a scroll bar of its own: an element
# inside it that scrolls and whose content is wider (or taller) than its box
CUT_TABLES = """() => {
    const out = [];
    document.querySelectorAll('[data-testid="stDataFrame"], [data-testid="stTable"]').forEach((el, i) => {
        for (const e of [el, ...el.querySelectorAll('*')]) {
            const st = getComputedStyle(e);
            const wide = ['auto', 'scroll'].includes(st.overflowX) && e.scrollWidth > e.clientWidth + 2;
            const tall = ['auto', 'scroll'].includes(st.overflowY) && e.scrollHeight > e.clientHeight + 2;
            if (wide || tall) {
                const head = (el.innerText || '').split('\\n')[0].slice(0, 40);
                out.push(`${el.getAttribute('data-testid')} #${i} (${head}): ` +
                         (wide ? `columns cut (${e.scrollWidth} px in ${e.clientWidth})` : '') +
                         (wide && tall ? ', ' : '') +
                         (tall ? `rows cut (${e.scrollHeight} px in ${e.clientHeight})` : ''));
                break;
            }
        }
    });
    // plain tables in markdown (abl.dashboard.common.text_table): wider than the block they sit in
    document.querySelectorAll('[data-testid="stMarkdownContainer"] table').forEach((t, i) => {
        const room = t.parentElement.clientWidth;
        if (t.scrollWidth > room + 2) out.push(`markdown table #${i}: columns cut (${t.scrollWidth} px in ${room})`);
    });
    return out;
}"""

# what the tests and the command check on each page
MEASURE = """() => {
    const main = document.querySelector('[data-testid="stMain"]') || document.scrollingElement;
    const block = document.querySelector('[data-testid="stMainBlockContainer"]');
    return {
        exceptions: document.querySelectorAll('[data-testid="stException"]').length,
        errors: [...document.querySelectorAll('[data-testid="stAlertContentError"]')].map(e => e.innerText),
        scroll_width: Math.max(document.documentElement.scrollWidth, main.scrollWidth),
        viewport_width: window.innerWidth,
        content_height: Math.max(main.scrollHeight, block ? block.scrollHeight : 0),
        charts: document.querySelectorAll('[data-testid="stVegaLiteChart"]').length,
        main_left: block ? Math.round(block.getBoundingClientRect().left) : 0,
        cut_tables: CUT_TABLES(),
    };
}""".replace("CUT_TABLES()", "(" + CUT_TABLES + ")()")


class SnapshotError(Exception):
    """A one-line reason the snapshot cannot be taken (the command exits 2 with it)."""


@dataclass
class Shot:
    page: str
    width: int
    path: Path
    exceptions: int
    errors: list[str]
    scroll_width: int
    viewport_width: int
    content_height: int
    charts: int
    main_left: int  # where the page's own content starts (right of the sidebar)
    cut_tables: list[str]  # tables whose columns or rows are hidden behind their own scroll bar (CUT_TABLES)


def chromium() -> str:
    """The system's Chromium (Debian's package), or a SnapshotError saying how to get it."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise SnapshotError("no chromium on PATH: install the system's package (apt-get install chromium)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(db: Path, runs_dir: Path, port: int, log: Any) -> subprocess.Popen:
    """Start ``streamlit run app.py`` on 127.0.0.1:port (its own process group)."""
    app = Path(__file__).resolve().parent / "app.py"
    from ..pyexec import child_env, python

    env = child_env(dict(os.environ, ABL_DB=str(db), ABL_RUNS_DIR=str(runs_dir)))
    argv = [*python("-m", "streamlit"), "run", str(app), "--server.address", "127.0.0.1",
            "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--global.developmentMode", "false", "--client.toolbarMode", "minimal",
            "--server.fileWatcherType", "none"]
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SnapshotError("the dashboard server did not start")
        time.sleep(0.3)


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def capture(url: str, out_dir: Path, widths: Sequence[int] = (1400,), scripts: Sequence[str] | None = None,
            timeout_ms: int = 90_000) -> Iterator[Shot]:
    """Screenshot each page (``scripts``: default every page) at each width, in one browser."""
    from playwright.sync_api import sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_FLAGS, headless=True)
        try:
            for width in widths:
                context = browser.new_context(viewport={"width": width, "height": HEIGHT}, device_scale_factor=1)
                page = context.new_page()
                for script in scripts or [s for s, _, _ in pages.PAGES]:
                    yield _shoot(page, url, script, width, out_dir, timeout_ms)
                context.close()
        finally:
            browser.close()


# what changes while the page is still drawing
SIGNATURE = """() => {
    const main = document.querySelector('[data-testid="stMainBlockContainer"]');
    if (!main) return '';
    return [main.querySelectorAll('[data-testid="stElementContainer"]').length,
            main.querySelectorAll('[data-testid="stVegaLiteChart"] svg.marks, [data-testid="stVegaLiteChart"] canvas')
                .length, main.scrollHeight, main.innerText.length].join('/');
}"""


def _settle(page: Any, timeout_ms: int, quiet_ms: int = 1000) -> None:
    """Wait until the page is READY and has not changed for ``quiet_ms`` (Streamlit sends a page in
    pieces, and shows its spinners only after a moment)."""
    deadline = time.monotonic() + timeout_ms / 1000
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        page.wait_for_function(READY, timeout=max(1, int((deadline - time.monotonic()) * 1000)), polling=200)
        sig = page.evaluate(SIGNATURE)
        if sig != last:
            last, since = sig, time.monotonic()
        elif (time.monotonic() - since) * 1000 >= quiet_ms:
            return
        page.wait_for_timeout(250)
    raise SnapshotError("a page did not finish drawing in time")


def _shoot(page: Any, url: str, script: str, width: int, out_dir: Path, timeout_ms: int) -> Shot:
    name = pages.name(script)
    page.set_viewport_size({"width": width, "height": HEIGHT})
    page.goto(f"{url}/{pages.url_path(script)}", wait_until="domcontentloaded")
    page.locator('[data-testid="stMainBlockContainer"]').wait_for(timeout=timeout_ms)
    _settle(page, timeout_ms)
    m = page.evaluate(MEASURE)
    height = min(MAX_HEIGHT, max(HEIGHT, int(m["content_height"]) + 40))
    if height != HEIGHT:  # the app scrolls in its own container: show all of it in the window
        page.set_viewport_size({"width": width, "height": height})
        _settle(page, timeout_ms)
        m = page.evaluate(MEASURE)
    path = out_dir / f"{name}-{width}.png"
    page.screenshot(path=str(path), full_page=True)
    return Shot(page=name, width=width, path=path, exceptions=int(m["exceptions"]), errors=list(m["errors"]),
                scroll_width=int(m["scroll_width"]), viewport_width=int(m["viewport_width"]),
                content_height=int(m["content_height"]), charts=int(m["charts"]),
                main_left=int(m["main_left"]), cut_tables=list(m["cut_tables"]))


def snapshot(db: Path, runs_dir: Path, out_dir: Path, widths: Sequence[int], log_path: Path) -> list[Shot]:
    """Serve the store, screenshot every page at every width, stop the server."""
    port = free_port()
    with open(log_path, "w") as log:
        proc = serve(db, runs_dir, port, log)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, proc)
            return list(capture(url, out_dir, widths))
        finally:
            stop(proc)
