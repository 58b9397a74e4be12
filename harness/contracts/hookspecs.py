"""The pluggy hook specifications of abl (project name ``"abl"``).

A plugin is any module or object with functions decorated by ``hookimpl``.
The host owns every registry; a plugin only calls the callbacks it is handed.
pluggy lets an implementation accept fewer arguments than its spec, so specs
can grow without breaking plugins.

Every hook here must be documented in docs/plugins.md ("Hooks");
``tests/test_docs.py`` fails otherwise.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("abl")
hookimpl = pluggy.HookimplMarker("abl")


@hookspec
def register_components(register):
    """Register model, training and data components.

    Call ``register(axis, name, factory, params=..., doc=..., cost=...,
    reference=..., check=..., width=..., own_init=...)`` once per component:

    - ``axis``: one of ``abl.contracts.registry.AXES`` (norm, block, position, mixer,
      ffn, precision, dataset);
    - ``name``: unique within the axis; a second plugin registering the same
      (axis, name) is an error naming both plugins;
    - ``factory``: a callable that builds the component; its signature depends
      on the axis (see ``abl.contracts.registry.AXES``);
    - ``params``: mapping of parameter name to a default value (the type is
      inferred from it) or to a ``abl.contracts.registry.Param`` for ranges,
      choices and docs. Configs are validated against it before training;
    - ``cost``: optional analytic cost function (parameters, FLOPs, memory);
    - ``reference``: optional plain reference implementation used by tests;
    - ``check``: optional ``check(model_config, params) -> list[str]`` that
      returns cross-axis incompatibilities (e.g. head dims) as messages;
    - ``width``: the name of the float parameter that is the component's
      width knob (an FFN's hidden size / d_model), the one ``train.match_by =
      "ffn"`` turns to meet a budget;
    - ``own_init``: True keeps the weights the factory's module set (the
      skeleton's init skips it; ``abl.own_init(module)`` does so for one submodule).

    A ``cost`` or ``check`` function that names a ``position`` parameter is
    handed the configured position's class (``Registry.call_with_position``).
    """


@hookspec
def register_recipes(register):
    """Register architecture recipes (``model.recipe = "NAME"``; abl.contracts.recipes).

    Call ``register(name, settings, doc=..., gaps=...)`` once per recipe:

    - ``name``: unique among recipes; a second plugin registering it is an error naming both;
    - ``settings``: a sequence of ``abl.Setting(path, value, source)``: a dotted grid path
      (``model.norm``, ``mixer.mha.n_kv_heads``), its value (or an ``abl.Scaled`` function of the
      cell's model config, for a head layout or a window) and the paper section or official config
      file that gives it. A recipe never sets the size (``model.d_model``, ``n_layers``, ``n_heads``,
      ``context``); the grid does;
    - ``doc``: one line naming the family and its primary source;
    - ``gaps``: what the family has that no registered component expresses, or where the recipe
      departs from it (a scaled-down expert count), one line each.

    Resolution order: defaults < recipe < grid file < ``--set``.
    """


@hookspec
def register_commands(cli):
    """Add click commands to the ``abl`` command group.

    ``cli`` is the top-level ``click.Group``; call ``cli.command()`` or
    ``cli.add_command(...)``. Plugin commands are loaded on first use, so
    ``abl --help`` stays fast and lists only the built-in commands.
    """


@hookspec
def run_finished(run_id, status, config, summary):
    """Called in the ``abl run`` parent after a cell ends and is stored.

    ``status`` is the final status ("completed", "diverged", "failed", ...),
    ``config`` the fully resolved cell config (a dict, each component as
    ``config["components"][axis] = {"name", "params"}``, as the store keeps it) and ``summary`` a dict of
    the once-per-run metrics. Use it for notifications or extra bookkeeping;
    the return value is ignored.
    """
