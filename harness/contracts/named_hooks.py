"""Registration hooks whose plugins register named callables (executors, post-training evaluations).

One rule for each such hook: a plugin calls ``register(name, fn, ...)``; a call without a name and a callable,
or a name registered twice, is a PluginLoadError that names the plugin(s) and their packages. What an entry
holds besides is the caller's: ``entry(name, fn, *rest, plugin=, package=, version=, **kw)`` builds it from the
``register`` call's own arguments (so each hook keeps its signature: an executor's ``doc``, an evaluation's
``metrics`` and ``doc``).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, TypeVar


class Registered(Protocol):
    """What an entry tells of where it came from (for the "registered twice" message)."""

    @property
    def plugin(self) -> str: ...

    @property
    def package(self) -> str: ...


E = TypeVar("E", bound=Registered)


def first_line(doc: str | None) -> str:
    """The first line of a docstring or a ``doc=`` argument (what ``abl plugins`` shows)."""
    return (doc or "").strip().split("\n")[0]


def named_register(out: dict[str, E], noun: str, callable_word: str,
                   entry: Callable[..., E]) -> Callable[[str, str, str], Callable[..., None]]:
    """``make_register(plugin, package, version)`` for abl.contracts.plugin_manager.call_register_hook: each
    ``register(name, fn, *rest, **kw)`` adds ``entry(...)`` to ``out`` under ``name``. ``noun`` ("executor")
    and ``callable_word`` ("factory") name what is registered in the messages."""
    article = "an" if noun[:1] in "aeiou" else "a"

    def make_register(plugin: str, package: str, version: str) -> Callable[..., None]:
        def register(name: str, fn: Callable[..., Any], *rest: Any, **kw: Any) -> None:
            from .plugin_manager import PluginLoadError

            if not isinstance(name, str) or not name or not callable(fn):
                raise PluginLoadError(f"plugin {plugin!r} registers {article} {noun} without a name and "
                                      f"a {callable_word}")
            if name in out:
                raise PluginLoadError(f"{noun} {name!r} is registered twice: by plugin {out[name].plugin!r} "
                                      f"({out[name].package}) and by plugin {plugin!r} ({package})")
            out[name] = entry(name, fn, *rest, plugin=plugin, package=package, version=version, **kw)
        return register

    return make_register


def collect_named(hook_name: str, what: str, noun: str, callable_word: str, entry: Callable[..., E],
                  light: bool = False) -> dict[str, E]:
    """Every entry the plugins register through the hook ``hook_name``, in load order (``what``: the plural
    for a failing plugin's message, e.g. "executors"; the rest as for ``named_register``)."""
    from .plugin_manager import call_register_hook

    out: dict[str, E] = {}
    call_register_hook(hook_name, what, named_register(out, noun, callable_word, entry), light=light)
    return out
