"""Every dashboard page, screenshotted in headless Chromium at 1400 px and at a laptop's 1024 px.

On a norms-shaped store (13 cells x 2 seeds, tests/dashboard/norms_store.py),
served once for the module, through the same code as ``abl dashboard
--snapshot``. Each page must render: no exception box, not blank (pixel
variance in the main area), as tall as its content, and no horizontal
overflow (the document is no wider than the window), and no table that hides
columns or rows behind a scroll bar of its own. The PNGs are kept under
the test's tmp folder, and copied to $ABL_SCREENSHOT_DIR when it is set.
"""

import os
import shutil
import sys
from pathlib import Path

import pytest

from conftest import ROOT

pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install 'abl[dashboard]'")
pytest.importorskip("playwright.sync_api", reason="playwright is in the snapshot and dev extras")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent / "dashboard"))
import norms_store  # noqa: E402

from abl.dashboard import pages, snapshot  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("chromium") is None,
                                 reason="Debian's chromium is not installed (apt-get install chromium); CI installs it")]

WIDTHS = (1400, 1024)
CHART_PAGES = {"curves": 2, "compare": 1, "tradeoffs": 1}  # page: charts it must draw on this store
# (trade-offs: tokens/s; its memory and parameters are within 5% across cells, a sentence each, not a plot)


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    """Serve the store once; screenshot every page at both widths in one browser."""
    tmp = tmp_path_factory.mktemp("screens")
    db = norms_store.build(tmp / "store")
    port = snapshot.free_port()
    with open(tmp / "server.log", "w") as log:
        proc = snapshot.serve(db, db.parent / "runs", port, log)
        try:
            url = f"http://127.0.0.1:{port}"
            snapshot.wait_healthy(url, proc)
            taken = list(snapshot.capture(url, tmp / "png", WIDTHS))
        finally:
            snapshot.stop(proc)
    target = os.environ.get("ABL_SCREENSHOT_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        for s in taken:
            shutil.copy(s.path, Path(target) / s.path.name)
    return {(s.page, s.width): s for s in taken}


def test_every_page_at_every_width_was_captured(shots):
    expected = {(pages.name(script), w) for script, _, _ in pages.PAGES for w in WIDTHS}
    assert set(shots) == expected
    assert len(expected) == 2 * len(pages.PAGES) and ("costs", 1024) in expected


@pytest.mark.parametrize("script", [s for s, _, _ in pages.PAGES], ids=lambda s: pages.name(s))
def test_page_renders_without_error_blank_or_overflow(shots, script):
    from PIL import Image, ImageStat

    name = pages.name(script)
    for width in WIDTHS:
        s = shots[(name, width)]
        where = f"{name} at {width} px ({s.path})"
        assert s.exceptions == 0, where
        assert s.errors == [], (where, s.errors)
        assert s.scroll_width <= s.viewport_width == width, (where, s.scroll_width)  # no horizontal overflow
        # every table shows all its columns and the rows of its page (no inner scroll bar hiding some)
        assert s.cut_tables == [], (where, s.cut_tables)
        assert s.content_height >= 400, where
        if name in CHART_PAGES:
            assert s.charts >= CHART_PAGES[name], (where, s.charts)
            assert s.content_height > snapshot.HEIGHT, where  # a page of charts is taller than one window
        with Image.open(s.path) as img:
            assert img.width == width
            assert img.height >= min(s.content_height, snapshot.MAX_HEIGHT) - 60, where  # the whole page
            assert 150 < s.main_left < width // 2, where
            main = img.convert("L").crop((s.main_left, 0, img.width, img.height))  # the page, not the sidebar
            spread = ImageStat.Stat(main).stddev[0]
            assert spread > 8, (where, spread)  # not a blank page
            colours = len(main.convert("P", palette=Image.Palette.ADAPTIVE, colors=64).getcolors(64) or [])
            assert colours > 4, where
