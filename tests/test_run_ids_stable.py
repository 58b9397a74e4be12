"""A run id is the key that lets ``abl run`` skip a completed cell: it must not move.

tests/data/shipped_run_ids.json holds the run ids of every cell of every shipped grid as they
were before harness/ became layered subpackages. A refactor that changes how a resolved config is
stored or hashed would silently make every existing store re-run from scratch; this fails instead.
A grid whose cells change on purpose (a new axis value, a new default) updates its entry here in the
same commit, with the reason in the message.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from abl.contracts.plugin_manager import get_registry
from abl.grid.gridfile import load_grid

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = json.loads((ROOT / "tests" / "data" / "shipped_run_ids.json").read_text())


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_shipped_grid_run_ids_are_stable(name):
    grid = load_grid(ROOT / "ablations" / name, get_registry())
    assert [c.run_id for c in grid.cells] == GOLDEN[name]


def test_every_shipped_grid_is_pinned():
    assert sorted(p.name for p in (ROOT / "ablations").glob("*.toml")) == sorted(GOLDEN)
