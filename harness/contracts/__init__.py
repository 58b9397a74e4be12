"""The plugin-facing contracts: what a component is and how it is registered.

The registry ((axis, name) -> factory, typed parameters, cost function, reference) and
the reading of a factory's signature as its parameters' one declaration (params),
the pluggy hook specifications and the plugin manager that loads the built-ins and
third-party entry points the same way, the typed configs a grid file resolves to
(``ModelConfig`` and friends, ``Cell``, the resolved config's shapes and run-id
hashing), the cost conventions
(``Cost``) and the precision policy base class. This is the floor a plugin stands
on: it may import only ``abl.kernels`` and the standard library, torch and pluggy.
"""
