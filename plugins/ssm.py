"""State-space mixers (axis ``mixer``). Registered by the SSM issue."""

from harness.hookspecs import hookimpl


@hookimpl
def register_components(register):
    pass
