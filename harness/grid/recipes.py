"""``model.recipe``: a cell's raw tables filled with its recipe's settings (abl.contracts.recipes).

The recipe fills only the keys the cell does not give: by the time a cell is resolved its raw tables
hold the grid file, the ``--set`` overrides and the cell's ``[grid]`` values, so the order is
defaults < recipe < grid file < ``--set``. The settings are computed at the cell's size (its
``model.scale`` preset applied first). A grid without ``model.recipe`` is returned as it is, so its
run ids are those it always had.
"""

from __future__ import annotations

import copy
from typing import Any

from ..contracts.registry import Registry, RegistryError
from .parsing import apply_override
from .validation import derive_sizes, known_path, typed_sections


def given(raw: dict, path: str) -> bool:
    """Whether the raw tables set the dotted ``path`` (``model.norm``, ``mixer.mha.n_kv_heads``)."""
    node: Any = raw
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def recipe_name(raw: dict) -> Any:
    model = raw.get("model")
    return model.get("recipe", "") if isinstance(model, dict) else ""


def apply_recipe(raw: dict, registry: Registry) -> tuple[dict, list[str]]:
    """``raw`` with its recipe's settings added where it gives none (a copy), or the problems found."""
    name = recipe_name(raw)
    if name == "":
        return raw, []
    try:
        recipe = registry.recipe(name)
    except RegistryError as exc:
        return raw, [f"model.recipe: {exc}"]
    sections, errs = typed_sections(raw)
    if errs:  # the cell's own errors, reported when it is resolved
        return raw, []
    model = sections["model"]
    derive_sizes(raw, model, sections["train"])  # the size the recipe scales to; errors come later
    out = copy.deepcopy(raw)
    errs = []
    for setting in recipe.settings:
        if given(raw, setting.path):
            continue
        msg = known_path(setting.path, registry)
        if msg:
            errs.append(f"recipe {name!r} ({recipe.plugin}): {msg}")
            continue
        try:
            value = setting.resolve(model)
        except Exception as exc:  # noqa: BLE001 - a plugin's size function: say whose
            errs.append(f"recipe {name!r} ({recipe.plugin}): {setting.path} = {setting.shown()} failed at "
                        f"d_model={model.d_model}, n_heads={model.n_heads}, context={model.context}: {exc!r}")
            continue
        apply_override(out, setting.path, value)
    return (raw, errs) if errs else (out, [])
