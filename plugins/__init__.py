"""Built-in variants. Each module is an ordinary abl plugin, declared as an
entry point in group "abl" in pyproject.toml exactly like a third-party one."""
