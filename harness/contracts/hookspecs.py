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
def register_executors(register):
    """Register executors: where ``abl run`` runs its cells (``abl run --executor NAME``).

    Call ``register(name, factory, doc=...)`` once per executor:

    - ``name``: unique among executors (the built-ins: local, slurm, ray); a second plugin
      registering it is an error naming both; it is also ``--executor``'s choice;
    - ``factory``: ``factory(options) -> abl.run.executors.Executor``; ``options`` is an
      ``abl.run.executors.ExecutorOptions`` (``workers``, ``runs_dir``, the Slurm and Ray options);
    - ``doc``: one line for ``abl plugins``.

    An executor subclasses ``abl.run.executors.Executor`` (``launch``, ``poll``, ``stop``) and declares its
    capabilities as attributes instead of being probed: ``local`` (its cells run on this machine, so the
    memory admission, thread choice and compile-payback notes apply), ``slots`` (cells at once),
    ``use_gpus`` and ``free_gpus``.
    """


@hookspec
def register_metrics(register):
    """Declare metrics for the metric catalogue (abl.analysis.metrics), the one source of every table's
    label, unit, direction and final value.

    Call ``register(name, label=..., unit=..., kind=..., final=..., better=..., across_tokenizers=...,
    description=..., shown=...)`` once per metric (or ``register(entry)`` with an
    ``abl.analysis.metrics.Metric`` or ``Family``):

    - ``name``: the name a run logs (a metric row of metrics.jsonl); unique among metrics, a second
      plugin declaring it is an error naming both;
    - ``unit``: how its values are shown (``bytes``, ``s``, ``tokens/s``, ``fraction``, any text);
    - ``kind``: loss, speed, memory, cost, accuracy, health or other;
    - ``final``: which aggregate of a run's rows is its final value: last, median or max;
    - ``better``: lower, higher or none;
    - ``shown``: True to show it by default (``abl.analysis.metrics.shown_by_default``).

    Declaring a metric does not log it: a run logs it (a post-training evaluation, ``register_evaluations``).
    Readers of the store (``abl compare``, ``abl report``, the dashboard) load this hook without the
    torch-importing built-ins, so a module that declares metrics should import little.
    """


@hookspec
def register_evaluations(register):
    """Register post-training evaluations: named steps run once on the trained model (abl.train.evaluations).

    Call ``register(name, fn, metrics=(...), doc=...)`` once per evaluation:

    - ``name``: unique among evaluations; also its switch ``eval.<name>`` where
      ``abl.contracts.config.EvalConfig`` has that field (an evaluation without one runs in every cell);
    - ``fn``: ``fn(run: abl.train.evaluations.TrainedRun) -> (metrics, notes)``: a dict of float metrics,
      logged at the last step, and a list of notes for what it could not measure; an exception becomes
      a note, never a failed run;
    - ``metrics``: every name it may record (declare them with ``register_metrics`` for a unit).
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
