"""Type-check abl as pip installs it: harness/ as ``abl``, plugins/ as ``abl.plugins``, dashboard/ as
``abl.dashboard``.

mypy cannot follow setuptools' package-dir mapping through the editable install (an import hook),
so this installs the package from this tree into a folder (``pip install --target``: setuptools
lays out the package) and runs mypy there with pyproject.toml's ``[tool.mypy]``, which names the
package. setuptools builds in a fresh folder every time (``DIST_EXTRA_CONFIG``), because a
``build/lib`` left by an earlier build keeps modules that the tree has since deleted. mypy's
messages name the source files (``harness/store/provenance.py``), not the installed copies.

    python .ci/typecheck.py [--target DIR] [--replace MODULE=FILE ...]

``--replace abl.store.provenance=planted.py`` checks another file in a module's place (the
tests plant a bad call that way). Exit status: mypy's (2 when the install fails).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def install(site: Path) -> subprocess.CompletedProcess:
    """The package as pip installs it from this tree, into ``site``."""
    if site.exists():
        shutil.rmtree(site)
    with tempfile.TemporaryDirectory(prefix="abl-typecheck-build-") as build:
        cfg = Path(build) / "setup.cfg"
        cfg.write_text(f"[build]\nbuild_base = {Path(build) / 'build'}\n[egg_info]\negg_base = {build}\n")
        return subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-build-isolation",
             "--no-compile", "--target", str(site), str(ROOT)],
            env={**os.environ, "DIST_EXTRA_CONFIG": str(cfg)}, capture_output=True, text=True)


def module_file(site: Path, module: str) -> Path:
    base = site.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    raise SystemExit(f"--replace {module}: no such module in the installed package")


def source_path(line: str) -> str:
    """An installed path at the start of a mypy message, as the path of its source file."""
    m = re.match(r"(abl(?:/[A-Za-z0-9_]+)*)/(?=[A-Za-z0-9_]+\.py)", line)
    if not m:
        return line
    parts = m.group(1).split("/")
    for n in range(len(parts), 0, -1):  # the longest mapped package holding the file
        folder = PACKAGE_DIR.get(".".join(parts[:n]))
        if folder is not None:
            return "/".join([folder, *parts[n:]]) + line[m.end(1):]
    return line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--target", type=Path, default=ROOT / "build" / "typecheck")
    ap.add_argument("--replace", action="append", default=[], metavar="MODULE=FILE")
    args = ap.parse_args(argv)
    site = args.target.resolve()
    done = install(site)
    if done.returncode:
        print(f"pip could not install the package from {ROOT}:\n{done.stdout}{done.stderr}", file=sys.stderr)
        return 2
    for item in args.replace:
        module, _, file = item.partition("=")
        shutil.copyfile(file, module_file(site, module))
    r = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                        "--cache-dir", str(ROOT / "build" / "mypy-cache")],
                       cwd=site, capture_output=True, text=True)
    sys.stdout.write("".join(source_path(line) + "\n" for line in r.stdout.splitlines()))
    sys.stderr.write(r.stderr)
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
