"""The shape of the house: abl's modules stand in layers, import only downward, and form no cycle.

Every ``import`` and ``from ... import`` in harness/ (``abl``), plugins/
(``abl.plugins``) and dashboard/ (``abl.dashboard``) counts, including the ones
inside functions (a lazy import hides a cycle, it does not remove it). Only
imports under ``if TYPE_CHECKING:`` are left out: they never run.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the one package-dir mapping: pyproject.toml's (harness/ is installed as abl, plugins/ as abl.plugins ...)
_PACKAGE_DIR = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
SOURCES = {package: ROOT / folder for package, folder in _PACKAGE_DIR.items() if package != "abl.ablations"}

# The layers of harness/ (abl), lowest first. A module may import its own layer and the layers below;
# an import from a lower layer into a higher one is a defect. ``abl`` itself (harness/__init__.py) is the
# public face: it hands names on lazily and stands outside the order. The built-in plugins (abl.plugins)
# are clients of the face: they import ``abl``, ``abl.kernels`` and each other, exactly as a third-party
# plugin could.
LAYERS = ["abl.pyexec", "abl.files", "abl.kernels", "abl.contracts", "abl.analysis", "abl.data", "abl.model", "abl.grid", "abl.store",
          "abl.train", "abl.present", "abl.run", "abl.bench", "abl.dashboard", "abl.cli"]
PLUGIN_MAY_IMPORT = ("abl", "abl.kernels", "abl.plugins")


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node, skipping ``if TYPE_CHECKING:`` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        here = name if is_package else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # "from pkg import sub" names a submodule when one exists, else pkg itself
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for t in targets:
                while t and t not in modules and "." in t:  # "abl.kernels.rmsnorm.x" -> its module
                    t = t.rpartition(".")[0]
                if t in modules and t != name:
                    graph[name].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_lazy_and_relative_imports():
    graph = import_graph()
    assert "abl.contracts.plugin_manager" in graph["abl.cli"]  # a function-level relative import
    assert "abl.kernels" in graph["abl.model.decoder"] or "abl.kernels.rmsnorm" in graph["abl.plugins.norms"]


def test_the_cycle_finder_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_among_abl_modules():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def layer_of(module: str) -> int | None:
    for i, layer in enumerate(LAYERS):
        if module == layer or module.startswith(layer + "."):
            return i
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a lower layer into a higher one, and every plugin import past the public face."""
    found = []
    for module, targets in sorted(graph.items()):
        if module == "abl.plugins" or module.startswith("abl.plugins."):
            for t in sorted(targets):
                if not any(t == p or t.startswith(p + ".") for p in PLUGIN_MAY_IMPORT[1:]) and t != "abl":
                    found.append(f"{module} -> {t} (a built-in plugin imports only the public face abl and abl.kernels)")
            continue
        here = layer_of(module)
        if here is None:
            continue
        for t in sorted(targets):
            there = layer_of(t)
            if there is not None and there > here:
                found.append(f"{module} ({LAYERS[here]}) -> {t} ({LAYERS[there]})")
    return found


def test_every_harness_module_sits_in_a_layer():
    loose = [m for m in import_graph() if m.startswith("abl.") and layer_of(m) is None
             and not m.startswith("abl.plugins")]
    assert not loose, f"modules outside every layer of LAYERS: {loose}"


def test_the_layer_check_finds_a_planted_upward_import():
    graph = {"abl.analysis.stats": {"abl.store.database"}, "abl.store.database": {"abl.analysis.stats"},
             "abl.plugins.norms": {"abl.train.loop"}}
    found = upward_imports(graph)
    assert len(found) == 2
    assert found[0].startswith("abl.analysis.stats (abl.analysis) -> abl.store.database")
    assert "abl.plugins.norms -> abl.train.loop" in found[1]


def test_no_import_runs_up_the_layers():
    found = upward_imports(import_graph())
    assert not found, "imports that run up the layers:\n" + "\n".join(found)


def test_each_subpackage_says_what_it_holds_and_what_it_may_import():
    for folder in sorted(p for p in (ROOT / "harness").iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        assert len(doc.split()) >= 20, f"harness/{folder.name}/__init__.py: no paragraph on what lives there"
        if folder.name != "kernels":
            assert "import" in doc, f"harness/{folder.name}/__init__.py does not say what it may import"


def test_harness_is_rooms_not_one_flat_folder():
    loose = sorted(p.name for p in (ROOT / "harness").glob("*.py"))
    assert len(loose) <= 8, f"{len(loose)} modules directly in harness/: {loose}"


# Modules above this many lines read as several rooms in one; kernels/ keeps each op's launchers,
# autograd.Function and reference together and is exempt.
MAX_LINES = 520


def test_no_module_outgrows_its_room():
    big = []
    for package, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            if "kernels" in path.relative_to(folder).parts:
                continue
            n = len(path.read_text().splitlines())
            if n > MAX_LINES:
                big.append(f"{path.relative_to(ROOT)}: {n} lines")
    assert not big, "modules above %d lines:\n" % MAX_LINES + "\n".join(big)


def test_every_source_path_the_docs_and_code_name_exists():
    """A moved module leaves no stale ``harness/x.py`` behind in the README, a docstring or a message."""
    import re

    named = re.compile(r"\b((?:harness|plugins|dashboard)/[\w/]+(?:\.py|/))")
    stale = []
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *[p for f in SOURCES.values() for p in sorted(f.rglob("*.py"))]]
    for path in texts:
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for ref in named.findall(line):
                if not (ROOT / ref).exists():
                    stale.append(f"{path.relative_to(ROOT)}:{lineno}: {ref}")
    assert not stale, "paths that do not exist:\n" + "\n".join(stale)


# ---------------------------------------------------------------- one path per name


def _base_of(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` reads from."""
    base = node.module or ""
    if node.level:
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]
        anchor = here.split(".")
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    return base


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(modules: dict[str, Path]) -> list[tuple[str, str, str]]:
    """(importer, source module, name) of every private name one abl module imports from another
    (torch's or triton's private modules are theirs to name)."""
    found = []
    for module, path in modules.items():
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = _base_of(module, path, node)
                if base.split(".")[0] == "abl" and base != module:
                    found += [(module, base, a.name) for a in node.names if _is_private(a.name)]
            else:
                found += [(module, a.name, a.name) for a in node.names
                          if a.name.split(".")[0] == "abl" and any(map(_is_private, a.name.split(".")))]
    return sorted(found)


def test_the_private_import_scan_finds_planted_ones(tmp_path):
    (tmp_path / "pkg").mkdir()
    a, b = tmp_path / "pkg" / "a.py", tmp_path / "pkg" / "b.py"
    a.write_text("def _helper():\n    pass\n\n\ndef f():\n    from .b import _g, public\n")
    b.write_text("from . import a\nfrom .a import _helper as h\nimport abl._secret\nimport torch._dynamo\n")
    found = private_imports({"abl.pkg.a": a, "abl.pkg.b": b})
    assert found == [("abl.pkg.a", "abl.pkg.b", "_g"), ("abl.pkg.b", "abl._secret", "abl._secret"),
                     ("abl.pkg.b", "abl.pkg.a", "_helper")]


def test_no_module_imports_another_modules_private_names():
    """A name another module needs is public where it is defined; ``from .x import _y`` hides a seam."""
    found = private_imports(_modules())
    assert not found, "private names imported across modules (make them public where defined):\n" + \
        "\n".join(f"{m} imports {n} from {s}" for m, s, n in found)


def _own_names(path: Path) -> set[str]:
    """The names a module binds itself: functions, classes, assigned names (not the ones it imports)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With)):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [i.optional_vars for i in node.items if i.optional_vars] if isinstance(node, ast.With) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Global):
            names.update(node.names)
    return names


def handed_on(modules: dict[str, Path]) -> list[tuple[str, str, str]]:
    """(importer, module imported from, name) where that module only imports the name itself: a second path."""
    own = {m: _own_names(p) for m, p in modules.items()}
    found = []
    for module, path in modules.items():
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = _base_of(module, path, node)
            if base == "abl" or base not in modules:  # abl itself is the plugin authors' one surface
                continue
            found += [(module, base, a.name) for a in node.names
                      if a.name != "*" and f"{base}.{a.name}" not in modules and a.name not in own[base]]
    return sorted(found)


def test_the_handed_on_scan_finds_a_planted_shim(tmp_path):
    (tmp_path / "pkg").mkdir()
    a, b, c = (tmp_path / "pkg" / f"{n}.py" for n in "abc")
    a.write_text("X = 1\n\n\ndef f():\n    pass\n")
    b.write_text("from .a import X, f  # noqa: F401 - re-exported for callers\n")
    c.write_text("from .b import X\nfrom .a import f\n")
    assert handed_on({"abl.pkg.a": a, "abl.pkg.b": b, "abl.pkg.c": c}) == [("abl.pkg.c", "abl.pkg.b", "X")]


def test_every_name_is_imported_from_where_it_is_defined():
    """One import path per name: ``from abl.x import y`` finds y defined in abl.x, not handed on from abl.z."""
    found = handed_on(_modules())
    assert not found, "names imported through a module that only hands them on (import them where defined):\n" + \
        "\n".join(f"{m} imports {n} from {s}" for m, s, n in found)
