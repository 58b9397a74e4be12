"""The component registry: (axis, name) -> component.

A component is a factory plus its typed parameters, where it came from, and
optional cost model, reference implementation and compatibility check.
Nothing here knows any specific variant; plugins fill the registry.
"""

from __future__ import annotations

import builtins
import difflib
import inspect
import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from .params import SignatureError, disagreements, signature_specs

# axis -> (config path of the selector, what the factory is called with)
AXES: dict[str, tuple[str, str]] = {
    "norm": ("model.norm", "factory(dim, **params) -> nn.Module"),
    "block": (
        "model.block",
        "factory(config, make_norm, make_mixer, make_ffn, **params) -> nn.Module "
        "with forward(x, ctx) -> x and attribute final_norm (bool)",
    ),
    "position": (
        "model.position",
        "factory(config, **params) -> harness.model.PositionEncoding",
    ),
    "mixer": (
        "model.mixer",
        "factory(config, position, **params) -> nn.Module with forward(x, ctx) -> y",
    ),
    "ffn": ("model.ffn", "factory(config, **params) -> nn.Module with forward(x) -> y"),
    "precision": ("train.precision", "factory(**params) -> harness.train.Precision"),
    "dataset": ("data.dataset", "factory(**params) -> abl.TextCorpus (text) or abl.TokenData (token ids), "
                "or an abl.Task subclass registered as the factory (examples with marked answer positions)"),
    "tokenizer": ("data.tokenizer", "factory(**params) -> abl.Tokenizer (turns a TextCorpus into tokens)"),
}


class RegistryError(Exception):
    """A problem with a component name or its parameters (a user error)."""


# what torch and numpy take as an integer argument (a C int64)
INT64 = (-(2**63), 2**63 - 1)

TYPE_NAMES = {bool: "bool", int: "int", float: "float", str: "str", list: "list"}


@dataclass(frozen=True)
class Param:
    """A typed component parameter with a default.

    ``type`` is one of bool, int, float, str. ``choices`` restricts values;
    ``min``/``max`` bound numbers (inclusive).
    """

    default: Any
    type: type | None = None
    doc: str = ""
    choices: tuple | None = None
    min: float | None = None
    max: float | None = None

    def resolved_type(self) -> builtins.type:
        if self.type is not None:
            return self.type
        if self.default is None:
            return str
        return type(self.default)

    def check(self, name: str, value: Any) -> list[str]:
        """Return messages for a bad value (empty when it is fine)."""
        t = self.resolved_type()
        ok = isinstance(value, t) and not (t is not bool and isinstance(value, bool))
        if t is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if value is None and self.default is None:
            ok = True
        if not ok:
            return [
                f"{name} must be {TYPE_NAMES.get(t, t.__name__)}, "
                f"got {type(value).__name__} {value!r}"
            ]
        errs = []
        if isinstance(value, float) and not math.isfinite(value):
            # NaN compares false with every bound, so min/max alone would let it through
            return [f"{name} must be a finite number, got {value!r}"]
        if isinstance(value, int) and not isinstance(value, bool) and not INT64[0] <= value <= INT64[1]:
            return [f"{name} must fit in 64 bits (|value| < 2**63), got {value!r}"]
        if self.choices is not None and value not in self.choices:
            errs.append(f"{name} must be one of {list(self.choices)}, got {value!r}")
        if self.min is not None and value is not None and value < self.min:
            errs.append(f"{name} must be >= {self.min}, got {value!r}")
        if self.max is not None and value is not None and value > self.max:
            errs.append(f"{name} must be <= {self.max}, got {value!r}")
        return errs

    def describe(self) -> str:
        t = TYPE_NAMES.get(self.resolved_type(), "?")
        extra = ""
        if self.choices:
            extra = f" one of {list(self.choices)}"
        return f"{t}={show_default(self.default)}{extra}"


# a float whose shortest exact form has more significant digits than this was computed (8/3)
_WRITTEN_DIGITS = 10


def show_default(value: Any) -> str:
    """A default as a grid file writes it: a float in the shortest form that reads back exactly
    (``1e-06``, ``10000.0``), a computed float (``8/3``) as 4 significant digits after ``≈``; booleans
    ``true``/``false``, strings and lists as TOML (``"inside"``, ``[1, 2]``); no default as ``unset``."""
    if isinstance(value, float) and math.isfinite(value):
        text = repr(value)
        digits = len(re.sub(r"^0+", "", re.sub(r"[^0-9]", "", text.split("e")[0])).rstrip("0"))
        if digits > _WRITTEN_DIGITS:
            return f"≈{value:.4g}"
        return text
    if isinstance(value, bool):  # as a grid file writes them (TOML)
        return "true" if value else "false"
    if isinstance(value, (str, list, tuple, dict)):
        import json

        return json.dumps(value)
    if value is None:
        return "unset"
    return repr(value)


# abbreviations after which a full stop does not end a sentence
_ABBREVIATIONS = {"al", "e.g", "i.e", "cf", "vs", "sec", "secs", "eq", "eqs", "fig", "figs", "ref", "no", "approx"}


def first_sentence(text: str | None) -> str:
    """The first sentence of a docstring, whole (its first paragraph's lines joined), citations
    included as written."""
    if not text:
        return ""
    paragraph = re.split(r"\n\s*\n", inspect.cleandoc(text).strip(), maxsplit=1)[0]
    flat = " ".join(paragraph.split()).replace("``", "`")
    for m in re.finditer(r"(?<=[.!?])\s+(?=[A-Z(`\"'])", flat):
        word = re.split(r"[\s(]", flat[:m.start()])[-1].rstrip(".!?").lower()
        if word not in _ABBREVIATIONS and not (len(word) == 1 and word.isalpha()):
            return flat[:m.start()]
    return flat


def factory_doc(factory: Callable) -> str:
    """The first sentence of a factory's docstring, else of its module's (a plugin file's)."""
    target = getattr(factory, "func", factory)  # a functools.partial: its function
    own = target.__doc__ if inspect.isclass(target) or inspect.isroutine(target) else None
    if own and inspect.isclass(target) and own == getattr(type(target), "__doc__", None):
        own = None
    if own:
        return first_sentence(own)
    module = sys.modules.get(getattr(target, "__module__", "") or "")
    doc = getattr(module, "__doc__", None)
    if not doc:  # a module loaded from a file (``--plugins-dir``) is not in sys.modules: its globals
        members = [target, *(vars(target).values() if inspect.isclass(target) else ())]
        for member in members:
            glb = getattr(member, "__globals__", None)
            if isinstance(glb, dict) and glb.get("__doc__"):
                doc = glb["__doc__"]
                break
    return first_sentence(doc)


def _as_param(value: Any) -> Param:
    if isinstance(value, Param):
        return value
    return Param(default=value)


def params_of(factory: Callable, *names: str, axis: str | None = None) -> dict[str, Param]:
    """The parameters a factory's signature declares (abl.contracts.params), as Params: those named, in
    that order, else every one after those the skeleton supplies to ``axis`` that has a default (a
    name that starts with ``_`` is the factory's own). For a wrapper that passes ``**kwargs`` on:
    ``register(..., params=params_of(Wrapped, "bias", "eps"))``. A RegistryError names a parameter
    the signature lacks or one without a default."""
    try:
        specs = signature_specs(factory, *names, axis=axis)
    except SignatureError as exc:
        raise RegistryError(str(exc)) from None
    return {key: Param(**spec) for key, spec in specs.items()}


@dataclass
class Component:
    axis: str
    name: str
    factory: Callable
    params: dict[str, Param]
    plugin: str
    package: str
    version: str
    doc: str = ""
    cost: Callable | None = None
    reference: Callable | None = None
    check: Callable | None = None
    # the float parameter ``train.match_by = "ffn"`` turns to resize the component (its width)
    width: str | None = None
    # the component initialises its own weights; the skeleton's normal init leaves them alone
    own_init: bool = False

    def resolve_params(self, given: dict[str, Any] | None, where: str) -> tuple[dict, list[str]]:
        """Fill defaults and validate. Returns (params, error messages)."""
        given = dict(given or {})
        errs: list[str] = []
        out: dict[str, Any] = {}
        for key in given:
            if key not in self.params:
                valid = sorted(self.params)
                close = difflib.get_close_matches(key, valid, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                errs.append(
                    f"{where}: {self.axis} {self.name!r} has no parameter {key!r}"
                    f" (valid: {', '.join(valid) or 'none'}){hint}"
                )
        for key, p in self.params.items():
            value = given.get(key, p.default)
            for msg in p.check(key, value):
                errs.append(f"{where}.{key}: {msg}")
            out[key] = value
        return out, errs

    def summary(self) -> dict[str, Any]:
        return {
            "axis": self.axis,
            "name": self.name,
            "plugin": self.plugin,
            "package": self.package,
            "version": self.version,
            "doc": self.doc,
            "params": {k: p.describe() for k, p in self.params.items()},
        }


@dataclass
class Registry:
    components: dict[tuple[str, str], Component] = field(default_factory=dict)
    # architecture recipes by name (abl.contracts.recipes; the ``register_recipes`` hook)
    recipes: dict[str, Any] = field(default_factory=dict)

    def register_recipe(self, recipe: Any) -> Any:
        """Add a recipe (an abl.contracts.recipes.Recipe, made by ``make_recipe``); a RegistryError
        names both plugins of a duplicate name, or the recipe's own problems (a size key, a line
        without a source)."""
        name = recipe.name
        if name in self.recipes:
            other = self.recipes[name]
            raise RegistryError(f"duplicate recipe {name!r}: registered by plugin {other.plugin!r} "
                                f"({other.package} {other.version}) and by plugin {recipe.plugin!r} "
                                f"({recipe.package} {recipe.version})")
        errs = recipe.errors()
        if errs:
            raise RegistryError(f"plugin {recipe.plugin!r}: " + "; ".join(errs))
        self.recipes[name] = recipe
        return recipe

    def recipe(self, name: Any) -> Any:
        """The recipe ``name``; a RegistryError lists the registered ones."""
        recipe = self.recipes.get(name) if isinstance(name, str) else None
        if recipe is None:
            valid = sorted(self.recipes)
            close = difflib.get_close_matches(str(name), valid, n=1, cutoff=0.5)
            hint = f" Closest match: {close[0]!r}." if close else ""
            raise RegistryError(f"unknown recipe {name!r}. Valid recipes: {', '.join(valid) or '(none)'}.{hint}")
        return recipe

    def register(
        self,
        axis: str,
        name: str,
        factory: Callable,
        params: dict[str, Any] | None = None,
        doc: str | None = None,
        cost: Callable | None = None,
        reference: Callable | None = None,
        check: Callable | None = None,
        *,
        width: str | None = None,
        own_init: bool = False,
        plugin: str = "?",
        package: str = "?",
        version: str = "?",
    ) -> Component:
        if axis not in AXES:
            raise RegistryError(
                f"plugin {plugin!r} registers {name!r} on unknown axis {axis!r}; "
                f"axes are: {', '.join(AXES)}"
            )
        key = (axis, name)
        if key in self.components:
            other = self.components[key]
            raise RegistryError(
                f"duplicate {axis} {name!r}: registered by plugin {other.plugin!r} "
                f"({other.package} {other.version}) and by plugin {plugin!r} "
                f"({package} {version})"
            )
        where = f"plugin {plugin!r} registers {axis} {name!r}"
        if params is None:  # declared once, in the factory's signature
            try:
                typed = params_of(factory, axis=axis)
            except RegistryError as exc:
                raise RegistryError(f"{where}: {exc}") from None
        else:  # declared here too (the older way): both declarations must agree
            typed = {k: _as_param(v) for k, v in params.items()}
            errs = disagreements(axis, factory, typed)
            if errs:
                raise RegistryError(f"{where}: " + "; ".join(errs))
        floats = [k for k, p in typed.items() if p.resolved_type() is float]
        if width is not None and width not in floats:
            raise RegistryError(
                f"plugin {plugin!r} declares width={width!r} for {axis} {name!r}, which is not one "
                f"of its float parameters ({', '.join(floats) or 'none'})"
            )
        doc = first_sentence(doc) if doc is not None else factory_doc(factory)
        comp = Component(
            axis=axis,
            name=name,
            factory=factory,
            params=typed,
            plugin=plugin,
            package=package,
            version=version,
            doc=doc,
            cost=cost,
            reference=reference,
            check=check,
            width=width,
            own_init=bool(own_init),
        )
        self.components[key] = comp
        return comp

    def names(self, axis: str) -> list[str]:
        return sorted(n for (a, n) in self.components if a == axis)

    def get(self, axis: str, name: Any) -> Component:
        if axis not in AXES:
            raise RegistryError(f"unknown axis {axis!r}; axes are: {', '.join(AXES)}")
        comp = self.components.get((axis, name)) if isinstance(name, str) else None
        if comp is None:
            raise RegistryError(unknown_name_message(axis, name, self.names(axis)))
        return comp

    def position_class(self, config: Any) -> type | None:
        """The registered factory of the position ``config.position`` names, when it is a class.

        Cost and check functions get the model config, not a built position;
        ``call_with_position`` hands them this class so they can ask it, e.g.
        ``position.overrides("rotate")``. None for an unknown name or a factory
        that is not a class.
        """
        try:
            factory = self.get("position", getattr(config, "position", None)).factory
        except RegistryError:
            return None
        return factory if isinstance(factory, type) else None

    def call_with_position(self, fn: Callable, config: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(config, *args, **kwargs)``, plus ``position=`` the configured position's class when
        ``fn`` names a ``position`` parameter (cost and check functions opt in by naming it)."""
        if "position" in _parameter_names(fn):
            kwargs["position"] = self.position_class(config)
        return fn(config, *args, **kwargs)

    def all(self) -> list[Component]:
        order = {a: i for i, a in enumerate(AXES)}
        return sorted(self.components.values(), key=lambda c: (order[c.axis], c.name))


def _parameter_names(fn: Callable) -> set[str]:
    import inspect

    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # builtins without a signature
        return set()


# what ``unknown_name_message`` says, read back (abl.store.provenance.plugin_hint names the missing plugin)
UNKNOWN_NAME = re.compile(r"unknown (\w+) '([^']*)'")


def unknown_names(text: str) -> list[tuple[str, str]]:
    """(axis, name) of every unknown component a message of ``unknown_name_message`` names."""
    return list(dict.fromkeys((axis, name) for axis, name in UNKNOWN_NAME.findall(text) if axis in AXES))


def unknown_name_message(axis: str, name: Any, valid: list[str]) -> str:
    close = difflib.get_close_matches(str(name), valid, n=1, cutoff=0.5)
    hint = f" Closest match: {close[0]!r}." if close else ""
    return (
        f"unknown {axis} {name!r}. Valid {axis} names: {', '.join(valid) or '(none)'}.{hint}"
    )
