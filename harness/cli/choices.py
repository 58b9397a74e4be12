"""Click choices read from a plugin registry as they are needed, so ``abl --help`` loads no plugin."""

from __future__ import annotations

import click


class ExecutorChoice(click.Choice):
    """``--executor``'s choices: every executor the plugins register (abl.run.executors.registered), the
    built-ins and those of ``--plugins-dir`` (an eager option, so its folders are known before this converts)."""

    def __init__(self) -> None:
        super().__init__(["local", "slurm", "ray"])  # the built-ins, until the registry is read
        self._read = False

    def _load(self) -> None:
        if self._read:
            return
        from ..contracts.plugin_manager import PluginLoadError
        from ..contracts.registry import RegistryError
        from ..run.executors import registered

        try:
            self.choices = tuple(registered())
        except (PluginLoadError, RegistryError) as exc:
            raise click.UsageError(str(exc)) from exc
        self._read = True

    def convert(self, value, param, ctx):
        self._load()
        return super().convert(value, param, ctx)
