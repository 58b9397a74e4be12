"""A component's parameters are declared once: in its factory's signature (issue 38, item 7).

``register`` without ``params=`` derives them from the signature (type from the annotation,
doc/choices/bounds from ``Annotated[..., Arg(...)]`` or ``Literal``); with ``params=`` (the older
way) the two declarations are compared and a disagreement fails at registration, naming the plugin,
axis, component and parameter.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Annotated, Literal

import pytest

from abl.contracts.params import Arg
from abl.contracts.registry import Param, Registry, RegistryError, params_of


class Norm:
    def __init__(self, dim, eps: Annotated[float, Arg("added to the variance", min=0.0)] = 1e-5,
                 gain: bool = True, where: Literal["inside", "outside"] = "inside",
                 sizes: Annotated[Sequence[int], Arg("a list")] = (), _private: int = 3):
        self.dim, self.eps = dim, eps


def test_params_are_derived_from_the_signature():
    comp = Registry().register("norm", "n", Norm, plugin="p")
    assert list(comp.params) == ["eps", "gain", "where", "sizes"]  # dim is supplied; _private is the factory's own
    eps = comp.params["eps"]
    assert (eps.default, eps.resolved_type(), eps.doc, eps.min) == (1e-5, float, "added to the variance", 0.0)
    assert comp.params["where"].choices == ("inside", "outside")
    assert comp.params["sizes"].default == [] and comp.params["sizes"].resolved_type() is list
    params, errs = comp.resolve_params({"eps": -1.0, "where": "middle"}, "model.norm")
    assert len(errs) == 2 and "eps" in errs[0] and "middle" in errs[1]
    assert comp.params["gain"].describe() == "bool=true"


def test_a_signature_param_without_a_default_fails_at_registration():
    def factory(dim, eps: float):
        return None

    with pytest.raises(RegistryError, match=r"plugin 'p' registers norm 'bare': parameter 'eps'.*no default"):
        Registry().register("norm", "bare", factory, plugin="p")


@pytest.mark.parametrize("declared, message", [
    ({"eps": Param(1e-6)}, r"'eps': declared default 1e-06, but the signature of Norm says 1e-05"),
    ({"eps": Param(0)}, r"'eps': declared default 0.*declared type int, but the signature of Norm says float"),
    ({"alpha": Param(0.5)}, r"'alpha' is declared but Norm does not take it"),
    ({"eps": Param(1e-5, min=1.0)}, r"'eps': declared min 1.0, but the signature of Norm says 0.0"),
    ({"where": Param("inside", choices=("inside",))}, r"'where': declared choices"),
])
def test_two_declarations_that_disagree_fail_naming_plugin_axis_component_and_parameter(declared, message):
    with pytest.raises(RegistryError, match=r"plugin 'third' registers norm 'n': .*" + message):
        Registry().register("norm", "n", Norm, params=declared, plugin="third")


def test_the_older_way_still_works_when_the_declarations_agree():
    comp = Registry().register("norm", "n", Norm, params={"eps": Param(1e-5, doc="mine"), "gain": True},
                               plugin="third")
    assert list(comp.params) == ["eps", "gain"]  # the declared set stays the set: no signature extras
    assert comp.params["eps"].doc == "mine"


def test_a_factory_that_passes_kwargs_on_may_declare_them():
    def wrapper(dim, **kw):
        return Norm(dim, **kw)

    comp = Registry().register("norm", "w", wrapper, params=params_of(Norm, "eps", "gain"), plugin="p")
    assert comp.params["eps"].default == 1e-5 and comp.params["eps"].min == 0.0
    assert Registry().register("norm", "w0", wrapper, plugin="p").params == {}


def test_params_of_names_a_missing_parameter():
    with pytest.raises(RegistryError, match="Norm has no parameter 'nope'"):
        params_of(Norm, "nope")


def test_every_builtin_declares_each_parameter_once_and_agrees_with_its_factory(registry):
    """Every built-in parameter's default is the factory's own (one declaration, or two that agree)."""
    from abl.contracts.params import SUPPLIED

    for comp in registry.all():
        sig = inspect.signature(comp.factory)
        own = list(sig.parameters.values())[SUPPLIED[comp.axis]:]
        named = {p.name: p for p in own}
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in own)
        for key, param in comp.params.items():
            assert key in named or takes_kwargs, (comp.axis, comp.name, key)
            if key in named:
                default = named[key].default
                default = list(default) if isinstance(default, tuple) else default
                assert default == param.default and type(default) is type(param.default), (comp.name, key)


PLUGIN = '''
from typing import Annotated

import torch.nn as nn

from abl import Arg, Param, hookimpl


class Scaled(nn.Module):
    def __init__(self, dim, scale: Annotated[float, Arg("output scale", min=0.0)] = 1.0):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale


@hookimpl
def register_components(register):
    register("norm", "scaled_ok", Scaled)
    register("norm", "scaled_bad", Scaled, params={"scale": Param(2.0)})
'''


def test_abl_plugins_reports_a_disagreeing_plugin_in_one_line_without_a_traceback(tmp_path):
    from conftest import run_abl

    (tmp_path / "scaled_plugin.py").write_text(PLUGIN)
    r = run_abl(["--plugins-dir", str(tmp_path), "plugins"], cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr + r.stdout
    assert ("plugin 'file:scaled_plugin' registers norm 'scaled_bad': parameter 'scale': declared default 2.0, "
            "but the signature of Scaled says 1.0") in r.stderr
    (tmp_path / "scaled_plugin.py").write_text(PLUGIN.replace(', params={"scale": Param(2.0)}', ""))
    r = run_abl(["--plugins-dir", str(tmp_path), "plugins"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "scale: float = 1.0 - output scale" in r.stdout


def test_a_builtin_cost_function_that_restates_a_default_agrees_with_the_declaration(registry):
    """Cost functions are called with every resolved parameter, so a default they write is never used;
    where one is written anyway it must be the component's (a guard, not a second declaration)."""
    pairs = 0
    for comp in registry.all():
        if comp.cost is None:
            continue
        for p in inspect.signature(comp.cost).parameters.values():
            if p.name in comp.params and p.default is not inspect.Parameter.empty:
                pairs += 1
                want = comp.params[p.name].default
                assert type(p.default) is type(want) and p.default == want, (comp.axis, comp.name, p.name)
    assert pairs > 0  # the guard sees the restated defaults it is about
