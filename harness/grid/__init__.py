"""Grid files to validated cells: parsing, overrides, expansion, selection, labels.

A grid file's TOML is read and overridden (parsing), checked and resolved cell
by cell (validation), and expanded into fully resolved cells with stable run ids
(gridfile); ``--only``/``--cells`` select among them (selection); every label,
the grid's stored one and the display ones built from the settings that differ
between the cells shown, is computed in labels. May import ``abl.model`` and the
layers below it.
"""
