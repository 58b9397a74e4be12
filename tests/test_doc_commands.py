"""Every command that README.md and docs/*.md show in a ```bash block runs, as shown.

Each page's blocks run in order in one scratch folder (so a block can use what
an earlier one made), with ``.venv`` there pointing at the environment that
runs the tests, after the files the page shows (``<!-- file: PATH -->``) are
written into it. A block is marked by an HTML comment on the line above it:

- ``<!-- docs-test: skip: WHY -->``: not run; WHY says what runs it instead or
  why it cannot run here (it builds a virtual environment, installs into it,
  or serves until stopped);
- ``<!-- docs-test: slow: WHY -->``: trains something; the page's test is marked slow;
- ``<!-- docs-test: needs the norms store -->``: it reads the store the README's
  first command fills; a shorter run of the same grid stands in for it
  (``NORMS_STORE``), the same experiment in the same place.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:<!-- docs-test: (?P<mark>[^\n]*?) -->\n)?```bash\n(?P<body>.*?)```", re.DOTALL)
FILE = re.compile(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", re.DOTALL)
MARKS = ("skip: ", "slow: ", "needs the norms store")

# The README's first command trains ablations/norms.toml into results/abl.duckdb (4 min); this is the
# same grid, experiment and store, at 8 cells of a smaller model
NORMS_STORE = (".venv/bin/abl run norms --only 'model.norm=rmsnorm,layernorm' --only 'model.block=pre,post' "
               "--set model.d_model=32 --set model.n_layers=2 --set train.steps=20 --set train.eval_every=10 "
               "--set train.eval_batches=2")


def blocks(page: Path) -> list[tuple[str, str]]:
    return [(m["mark"] or "", m["body"]) for m in BLOCK.finditer(page.read_text())]


def _param(page: Path):
    marks = [mark for mark, _ in blocks(page)]
    slow = any(m.startswith(("slow", "needs")) for m in marks)
    return pytest.param(page, id=str(page.relative_to(ROOT)), marks=[pytest.mark.slow] if slow else [])


def test_every_mark_is_known_and_every_skip_says_why():
    seen = 0
    for page in PAGES:
        for mark, body in blocks(page):
            seen += 1
            assert not mark or mark.startswith(MARKS), f"{page.name}: unknown mark {mark!r}"
            if mark.startswith(("skip", "slow")):
                assert len(mark.split(":", 1)[1].strip()) > 15, f"{page.name}: say why: {mark!r}"
    assert seen >= 6, "the README and docs/ should show their commands in ```bash blocks"


def _run(script: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ABL_PLUGINS", "ABL_PLUGINS_DIR")}
    env["COLUMNS"] = "120"
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900, check=False)


@pytest.mark.parametrize("page", [_param(p) for p in PAGES if any(not m.startswith("skip") for m, _ in blocks(p))])
def test_the_commands_a_page_shows_run(page, tmp_path):
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)  # the environment running the tests
    for name, body in FILE.findall(page.read_text()):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    ran = 0
    for mark, body in blocks(page):
        if mark.startswith("skip"):
            continue
        if mark.startswith("needs the norms store") and not (tmp_path / "results" / "abl.duckdb").exists():
            made = _run(NORMS_STORE, tmp_path)
            assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
        r = _run(body, tmp_path)
        assert r.returncode == 0, f"{page.name}: this block failed:\n{body}\n" + r.stdout[-3000:] + r.stderr[-3000:]
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
        ran += 1
    assert ran
