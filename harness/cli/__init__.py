"""The ``abl`` command line: the group, and one module per command with its options beside its body.

Each command module (run, plugins, ingest, dashboard, cost, report, compare,
bench, selftest) declares its click command (arguments, options, help) above
the use case it runs: resolve the workspace (abl.store.workspace), run or
read, and hand plain data to abl.present. What they share (``--plugins-dir``,
user errors as exit status 2, the store's lock) is in common. Imports stay
lazy so ``abl --help`` does not load torch. The top layer: may import every
layer of ``abl`` below it (run, bench, present, store, the dashboard, ...);
nothing imports it. Plugins add commands through the ``register_commands``
hook, loaded on first use.
"""

from __future__ import annotations

import click

from . import bench, compare, cost, dashboard, ingest, plugins, report, run, selftest
from .common import fail, plugins_dir_option, user_errors


class AblGroup(click.Group):
    """Built-in commands are listed eagerly; plugin commands load on first use."""

    _plugins_loaded = False

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name)
        if cmd is None and not AblGroup._plugins_loaded:
            AblGroup._plugins_loaded = True
            from ..contracts.plugin_manager import load_plugins

            try:
                load_plugins().hook.register_commands(cli=self)
            except user_errors() as exc:
                fail(str(exc))
            cmd = super().get_command(ctx, name)
        return cmd


@click.group(cls=AblGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="abl")
@plugins_dir_option
def cli():
    """abl: ablations of decoder-only LM architectures, on your data and hardware.

    Run a grid of small training runs (abl run GRID.toml), list the variants
    (abl plugins), and compare results (abl dashboard).
    """


# in the order `abl --help` lists them (click sorts them by name)
for _module in (run, plugins, ingest, dashboard, cost, report, compare, bench, selftest):
    cli.add_command(_module.command)


def main() -> None:
    cli(prog_name="abl")
