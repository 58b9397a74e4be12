"""The plugin manager.

Every component source is an ordinary plugin module registered with the same
``pm.register``, in this order:

1. the built-in variants, executors, metrics and evaluations, ``DEFAULT_PLUGINS``
   (modules of ``abl.plugins``), loaded by import: a new built-in file needs one
   line here, no reinstall;
2. entry points in group ``"abl"`` of every installed distribution (third-party
   packages), loaded the same way right after them;
3. loose ``*.py`` files in the folders named by ``ABL_PLUGINS_DIR``
   (``os.pathsep``-separated), or by ``abl --plugins-dir``;
4. plugins registered in-process with ``pm.register`` (tests do this).

``ABL_PLUGINS`` restricts which third-party entry points load: a
comma-separated allowlist of entry-point names (empty = built-ins only). The
built-ins always load.
``ABL_TRACE_HOOKS=1`` prints every hook call, for debugging plugins.

Each loaded plugin's origin is kept (``source``): the built-ins as "builtin" with abl's version, an entry
point as its package and version, a plugins-folder file as the folder as it was given (relative if it was
relative), the file's path inside it and the sha256 of the bytes that were executed. A run records the
origin of each of its components (abl.store.provenance.plugin_records), so a reader of its figures can say
which plugin to load when it is missing.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata as md
import importlib.util
import os
import sys
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Callable

import pluggy

from . import hookspecs
from .recipes import make_recipe
from .registry import Registry, RegistryError

GROUP = "abl"
SELF_DIST = "abl"
# the kinds of origin ``source`` gives
BUILTIN, PACKAGE, FILE, IN_PROCESS = "builtin", "package", "file", "in-process"

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
    "abl.plugins.executors",
    "abl.plugins.metrics",
    "abl.plugins.evaluations",
)
# The built-ins a reader of stored runs needs (the metric catalogue) and that import no torch: a command that only
# reads the store loads these, the entry points and the plugin folders (``load_plugins(light=True)``), not the rest.
LIGHT_PLUGINS: tuple[str, ...] = ("abl.plugins.metrics",)

pm = pluggy.PluginManager("abl")
pm.add_hookspecs(hookspecs)

_loaded = False
_light_loaded = False
_rank: dict[str, int] = {}  # plugin name -> its place in the load order (built-ins first, in DEFAULT_PLUGINS order)
_provenance: dict[str, tuple[str, str]] = {}  # plugin name -> (package, version)
_sources: dict[str, dict[str, str]] = {}  # plugin name -> where it came from (``source``)
_registry: Registry | None = None


# Bounds each plugin import and registration (``what`` names it): the command line installs a time limit
# (abl.run.guard.time_limit, ``set_guard``), so a plugin whose import never returns stops a command with a
# message instead of hanging it; elsewhere (a worker, a test) nothing is bounded here.
_guard: Callable[[str], AbstractContextManager] = lambda what: nullcontext()


def set_guard(guard: Callable[[str], AbstractContextManager]) -> None:
    global _guard
    _guard = guard


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


def _register(obj, name: str) -> None:
    """``pm.register`` that remembers the load order: a light load registers the plugin folders before the
    heavy built-ins, but every hook still sees the built-ins first (``ordered_impls``)."""
    pm.register(obj, name=name)
    _rank.setdefault(name, len(DEFAULT_PLUGINS) + len(_rank))


def _load_default_plugins(modules: tuple[str, ...] = DEFAULT_PLUGINS) -> None:
    version = _self_version()
    for module_name in modules:
        name = module_name.rsplit(".", 1)[-1]
        if pm.get_plugin(name) is not None:
            continue
        _rank[name] = DEFAULT_PLUGINS.index(module_name)
        _register(importlib.import_module(module_name), name=name)
        _provenance[name] = (SELF_DIST, version)
        _sources[name] = {"kind": BUILTIN, "plugin": name, "package": SELF_DIST, "version": version}


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
            with _guard(f"importing plugin {ep.name!r} of package {package} {version}"):
                obj = ep.load()
        except Exception as exc:  # a broken third-party plugin must say who it is
            raise PluginLoadError(
                f"plugin {ep.name!r} from package {package} {version} failed to import: {exc!r}"
            ) from exc
        _register(obj, name=name)
        _provenance[name] = (package, version)
        _sources[name] = {"kind": PACKAGE, "plugin": name, "package": package, "version": version,
                          "entry_point": ep.name}


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
                digest = hashlib.sha256(path.read_bytes()).hexdigest()  # the bytes executed next
                with _guard(f"importing plugin file {path.name}"):
                    spec.loader.exec_module(module)
            except Exception as exc:
                raise PluginLoadError(f"plugin file {path.name} failed to import: {exc!r}") from exc
            _register(module, name=name)
            _provenance[name] = (f"file {path.name}", "-")
            # the folder as the user gave it (``--plugins-dir`` keeps it as typed), the file inside it
            _sources[name] = {"kind": FILE, "plugin": name, "folder": d,
                              "file": path.relative_to(folder).as_posix(), "sha256": digest}


def load_plugins(light: bool = False) -> pluggy.PluginManager:
    """Load every plugin once; later calls are no-ops.

    ``light``: only the built-ins of ``LIGHT_PLUGINS`` (no torch), with every third-party plugin; a later full
    load adds the other built-ins. A reader of stored runs (the metric catalogue) loads this way."""
    global _loaded, _light_loaded
    if _loaded or (light and _light_loaded):
        return pm
    if not _light_loaded and os.environ.get("ABL_TRACE_HOOKS"):
        pm.trace.root.setwriter(lambda msg: sys.stderr.write(msg))
        pm.enable_tracing()
    _loaded = _loaded or not light
    first = not _light_loaded
    _light_loaded = True
    _load_default_plugins(LIGHT_PLUGINS if light else DEFAULT_PLUGINS)
    if first:
        _load_entry_points()
        _load_plugin_dirs()
    pm.check_pending()
    return pm


def ordered_impls(hook) -> list:
    """A hook's implementations in load order: the built-ins (in ``DEFAULT_PLUGINS`` order), then the
    entry points and plugin folders, then plugins registered in-process, each in the order registered."""
    impls = list(reversed(hook.get_hookimpls()))  # pluggy calls the last registered first
    return sorted(impls, key=lambda impl: _rank.get(impl.plugin_name, 1 << 30))


def call_register_hook(hook_name: str, what: str, make_register, light: bool = False) -> None:
    """Call the registration hook ``hook_name`` of every plugin in load order, each with
    ``register=make_register(plugin, package, version)``; a plugin's own exception becomes a
    ``PluginLoadError`` that names it (``what``: "executors", "metrics", ... for the message)."""
    load_plugins(light=light)
    for impl in ordered_impls(getattr(pm.hook, hook_name)):
        package, version = provenance(impl.plugin_name)
        try:
            with _guard(f"plugin {impl.plugin_name!r}'s {hook_name} hook"):
                impl.function(register=make_register(impl.plugin_name, package, version))
        except (RegistryError, PluginLoadError):
            raise
        except Exception as exc:
            raise PluginLoadError(f"plugin {impl.plugin_name!r} ({package} {version}) failed while "
                                  f"registering {what}: {exc}") from exc


def notify(hook_name: str, **kwargs) -> list[str]:
    """Call a notification hook (``run_finished``) of every plugin in load order, each under the guard's time
    limit; returns why each implementation that raised or did not return failed (the caller warns and goes
    on: a plugin's notification never stops the grid or costs a cell)."""
    problems = []
    for impl in ordered_impls(getattr(pm.hook, hook_name)):
        what = f"plugin {impl.plugin_name!r}'s {hook_name} hook"
        try:
            with _guard(what):
                impl.function(**{k: kwargs[k] for k in impl.argnames})
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - its exception, or the guard's time limit (a BaseException)
            problems.append(f"{what} raised {type(exc).__name__}: {exc}; the grid goes on" if isinstance(exc, Exception)
                            else f"{exc} (it was left; the grid goes on)")
    return problems


def provenance(plugin_name: str) -> tuple[str, str]:
    return _provenance.get(plugin_name, ("(registered in-process)", "-"))


def source(plugin_name: str) -> dict[str, str]:
    """Where the loaded plugin ``plugin_name`` came from, as plain strings a run folder can keep:
    ``kind`` (``BUILTIN``, ``PACKAGE``, ``FILE`` or ``IN_PROCESS``) and ``plugin``, plus ``package`` and
    ``version`` (a built-in: abl and its version; an entry point: its distribution, and ``entry_point``),
    or ``folder`` (as given to abl), ``file`` (its path inside the folder) and ``sha256`` (of its bytes)."""
    return dict(_sources.get(plugin_name) or {"kind": IN_PROCESS, "plugin": plugin_name})


def build_registry() -> Registry:
    """Ask every plugin to register its components into a fresh registry."""
    load_plugins()
    reg = Registry()
    for impl in ordered_impls(pm.hook.register_components):
        package, version = provenance(impl.plugin_name)

        def register(axis, name, factory, *args, _p=impl.plugin_name, _pk=package, _v=version, **kw):
            return reg.register(axis, name, factory, *args, plugin=_p, package=_pk, version=_v, **kw)

        try:
            with _guard(f"plugin {impl.plugin_name!r}'s register_components hook"):
                impl.function(register=register)
        except RegistryError:
            raise
        except Exception as exc:
            raise PluginLoadError(
                f"plugin {impl.plugin_name!r} ({package} {version}) failed while "
                f"registering components: {exc!r}"
            ) from exc
    for impl in ordered_impls(pm.hook.register_recipes):
        package, version = provenance(impl.plugin_name)

        def register_recipe(name, settings, *args, _p=impl.plugin_name, _pk=package, _v=version, **kw):
            return reg.register_recipe(make_recipe(name, settings, *args, plugin=_p, package=_pk, version=_v, **kw))

        try:
            with _guard(f"plugin {impl.plugin_name!r}'s register_recipes hook"):
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
