"""The shipped grid files (``*.toml``), installed as package data of ``abl.ablations``.

``abl run norms`` (or ``ablations/norms.toml`` where no such file exists in the
working folder) finds them here; see ``abl.config.resolve_grid_path``.
"""
