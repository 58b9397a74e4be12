"""``abl plugins``: every registered component by axis, with where it came from."""

from __future__ import annotations

import click

from .common import fail, load_registry, plugins_dir_option
from .extensions import extension_lines, extension_rows


@click.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of the listing.")
@click.option("--recipe", "recipe", default=None, metavar="NAME",
              help="Show one architecture recipe whole: every setting with its source, and its gaps.")
@plugins_dir_option
def command(as_json, recipe=None):
    """List every registered component by axis, and the architecture recipes: where each came from,
    what it is, its parameters.

    Each component gets a line with its name and origin (built-in, the
    installed package of an entry point, or the file a --plugins-dir folder
    held), the first sentence of its docstring, and one line per parameter
    with its type and default; long lines wrap, nothing is cut. Each recipe
    (model.recipe) gets its origin and a one-line source; --recipe NAME shows
    its every setting with the source that gives it.
    """
    import json
    import shutil
    import textwrap

    from ..contracts.registry import AXES, RegistryError, show_default

    registry = load_registry()
    comps = registry.all()
    recipes = [registry.recipes[n] for n in sorted(registry.recipes)]
    if recipe is not None:
        try:
            recipes = [registry.recipe(recipe)]
        except RegistryError as exc:
            fail(str(exc))
    options = skeleton_options()
    if as_json:
        rows = [] if recipe is not None else [{**c.summary(), "origin": _origin(c.package, c.version, c.plugin)}
                                              for c in comps]
        # the skeleton's own variants (config keys, not components) as axis "skeleton"
        rows += [] if recipe is not None else [{"axis": "skeleton", **o} for o in options]
        # a recipe is listed beside the components as axis "recipe" (no params: its settings instead)
        rows += [{"axis": "recipe", **r.summary(), "params": {}, "origin": _origin(r.package, r.version, r.plugin)}
                 for r in recipes]
        rows += [] if recipe is not None else extension_rows(_origin)  # executors, evaluations, metrics
        click.echo(json.dumps(rows, indent=2))
        return
    width = max(40, shutil.get_terminal_size((100, 24)).columns - 1)

    def wrap(text: str, indent: int, hang: int = 0) -> list[str]:
        return textwrap.wrap(text, width, initial_indent=" " * indent, subsequent_indent=" " * (indent + hang),
                             break_long_words=True, break_on_hyphens=False) or [" " * indent]

    lines: list[str] = []
    for axis in AXES:
        lines += ["", *wrap(f"{axis}  (selected by {AXES[axis][0]})", 0, 4)]
        for c in (c for c in comps if c.axis == axis):
            lines += wrap(f"{c.name}  {_origin(c.package, c.version, c.plugin)}", 2, 4)
            lines += wrap(c.doc or "(no description: its factory and module have no docstring)", 6)
            for key, prm in c.params.items():
                t = prm.resolved_type().__name__
                shown = show_default(prm.default)
                text = f"{key}: {t} {'≈ ' + shown[1:] if shown.startswith('≈') else '= ' + shown}"
                if prm.choices:
                    text += f", one of {', '.join(map(str, prm.choices))}"
                if prm.doc:
                    text += f" - {prm.doc}"
                lines += wrap(text, 8, 4)
    lines += ["", *wrap("skeleton options  (variants of the shared skeleton that are config keys, not "
                        "components: a grid sweeps them like any key)", 0, 4)]
    for o in options:
        text = f"{o['name']}: {o['type']} = {show_default(o['default'])}"
        if o["choices"]:
            text += f", one of {', '.join(map(str, o['choices']))}"
        lines += wrap(text, 2, 4)
        lines += wrap(o["doc"], 6)
    if recipe is not None:
        lines = []
    lines += ["", *wrap("recipe  (selected by model.recipe; abl plugins --recipe NAME shows every setting "
                        "with its source)", 0, 4)]
    for r in recipes:
        lines += wrap(f"{r.name}  {_origin(r.package, r.version, r.plugin)}", 2, 4)
        lines += wrap(r.doc, 6)
        if recipe is not None:
            for s in r.settings:
                lines += wrap(f"{s.path} = {s.shown()}  [{s.source}]", 8, 4)
            for gap in r.gaps:
                lines += wrap(f"gap: {gap}", 8, 4)
        elif r.gaps:
            lines += wrap(f"{len(r.gaps)} gap(s): what the family has and abl lacks, or where the recipe "
                          f"departs from it (--recipe {r.name})", 6)
    lines += [] if recipe is not None else extension_lines(extension_rows(_origin), wrap)
    click.echo("\n".join(lines).lstrip("\n"))


def skeleton_options() -> list[dict]:
    """The ``[model]`` keys marked ``variant`` in abl.contracts.config: name, type, default, choices, doc."""
    import dataclasses

    from ..contracts.config import ModelConfig

    return [{"name": f"model.{f.name}", "type": f.type if isinstance(f.type, str) else f.type.__name__,
             "default": f.default, "choices": list(f.metadata.get("choices") or []), "doc": f.metadata["doc"]}
            for f in dataclasses.fields(ModelConfig) if f.metadata.get("variant")]


def _origin(package: str, version: str, plugin: str) -> str:
    """Where a component came from, for a reader: built-in, a package's entry point, a plugin file."""
    from ..contracts.plugin_manager import SELF_DIST

    if package == SELF_DIST:
        return f"built-in ({package} {version})"
    if package.startswith("file "):
        return f"{package[len('file '):]} from --plugins-dir"
    if ":" in plugin:  # an entry point: its distribution and the entry point's name
        return f"{package} {version} (entry point {plugin.split(':', 1)[1]})"
    return package if version in ("-", "?") else f"{package} {version}"
