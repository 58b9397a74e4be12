import pytest

from abl.contracts.hookspecs import hookimpl
from abl.contracts.plugin_manager import build_registry, pm
from abl.contracts.registry import AXES, Param, Registry, RegistryError


def test_every_required_axis_and_builtin(registry):
    for axis in ("norm", "block", "position", "mixer", "ffn", "precision", "dataset"):
        assert axis in AXES
    expected = {
        "norm": {"layernorm", "rmsnorm", "scalenorm", "none"},
        "block": {"pre", "post", "sandwich", "post_branch"},
        "position": {"rope", "learned"},
        "mixer": {"mha"},
        "ffn": {"gelu", "swiglu"},
        "precision": {"fp32", "bf16"},
        "dataset": {"pystdlib", "text_file", "token_bin"},
    }
    for axis, names in expected.items():
        assert names <= set(registry.names(axis)), axis


def test_builtins_come_from_entry_points_of_the_abl_package(registry):
    comp = registry.get("norm", "rmsnorm")
    assert comp.plugin == "norms"
    assert comp.package == "abl"


def test_unknown_name_lists_valid_names_and_closest_match(registry):
    with pytest.raises(RegistryError) as err:
        registry.get("norm", "rmsnrom")
    msg = str(err.value)
    assert "layernorm" in msg and "scalenorm" in msg and "none" in msg
    assert "Closest match: 'rmsnorm'" in msg


def test_duplicate_name_names_both_plugins():
    class Dup:
        @hookimpl
        def register_components(self, register):
            register("norm", "rmsnorm", lambda dim: None)

    pm.register(Dup(), name="my-dup-plugin")
    try:
        with pytest.raises(RegistryError) as err:
            build_registry()
        msg = str(err.value)
        assert "'norms'" in msg and "'my-dup-plugin'" in msg and "rmsnorm" in msg
    finally:
        pm.unregister(name="my-dup-plugin")


def test_in_process_plugin_adds_a_component():
    class Extra:
        @hookimpl
        def register_components(self, register):
            register("norm", "test_only_norm", lambda dim, alpha=0.5: None, params={"alpha": 0.5})

    pm.register(Extra(), name="extra")
    try:
        reg = build_registry()
        comp = reg.get("norm", "test_only_norm")
        assert comp.plugin == "extra"
        assert comp.params["alpha"].resolved_type() is float
    finally:
        pm.unregister(name="extra")
    assert "test_only_norm" not in build_registry().names("norm")


def test_unknown_axis_is_rejected():
    reg = Registry()
    with pytest.raises(RegistryError, match="unknown axis"):
        reg.register("optimiser", "sgd", object, plugin="p")


@pytest.mark.parametrize("param,value,ok", [
    (Param(1e-5), 1, True),           # int is accepted for float
    (Param(1e-5), True, False),       # bool is not a number here
    (Param(3), 2.5, False),
    (Param(True), 1, False),
    (Param("a", choices=("a", "b")), "c", False),
    (Param(2, min=1), 0, False),
    (Param(2, max=4), 4, True),
])
def test_param_type_and_range_checks(param, value, ok):
    assert (param.check("x", value) == []) is ok


def test_resolve_params_fills_defaults_and_rejects_unknown_keys(registry):
    comp = registry.get("norm", "layernorm")
    params, errs = comp.resolve_params({"eps": 1e-6}, "norm.layernorm")
    assert errs == [] and params["eps"] == 1e-6 and params["bias"] is True
    _, errs = comp.resolve_params({"epsilon": 1e-6}, "norm.layernorm")
    assert len(errs) == 1 and "did you mean 'eps'" in errs[0]
