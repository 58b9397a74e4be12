"""Parameters declared once: a component's parameters read from its factory's signature.

``register`` without ``params=`` takes them from here (``signature_specs``, through the registry's
``params_of``): every parameter after the ones the skeleton supplies to the axis, with its default,
its type from the annotation, and doc, choices and bounds from ``Annotated[type, Arg(...)]`` (or
``Literal[...]`` for the choices). With ``params=`` (the older way, still accepted)
``disagreements`` lists where the two declarations differ, and registration fails on any. This
module knows no registry type; the registry turns its answers into ``Param``s and RegistryErrors.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, Callable, Protocol


class SignatureError(ValueError):
    """A signature that cannot declare the parameters asked of it (the registry reports it as a
    RegistryError)."""


class Declared(Protocol):
    """A declared parameter as ``disagreements`` reads it (an abl.contracts.registry.Param)."""

    @property
    def default(self) -> Any: ...

    @property
    def choices(self) -> tuple | None: ...

    @property
    def min(self) -> float | None: ...

    @property
    def max(self) -> float | None: ...

    def resolved_type(self) -> type: ...

# how many leading positional arguments the skeleton supplies to each axis's factory (see AXES)
SUPPLIED = {"norm": 1, "block": 4, "position": 1, "mixer": 2, "ffn": 1, "precision": 0, "dataset": 0,
            "tokenizer": 0}


@dataclass(frozen=True)
class Arg:
    """What a factory parameter's annotation adds to its type and default: the metadata of
    ``Annotated[float, Arg("doc", min=0.0)] = 1e-5`` in a factory's signature.

    The signature is then the one declaration of the parameter: ``register`` derives its
    ``Param`` (type from the annotation, default from the signature, doc, choices and bounds from
    here). ``Literal["a", "b"]`` gives the choices too.
    """

    doc: str = ""
    choices: tuple | None = None
    min: float | None = None
    max: float | None = None


_TYPES = (bool, int, float, str, list)


def _unwrap(fn: Callable) -> Callable:
    """The function whose globals resolve the annotations of ``fn`` (a class: its ``__init__``; a
    functools.partial: its function)."""
    target = getattr(fn, "func", fn)
    return target.__init__ if inspect.isclass(target) else target  # type: ignore[misc]


def _hints(fn: Callable, sig: inspect.Signature) -> dict[str, Any]:
    """Each parameter's annotation evaluated (``from __future__ import annotations`` leaves strings);
    one that does not evaluate is left out."""
    import typing

    target = _unwrap(fn)
    try:
        return typing.get_type_hints(target, include_extras=True)
    except Exception:  # one unresolvable name (a TYPE_CHECKING import) must not hide the others
        pass
    glb = getattr(target, "__globals__", {})
    out: dict[str, Any] = {}
    for name, p in sig.parameters.items():
        ann = p.annotation
        if isinstance(ann, str):
            try:
                ann = eval(ann, dict(glb))  # noqa: S307 - the plugin's own annotation text
            except Exception:
                continue
        if ann is not inspect.Parameter.empty:
            out[name] = ann
    return out


def _annotation(ann: Any) -> tuple[type | None, Arg, tuple | None]:
    """(the Param type, the Arg, Literal choices) that an annotation says."""
    import types
    import typing
    from collections import abc

    arg = Arg()
    if typing.get_origin(ann) is typing.Annotated:
        base, *meta = typing.get_args(ann)
        for m in meta:
            if isinstance(m, Arg):
                arg = m
            elif isinstance(m, str) and not arg.doc:
                arg = Arg(doc=m)
        ann = base
    origin = typing.get_origin(ann)
    if origin is typing.Literal:
        choices = typing.get_args(ann)
        kinds = {type(c) for c in choices}
        return (kinds.pop() if len(kinds) == 1 else None), arg, choices
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(ann) if a is not type(None)]
        if len(rest) == 1:
            return _annotation(rest[0])[0], arg, None
        return None, arg, None
    if ann in _TYPES:
        return ann, arg, None
    if origin in (list, tuple, abc.Sequence) or ann in (tuple, abc.Sequence):  # a TOML array
        return list, arg, None
    return None, arg, None


def _signature(factory: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without one
        return None


def _own_parameters(axis: str | None, sig: inspect.Signature) -> tuple[list[inspect.Parameter], bool]:
    """The parameters a grid sets (after the ones the skeleton supplies), and whether the factory
    takes ``**kwargs``."""
    skip = SUPPLIED.get(axis or "", 0)
    own, var_kw = [], False
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            var_kw = True
        elif p.kind is p.VAR_POSITIONAL:
            skip = 0
        elif skip and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            skip -= 1
        elif p.kind is not p.POSITIONAL_ONLY and not p.name.startswith("_"):
            own.append(p)
    return own, var_kw


def _spec_from(p: inspect.Parameter, hint: Any) -> dict[str, Any]:
    """The keyword arguments of the ``Param`` that parameter ``p`` of a signature declares."""
    kind, arg, choices = _annotation(hint)
    default = p.default
    if isinstance(default, tuple) and kind is list:  # an immutable default for a list parameter
        default = list(default)
    return dict(default=default, type=kind, doc=arg.doc, choices=choices if arg.choices is None else arg.choices,
                min=arg.min, max=arg.max)


def signature_specs(factory: Callable, *names: str, axis: str | None = None) -> dict[str, dict[str, Any]]:
    """The parameters a factory's signature declares, as ``Param`` keyword arguments: those named, in that order, else
    every parameter after the ones the skeleton supplies to ``axis`` that has a default (names that
    start with ``_`` are the factory's own). A SignatureError names a parameter the signature lacks
    or one without a default."""
    sig = _signature(factory)
    if sig is None:
        if names:
            raise SignatureError(f"{_name(factory)} has no signature to read parameters {list(names)} from")
        return {}
    hints = _hints(factory, sig)
    if names:
        missing = [n for n in names if n not in sig.parameters]
        if missing:
            raise SignatureError(f"{_name(factory)} has no parameter {', '.join(map(repr, missing))}")
        chosen = [sig.parameters[n] for n in names]
    else:
        chosen = _own_parameters(axis, sig)[0]
    bare = [p.name for p in chosen if p.default is inspect.Parameter.empty]
    if bare:
        raise SignatureError(f"parameter {', '.join(map(repr, bare))} of {_name(factory)} has no default: "
                            "a component parameter needs one (a grid may leave it out)")
    return {p.name: _spec_from(p, hints.get(p.name)) for p in chosen}


def _name(factory: Callable) -> str:
    target = getattr(factory, "func", factory)
    return getattr(target, "__qualname__", None) or repr(target)


def _same_default(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def disagreements(axis: str, factory: Callable, declared: Mapping[str, Declared]) -> list[str]:
    """Where ``declared`` (a ``params=`` given to ``register``) and the factory's signature say
    different things: a default, a type, choices or a bound that differ, or a declared parameter the
    signature lacks (unless the factory takes ``**kwargs`` and passes it on)."""
    sig = _signature(factory)
    if sig is None:
        return []
    own, var_kw = _own_parameters(axis, sig)
    by_name = {p.name: p for p in own}
    hints = _hints(factory, sig)
    errs = []
    for key, dec in declared.items():
        p = by_name.get(key)
        if p is None:
            if not var_kw:
                errs.append(f"parameter {key!r} is declared but {_name(factory)} does not take it")
            continue
        if p.default is inspect.Parameter.empty:
            continue  # the declaration alone gives the default
        sig_param = _spec_from(p, hints.get(key))
        if not _same_default(dec.default, sig_param["default"]):
            errs.append(f"parameter {key!r}: declared default {dec.default!r}, but the signature of "
                        f"{_name(factory)} says {p.default!r}")
        want = sig_param["type"]
        if want is not None and dec.resolved_type() is not want and dec.default is not None:
            errs.append(f"parameter {key!r}: declared type {dec.resolved_type().__name__}, "
                        f"but the signature of {_name(factory)} says {want.__name__}")
        for attr in ("choices", "min", "max"):
            mine, theirs = getattr(dec, attr), sig_param[attr]
            if mine is not None and theirs is not None and tuple(mine if attr == "choices" else (mine,)) != \
                    tuple(theirs if attr == "choices" else (theirs,)):
                errs.append(f"parameter {key!r}: declared {attr} {mine!r}, but the signature of "
                            f"{_name(factory)} says {theirs!r}")
    return errs
