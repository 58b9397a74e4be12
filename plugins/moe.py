"""Mixture-of-Experts FFNs (axis ``ffn``). Registered by the FFN/MoE issue."""

from harness.hookspecs import hookimpl


@hookimpl
def register_components(register):
    pass
