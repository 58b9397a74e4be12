"""Architecture recipes: a named family's component choices and ratios, scaled to a grid's size.

A recipe (``model.recipe = "NAME"``) is a list of ``Setting``s, each a dotted grid path (the keys a
grid file writes: ``model.norm``, ``norm.rmsnorm.eps``, ``mixer.mha.n_kv_heads``) with its value and
the source that gives it. It fixes choices and ratios only; the grid's ``model.d_model``,
``model.n_layers``, ``model.n_heads`` and ``model.context`` set the size, and a value that depends on
the size (a head layout, a window) is a ``Scaled`` function of the cell's model config.

Resolution order, lowest first: the schema's defaults < the recipe < the grid file (its tables and
its ``[grid]`` axes) < ``--set``. A key the grid file or ``--set`` gives is never touched by the
recipe, so a grid sweeps one axis away from a recipe (the family with another norm).

What a family has and abl lacks is a ``gaps`` line, never a silent approximation. Recipes come from
plugins through the ``register_recipes`` hook, the built-in ones included (abl.plugins.recipes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .registry import RegistryError, first_sentence, show_default

# the keys that size a model: the grid sets them, a recipe never does
SIZE_KEYS = ("model.d_model", "model.n_layers", "model.n_heads", "model.context", "model.scale",
             "model.recipe")


@dataclass(frozen=True)
class Scaled:
    """A value computed from the cell's model config (d_model, n_layers, n_heads, head_dim, context)."""

    fn: Callable[[Any], Any]
    text: str  # how a reader sees it: "n_heads / 4"

    def __call__(self, model: Any) -> Any:
        return self.fn(model)


def per_head(fraction: float, text: str) -> Scaled:
    """A head count as a fraction of ``model.n_heads`` (at least 1): GQA's n_kv_heads / n_heads."""
    return Scaled(lambda m: max(1, round(m.n_heads * fraction)), text)


def of_context(fraction: float, text: str) -> Scaled:
    """A length as a fraction of ``model.context`` (at least 1): a sliding window / context."""
    return Scaled(lambda m: max(1, round(m.context * fraction)), text)


def of_width(fraction: float, text: str, multiple_of: int = 1) -> Scaled:
    """A width as a fraction of ``model.d_model``, rounded to ``multiple_of`` (at least one multiple)."""
    return Scaled(lambda m: max(multiple_of, multiple_of * round(m.d_model * fraction / multiple_of)), text)


@dataclass(frozen=True)
class Setting:
    """One line of a recipe: ``path = value`` because ``source`` says so."""

    path: str
    value: Any  # a grid-file value, or a Scaled
    source: str

    def resolve(self, model: Any) -> Any:
        return self.value(model) if isinstance(self.value, Scaled) else self.value

    def shown(self) -> str:
        """The value as a grid file writes it, or a scaled value's formula."""
        return self.value.text if isinstance(self.value, Scaled) else show_default(self.value)


@dataclass(frozen=True)
class Recipe:
    """A named architecture family: its settings (each with its source) and what abl lacks of it."""

    name: str
    doc: str  # one line: the family and its primary source
    settings: tuple[Setting, ...]
    gaps: tuple[str, ...] = ()
    plugin: str = "?"
    package: str = "?"
    version: str = "?"

    def errors(self) -> list[str]:
        """Problems in the recipe itself (a size key, a path given twice, a line without a source)."""
        errs: list[str] = []
        seen: set[str] = set()
        for s in self.settings:
            if s.path in SIZE_KEYS:
                errs.append(f"recipe {self.name!r} sets {s.path}, which the grid sets (a recipe fixes "
                            "choices and ratios, the grid the size)")
            if s.path.startswith("grid.") or s.path.count(".") < 1:
                errs.append(f"recipe {self.name!r}: {s.path!r} is not a dotted config path")
            if s.path in seen:
                errs.append(f"recipe {self.name!r} sets {s.path} twice")
            if not s.source.strip():
                errs.append(f"recipe {self.name!r}: {s.path} cites no source")
            seen.add(s.path)
        return errs

    def values(self, model: Any) -> dict[str, Any]:
        """Every setting's value at the size of ``model`` (a ModelConfig), by dotted path."""
        return {s.path: s.resolve(model) for s in self.settings}

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "doc": self.doc, "plugin": self.plugin, "package": self.package,
                "version": self.version,
                "settings": [{"path": s.path, "value": s.shown(), "source": s.source} for s in self.settings],
                "gaps": list(self.gaps)}


def make_recipe(name: Any, settings: Any, doc: str = "", gaps: Any = (), *, plugin: str = "?",
                package: str = "?", version: str = "?") -> Recipe:
    """The Recipe a plugin's ``register(name, settings, doc=, gaps=)`` call describes; RegistryError
    for a nameless recipe or a setting that is not an ``abl.Setting``."""
    if not isinstance(name, str) or not name:
        raise RegistryError(f"plugin {plugin!r} registers a recipe without a name: {name!r}")
    settings = tuple(settings)
    if not all(isinstance(s, Setting) for s in settings):
        raise RegistryError(f"plugin {plugin!r}: recipe {name!r} settings must be abl.Setting objects")
    gaps = (gaps,) if isinstance(gaps, str) else tuple(gaps)
    return Recipe(name=name, doc=first_sentence(doc), settings=settings, gaps=gaps,
                  plugin=plugin, package=package, version=version)
