"""The plugin manager.

Every component source is an ordinary plugin module registered with the same
``pm.register``, in this order:

1. the built-in variants, ``DEFAULT_PLUGINS`` (modules of ``abl.plugins``),
   loaded by import: a new built-in file needs one line here, no reinstall;
2. entry points in group ``"abl"`` of every installed distribution (third-party
   packages), loaded the same way right after them;
3. loose ``*.py`` files in the folders named by ``ABL_PLUGINS_DIR``
   (``os.pathsep``-separated), or by ``abl --plugins-dir``;
4. plugins registered in-process with ``pm.register`` (tests do this).

``ABL_PLUGINS`` restricts which third-party entry points load: a
comma-separated allowlist of entry-point names (empty = built-ins only). The
built-ins always load.
``ABL_TRACE_HOOKS=1`` prints every hook call, for debugging plugins.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import os
import sys
from pathlib import Path

import pluggy

from . import hookspecs
from .recipes import make_recipe
from .registry import Registry, RegistryError

GROUP = "abl"
SELF_DIST = "abl"

# The built-in variants, one module per axis (llm's DEFAULT_PLUGINS habit).
DEFAULT_PLUGINS: tuple[str, ...] = (
    "abl.plugins.norms",
    "abl.plugins.blocks",
    "abl.plugins.positions",
    "abl.plugins.attention",
    "abl.plugins.ffn",
    "abl.plugins.moe",
    "abl.plugins.ssm",
    "abl.plugins.s4",
    "abl.plugins.gated_conv",
    "abl.plugins.precision",
    "abl.plugins.datasets",
    "abl.plugins.tokenizers",
    "abl.plugins.probes",
    "abl.plugins.recipes",
)

pm = pluggy.PluginManager("abl")
pm.add_hookspecs(hookspecs)

_loaded = False
_provenance: dict[str, tuple[str, str]] = {}  # plugin name -> (package, version)
_registry: Registry | None = None


class PluginLoadError(Exception):
    """A plugin failed to import or register (reported to the user)."""


def _dist_of(ep) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ("?", "?")
    return (dist.metadata["Name"] or "?", dist.version or "?")


def _self_version() -> str:
    try:
        return md.version(SELF_DIST)
    except md.PackageNotFoundError:  # running from a source tree that is not installed
        return "?"


def _load_default_plugins() -> None:
    version = _self_version()
    for module_name in DEFAULT_PLUGINS:
        name = module_name.rsplit(".", 1)[-1]
        if pm.get_plugin(name) is not None:
            continue
        pm.register(importlib.import_module(module_name), name=name)
        _provenance[name] = (SELF_DIST, version)


def _load_entry_points() -> None:
    allow_env = os.environ.get("ABL_PLUGINS")
    allow = None if allow_env is None else {s.strip() for s in allow_env.split(",") if s.strip()}
    seen: set[str] = set()
    for ep in md.entry_points(group=GROUP):
        package, version = _dist_of(ep)
        if package == SELF_DIST:  # the built-ins come from DEFAULT_PLUGINS
            continue
        if allow is not None and ep.name not in allow:
            continue
        # The same distribution can be visible twice (e.g. an editable install
        # plus a build folder); load each (package, entry point) once.
        key = f"{package}:{ep.name}"
        if key in seen:
            continue
        seen.add(key)
        name = f"{package}:{ep.name}"
        if pm.get_plugin(name) is not None:
            continue
        try:
            obj = ep.load()
        except Exception as exc:  # a broken third-party plugin must say who it is
            raise PluginLoadError(
                f"plugin {ep.name!r} from package {package} {version} failed to import: {exc!r}"
            ) from exc
        pm.register(obj, name=name)
        _provenance[name] = (package, version)


def _load_plugin_dirs() -> None:
    dirs = [d for d in os.environ.get("ABL_PLUGINS_DIR", "").split(os.pathsep) if d]
    for d in dirs:
        folder = Path(d)
        if not folder.is_dir():
            raise PluginLoadError(f"ABL_PLUGINS_DIR entry {d!r} is not a folder")
        for path in sorted(folder.glob("*.py")):
            name = f"file:{path.stem}"
            if pm.get_plugin(name) is not None:
                continue
            spec = importlib.util.spec_from_file_location(f"abl_plugin_{path.stem}", path)
            if spec is None or spec.loader is None:
                raise PluginLoadError(f"plugin file {path.name} cannot be loaded as a module")
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
            except Exception as exc:
                raise PluginLoadError(f"plugin file {path.name} failed to import: {exc!r}") from exc
            pm.register(module, name=name)
            _provenance[name] = (f"file {path.name}", "-")


def load_plugins() -> pluggy.PluginManager:
    """Load every plugin once; later calls are no-ops."""
    global _loaded
    if _loaded:
        return pm
    _loaded = True
    if os.environ.get("ABL_TRACE_HOOKS"):
        pm.trace.root.setwriter(lambda msg: sys.stderr.write(msg))
        pm.enable_tracing()
    _load_default_plugins()
    _load_entry_points()
    _load_plugin_dirs()
    pm.check_pending()
    return pm


def provenance(plugin_name: str) -> tuple[str, str]:
    return _provenance.get(plugin_name, ("(registered in-process)", "-"))


def build_registry() -> Registry:
    """Ask every plugin to register its components into a fresh registry."""
    load_plugins()
    reg = Registry()
    for impl in reversed(pm.hook.register_components.get_hookimpls()):
        package, version = provenance(impl.plugin_name)

        def register(axis, name, factory, *args, _p=impl.plugin_name, _pk=package, _v=version, **kw):
            return reg.register(axis, name, factory, *args, plugin=_p, package=_pk, version=_v, **kw)

        try:
            impl.function(register=register)
        except RegistryError:
            raise
        except Exception as exc:
            raise PluginLoadError(
                f"plugin {impl.plugin_name!r} ({package} {version}) failed while "
                f"registering components: {exc!r}"
            ) from exc
    for impl in reversed(pm.hook.register_recipes.get_hookimpls()):
        package, version = provenance(impl.plugin_name)

        def register_recipe(name, settings, *args, _p=impl.plugin_name, _pk=package, _v=version, **kw):
            return reg.register_recipe(make_recipe(name, settings, *args, plugin=_p, package=_pk, version=_v, **kw))

        try:
            impl.function(register=register_recipe)
        except RegistryError:
            raise
        except Exception as exc:
            raise PluginLoadError(
                f"plugin {impl.plugin_name!r} ({package} {version}) failed while "
                f"registering recipes: {exc!r}"
            ) from exc
    return reg


def get_registry(refresh: bool = False) -> Registry:
    """The process-wide registry (built on first use)."""
    global _registry
    if _registry is None or refresh:
        _registry = build_registry()
    return _registry
