"""One rule for hooks that register named callables (abl.contracts.named_hooks): executors and post-training
evaluations refuse a nameless registration and a name registered twice, naming both plugins and packages."""

from dataclasses import dataclass

import pytest

from abl.contracts.named_hooks import named_register
from abl.contracts.plugin_manager import PluginLoadError
from abl.train import evaluations


@dataclass(frozen=True)
class Entry:
    name: str
    doc: str
    plugin: str
    package: str


def entry(name, fn, doc="", *, plugin, package, version):
    return Entry(name, doc or fn.__doc__ or "", plugin, package)


def test_a_name_registered_twice_names_both_plugins_and_packages():
    out: dict[str, Entry] = {}
    make_register = named_register(out, "executor", "factory", entry)
    make_register("first", "pkg-a", "1.0")("fast", lambda options: None, "quick")
    assert out["fast"] == Entry("fast", "quick", "first", "pkg-a")
    with pytest.raises(PluginLoadError, match=r"executor 'fast' is registered twice: by plugin 'first' \(pkg-a\) "
                                              r"and by plugin 'second' \(pkg-b\)"):
        make_register("second", "pkg-b", "2.0")("fast", lambda options: None)


@pytest.mark.parametrize("name,fn", [("", len), ("x", "not callable"), (None, len)])
def test_a_registration_without_a_name_and_a_callable_is_refused(name, fn):
    register = named_register({}, "post-training evaluation", "function", entry)("odd", "-", "-")
    with pytest.raises(PluginLoadError, match="plugin 'odd' registers a post-training evaluation without a name "
                                              "and a function"):
        register(name, fn)


def test_the_built_in_evaluations_come_through_the_shared_rule(monkeypatch):
    monkeypatch.setattr(evaluations, "_from_plugins", None)
    built_in = evaluations.registered()
    assert [(e.name, e.plugin) for e in built_in.values()][:3] == [
        ("decode", "evaluations"), ("extrapolation", "evaluations"), ("probes", "evaluations")]
    assert all(e.doc and "\n" not in e.doc for e in built_in.values())
