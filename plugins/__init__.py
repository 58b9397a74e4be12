"""Built-in variants, installed as ``abl.plugins``. Each module is an ordinary abl
plugin that imports only from ``abl``; ``abl.contracts.plugin_manager.DEFAULT_PLUGINS``
lists them and registers them exactly like a third-party entry point."""
