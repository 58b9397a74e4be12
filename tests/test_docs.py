import inspect

from conftest import ROOT

from abl.contracts import hookspecs


def test_every_hook_is_documented_in_the_readme():
    # the README is being split into docs/ pages: a hook documented on one of them counts too
    readme = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    hooks = [n for n, f in inspect.getmembers(hookspecs, inspect.isfunction)
             if hasattr(f, "abl_spec")]
    assert hooks, "no hookspecs found"
    for name in hooks:
        assert inspect.getdoc(getattr(hookspecs, name)), f"hook {name} has no docstring"
        assert f"`{name}(" in readme, f"hook {name} is not documented in README.md or docs/"


def test_every_axis_is_documented_in_the_readme():
    from abl.contracts.registry import AXES

    readme = (ROOT / "README.md").read_text()
    for axis in AXES:
        assert f"| {axis} |" in readme, axis
