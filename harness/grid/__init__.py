"""Grid files to validated cells: parsing, overrides, expansion, selection, labels.

A grid file's TOML is read, overridden and expanded into fully resolved cells
with stable run ids (gridfile); ``--only``/``--cells`` select among them
(selection); the display label of each cell is computed from the settings that
differ between the cells shown (labels). May import ``abl.model`` and the layers
below it.
"""
