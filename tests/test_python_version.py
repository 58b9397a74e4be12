"""One promised Python version: pyproject.toml's requires-python, mypy's python_version, the README and
the code agree (the code: parsed at that version's grammar, and no branch or fallback for an older one)."""

import ast
import re
import sys
import tomllib

from conftest import ROOT
from packaging.specifiers import SpecifierSet
from packaging.version import Version

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SOURCES = [ROOT / d for d in PYPROJECT["tool"]["setuptools"]["package-dir"].values()]


def promised() -> tuple[int, int]:
    spec = SpecifierSet(PYPROJECT["project"]["requires-python"])
    (lower,) = [s.version for s in spec if s.operator == ">="]
    v = Version(lower)
    return v.major, v.minor


def code_files():
    for folder in SOURCES:
        yield from sorted(folder.rglob("*.py"))


def test_pyproject_mypy_and_readme_promise_one_version():
    major, minor = promised()
    assert PYPROJECT["tool"]["mypy"]["python_version"] == f"{major}.{minor}"
    readme = (ROOT / "README.md").read_text()
    claims = set(re.findall(r"Python (\d+\.\d+)\+", readme))
    assert claims == {f"{major}.{minor}"}, claims
    assert sys.version_info[:2] >= (major, minor), "the tests run on a Python the package does not promise"


def test_the_code_parses_at_the_promised_grammar():
    # a newer interpreter than the promise accepts newer syntax (PEP 695 generics, 3.12 f-strings);
    # the promised grammar must accept every module
    for path in code_files():
        ast.parse(path.read_text(), str(path), feature_version=promised())


def _version_tuple(node: ast.AST) -> tuple[int, ...] | None:
    if isinstance(node, ast.Tuple) and all(isinstance(e, ast.Constant) and isinstance(e.value, int)
                                           for e in node.elts):
        return tuple(e.value for e in node.elts)  # type: ignore[attr-defined]
    return None


def test_no_branch_or_fallback_for_a_python_older_than_the_promise():
    floor = promised()
    stale = []
    for path in code_files():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and "version_info" in ast.unparse(node.left):
                for cmp in node.comparators:
                    v = _version_tuple(cmp)
                    if v is not None and v[:2] <= floor:  # always true (or false) on every promised version
                        stale.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.Import) and any(a.name == "tomli" for a in node.names):
                stale.append(f"{path.relative_to(ROOT)}:{node.lineno}: import tomli (tomllib is in the stdlib)")
    assert not stale, "\n".join(stale)
