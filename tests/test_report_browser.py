"""The HTML report in a real browser (Chromium) at a desktop and a laptop width: it renders.

The report of the norms-like store (tests/test_report_sections.py) is opened
at 1400 and 1024 px; the page must not be blank (pixel variance of the
screenshot), every figure must have decoded (naturalWidth > 0) and fit the
viewport, and the page must not scroll sideways (wide tables scroll in their
own box). The screenshots are saved under the test's tmp path and, when
``ABL_SCREENSHOT_DIR`` is set, copied there.
"""

import os
import shutil
from pathlib import Path

import pytest
from test_report_sections import norms_store  # noqa: F401 - the fixture

# the launch flags of the dashboard's browser test (tests/test_dashboard.py)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WIDTHS = (1400, 1024)

FIGURES = """() => Array.from(document.images).map(i => ({
    complete: i.complete, natural: i.naturalWidth, width: i.getBoundingClientRect().width}))"""
PAGE = """() => ({inner: window.innerWidth, scroll: document.documentElement.scrollWidth,
               headings: document.querySelectorAll('h2').length})"""


def _chromium() -> str | None:
    return shutil.which("chromium")  # Debian's package (apt-get install chromium)


@pytest.mark.skipif(_chromium() is None,
                    reason="Debian's chromium is not installed (apt-get install chromium); CI installs it")
def test_html_report_renders_at_desktop_and_laptop_width(norms_store, tmp_path):  # noqa: F811
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the snapshot and dev extras")
    import numpy as np
    from PIL import Image

    from abl.contracts.plugin_manager import get_registry
    from abl.present.report.runs import load_runs
    from abl.present.report.sections import build_report, write_report

    grid, db, g = norms_store
    rep = build_report(load_runs(db, experiment="normslike"), source="normslike", db_path=str(db),
                       registry=get_registry())
    html = write_report(rep, tmp_path / "report", "html")
    shots = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=_chromium(), args=CHROMIUM_FLAGS, headless=True,
            viewport={"width": WIDTHS[0], "height": 1000})
        try:
            page = browser.new_page()
            for width in WIDTHS:
                page.set_viewport_size({"width": width, "height": 1000})
                page.goto(html.as_uri(), wait_until="load")
                page.wait_for_function("() => Array.from(document.images).every(i => i.complete)",
                                       timeout=60_000)
                figures = page.evaluate(FIGURES)
                assert len(figures) == 3, figures  # loss curves, quality vs cost, predicted vs measured
                for f in figures:
                    assert f["natural"] > 0, f  # decoded
                    assert 0 < f["width"] <= width, f  # shown, and no wider than the window
                info = page.evaluate(PAGE)
                assert info["inner"] == width and info["scroll"] <= width, info  # no sideways scrolling
                assert info["headings"] >= 5
                shots.append(tmp_path / f"report_{width}px.png")
                page.screenshot(path=str(shots[-1]), full_page=True)
        finally:
            browser.close()
    for shot, width in zip(shots, WIDTHS):
        img = np.asarray(Image.open(shot).convert("L"), dtype=float)
        assert img.shape[1] == width and img.shape[0] > 2000  # the whole page, at the window's width
        assert img.std() > 20  # not blank: text, tables and figures on white
        print(f"screenshot: {shot}")
    out = os.environ.get("ABL_SCREENSHOT_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        for shot in shots:
            shutil.copy(shot, Path(out) / shot.name)
