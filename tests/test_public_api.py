"""One public surface: plugin authors (built-in or third-party) import from ``abl``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the kernel set is a public library of ops; a plugin may use another plugin's module
ALLOWED_SUBMODULES = ("abl.kernels", "abl.plugins")


def test_every_public_name_resolves():
    import abl

    for name in abl.__all__:
        assert getattr(abl, name) is not None, name
    with pytest.raises(AttributeError):
        abl.not_a_public_name  # noqa: B018


def test_import_abl_does_not_import_torch():
    code = "import sys, abl, abl.cli; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


@pytest.mark.parametrize("path", sorted((ROOT / "plugins").glob("*.py")), ids=lambda p: p.name)
def test_builtin_plugins_use_only_the_public_surface(path):
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("abl.") \
                and not node.module.startswith(ALLOWED_SUBMODULES):
            bad.append(f"line {node.lineno}: from {node.module} import ...")
        if isinstance(node, ast.Import):
            bad += [f"line {node.lineno}: import {a.name}" for a in node.names
                    if a.name.startswith("abl.") and not a.name.startswith(ALLOWED_SUBMODULES)]
    assert not bad, f"{path.name} reaches past `from abl import ...`: {bad}"


def test_the_readme_plugin_imports_only_from_abl():
    from test_readme_plugin import readme_files  # the files the README shows, as tested there

    source = dict(readme_files())["abl-dyt/abl_dyt.py"]
    modules = {n.module for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)}
    assert {m for m in modules if m and m.startswith("abl")} == {"abl"}
