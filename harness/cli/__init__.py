"""The ``abl`` command line: the group, and one module per command with its options beside its body.

Each command module (run, plugins, ingest, dashboard, cost, report, compare,
ladder, bench, selftest) declares its click command (arguments, options, help) above
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

from . import bench, compare, cost, dashboard, ingest, ladder, plugins, report, run, selftest, usage
from .common import fail, plugins_dir_option, user_errors


class AblGroup(click.Group):
    """Built-in commands are listed eagerly; plugin commands load on first use. A misplaced option
    (before its command, on another command, ``KEY=VALUE`` as two words) is one message saying
    where it goes (abl.cli.usage), exit status 2."""

    _plugins_loaded = False

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, list(args))
        except click.NoSuchOption as exc:
            raise usage.before_the_command(self, ctx, args, exc) from None

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None and name is not None:
            problem = usage.two_words(name, cmd, rest)
            if problem is not None:
                raise problem
        return name, cmd, rest

    def main(self, *args, **kwargs):
        """Every command loads its plugins under the time limit of abl.run.guard (``ABL_PLUGIN_TIMEOUT``,
        ``abl run --plugin-timeout``): a plugin whose import or registration never returns stops the command
        with exit 2 naming the plugin file and line, not a hang."""
        from ..contracts.plugin_manager import set_guard
        from ..run import guard

        set_guard(guard.time_limit)
        return super().main(*args, **kwargs)

    def invoke(self, ctx: click.Context):
        from ..run import guard

        if guard.env_timeout_problem():
            fail(guard.env_timeout_problem())
        try:
            return super().invoke(ctx)
        except guard.PluginTimeout as exc:  # loading the plugins, or plugin code a command runs (abl run says so itself)
            fail(str(exc))
        except click.NoSuchOption as exc:
            if exc.ctx is None or exc.ctx.parent is not ctx:
                raise
            raise usage.of_another_command(self, ctx, exc) from None
        finally:  # abl run --plugin-timeout sets it as its options are read; a caller in this process gets the default
            guard.set_plugin_timeout(guard.DEFAULT_PLUGIN_TIMEOUT_S)

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name)
        if cmd is None and not AblGroup._plugins_loaded:
            AblGroup._plugins_loaded = True
            from ..contracts.plugin_manager import load_plugins
            from ..run.guard import time_limit

            try:
                plugins = load_plugins()
                with time_limit("the plugins' register_commands hooks (looking for a command abl does not have)"):
                    plugins.hook.register_commands(cli=self)
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
for _module in (run, plugins, ingest, dashboard, cost, report, compare, ladder, bench, selftest):
    cli.add_command(_module.command)


def main() -> None:
    cli(prog_name="abl")
