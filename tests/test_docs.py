"""The documentation: README.md and docs/*.md describe what the code has, and the README stays small."""

import inspect
import re
import tomllib

from conftest import ROOT

from abl.contracts import hookspecs

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def docs_text() -> str:
    return "\n".join(p.read_text() for p in DOCS)


def test_every_hook_is_documented():
    text = (ROOT / "docs" / "plugins.md").read_text()
    hooks = [n for n, f in inspect.getmembers(hookspecs, inspect.isfunction)
             if hasattr(f, "abl_spec")]
    assert hooks, "no hookspecs found"
    for name in hooks:
        assert inspect.getdoc(getattr(hookspecs, name)), f"hook {name} has no docstring"
        assert f"`{name}(" in text, f"hook {name} is not documented in docs/plugins.md"


def test_every_axis_is_documented():
    from abl.contracts.registry import AXES

    text = (ROOT / "docs" / "components.md").read_text()
    for axis in AXES:
        assert f"| {axis} |" in text, axis


def test_the_readme_is_short_and_starts_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 300, len(lines)
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[:2] == ["## Two commands", "## Quick tour"], headings
    tour = lines.index("## Quick tour")
    end = next(i for i in range(tour + 1, len(lines)) if lines[i].startswith("## "))
    assert end - tour <= 80, end - tour
    # the flagship run's measured wall time and its verdicts stay in the first section
    first = "\n".join(lines[:tour])
    assert re.search(r"took \d+ min\s+\d+ s of wall time", first)
    assert first.count("Verdict, model.") == 2


def test_every_page_the_readme_links_exists_and_every_page_is_linked():
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", readme))
    assert linked and all((ROOT / p).exists() for p in linked), linked
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"pages the README does not link: {sorted(pages - linked)}"


def _extra_requirements(extras: list[str]) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in reqs}


def test_the_first_command_installs_what_run_and_dashboard_need_and_nothing_more():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", readme, re.DOTALL)[1]
    first = next(line for line in block.splitlines() if line.strip() and not line.startswith("#"))
    extras = re.search(r"-e '\.\[([\w,]+)\]'", first)[1].split(",")
    assert extras == ["dashboard"], extras
    got = _extra_requirements(extras)
    assert {"streamlit", "altair", "duckdb", "torch"} <= got
    assert not got & {"ray", "submitit", "playwright", "mypy", "pytest", "hypothesis", "pytest-benchmark",
                      "datasets"}, got & {"ray", "submitit", "playwright", "mypy", "pytest"}
    # CI's install still brings the test stack, the browser driver and the cluster packages
    ci = (ROOT / ".ci" / "run").read_text()
    ci_extras = re.search(r"-e '\.\[([\w,]+)\]'", ci)[1].split(",")
    assert {"pytest", "mypy", "playwright", "ray", "submitit", "datasets"} <= _extra_requirements(ci_extras)


def test_messages_to_a_wheel_user_name_the_extra_not_an_editable_install():
    sources = [p for d in ("harness", "plugins", "dashboard") for p in (ROOT / d).rglob("*.py")]
    editable = [f"{p.relative_to(ROOT)}:{i}" for p in sources
                for i, line in enumerate(p.read_text().splitlines(), 1) if "pip install -e" in line]
    assert not editable, editable
    named = {m for p in sources for m in re.findall(r"pip install '(abl\[\w+\])'", p.read_text())}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert named and all(m[4:-1] in project["optional-dependencies"] for m in named), named
