"""Which runs a page looks at (``Selection``), as a SQL boolean with bound parameters.

User choices reach SQL only as bound parameters. JSON paths into
``runs.config`` are bound parameters too, and also validated against
``PATH_RE``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# A JSON path into runs.config: $.model.norm, $.components.norm.params.eps, $.a[0].b
PATH_RE = re.compile(r"^\$(\.[A-Za-z_][A-Za-z0-9_]*|\[[0-9]+\])+$")


# ---------------------------------------------------------------- selection


@dataclass(frozen=True)
class Selection:
    """Which runs a page looks at; every field is optional (empty = no filter)."""

    experiments: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    # (JSON path, allowed values); None among the values matches runs without the key
    axes: tuple[tuple[str, tuple[str | None, ...]], ...] = ()
    cells: tuple[str, ...] = ()

    def where(self, alias: str = "r") -> tuple[str, list[Any]]:
        """A SQL boolean over ``runs AS alias`` and its parameters."""
        clauses: list[str] = ["TRUE"]
        params: list[Any] = []
        if self.experiments:
            clauses.append(f"{alias}.experiment IN (SELECT unnest(?::VARCHAR[]))")
            params.append(list(self.experiments))
        if self.statuses:
            clauses.append(f"{alias}.status IN (SELECT unnest(?::VARCHAR[]))")
            params.append(list(self.statuses))
        for path, values in self.axes:
            check_path(path)
            present = [v for v in values if v is not None]
            expr = f"json_extract_string({alias}.config, ?)"
            parts = []
            if present:
                parts.append(f"{expr} IN (SELECT unnest(?::VARCHAR[]))")
                params += [path, present]
            if len(present) < len(values):
                parts.append(f"{expr} IS NULL")
                params.append(path)
            clauses.append("(" + (" OR ".join(parts) or "FALSE") + ")")
        if self.cells:
            clauses.append(f"{alias}.cell_key IN (SELECT unnest(?::VARCHAR[]))")
            params.append(list(self.cells))
        return " AND ".join(clauses), params


def check_path(path: str) -> str:
    if not isinstance(path, str) or not PATH_RE.match(path):
        raise ValueError(f"not a config path: {path!r}")
    return path


def axis_label(path: str) -> str:
    """``$.components.norm.params.eps`` -> ``norm.eps``; ``$.model.norm`` -> ``model.norm``."""
    p = path[2:] if path.startswith("$.") else path
    parts = p.split(".")
    if len(parts) >= 4 and parts[0] == "components" and parts[2] == "params":
        return ".".join([parts[1], *parts[3:]])
    return p
