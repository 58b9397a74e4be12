"""Type-check abl as it is installed: harness/ as ``abl``, plugins/ as ``abl.plugins``.

mypy cannot follow setuptools' package-dir mapping (the editable install is an
import hook), so this lays out a tree of symlinks, ``abl/`` -> harness/ files,
``abl/plugins/`` -> plugins/ files, and checks that tree as the package ``abl``.
Every ``from abl import ...`` and relative import then resolves to the real
code, so a wrong-arity or wrong-type call in a GPU-only branch fails here.

    python .ci/typecheck.py [--farm DIR] [--replace MODULE=FILE ...]

``--replace abl.flops=/tmp/flops.py`` checks another file in a module's place
(the tests plant a bad call that way). Exit status: mypy's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = {"abl": ROOT / "harness", "abl/plugins": ROOT / "plugins"}


def build_farm(farm: Path, replace: dict[str, Path]) -> Path:
    if farm.exists():
        shutil.rmtree(farm)
    for target, source in LAYOUT.items():
        for path in sorted(source.rglob("*.py")):
            rel = path.relative_to(source)
            dest = farm / target / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            module = ".".join((target.replace("/", "."), *rel.with_suffix("").parts)).removesuffix(".__init__")
            os.symlink(replace.get(module, path).resolve(), dest)
    (farm / "abl" / "py.typed").touch()
    return farm


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--farm", type=Path, default=ROOT / "build" / "typecheck")
    ap.add_argument("--replace", action="append", default=[], metavar="MODULE=FILE")
    args = ap.parse_args(argv)
    replace = {m: Path(f) for m, f in (r.split("=", 1) for r in args.replace)}
    farm = build_farm(args.farm, replace)
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
           "--cache-dir", str(ROOT / "build" / "mypy-cache"), "-p", "abl"]
    return subprocess.call(cmd, cwd=farm)


if __name__ == "__main__":
    sys.exit(main())
