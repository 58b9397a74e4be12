"""Grid-file text: TOML parsing (with positions in its errors) and ``--set KEY=VALUE`` overrides."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from ..contracts.config import ConfigError


def parse_toml_text(text: str, source: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+), column (\d+)", str(exc))
        where = f"{source}:{m.group(1)}:{m.group(2)}" if m else source
        raise ConfigError(f"{where}: TOML syntax error: {exc}") from None


def read_toml(path: str | Path) -> dict:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    return parse_toml_text(text, str(path))


def parse_value(text: str) -> Any:
    """An override value is a TOML literal (1, 2.5, true, "x", [1, 2]); bare words are strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(raw: dict, path: str, value: Any) -> None:
    """Set a dotted path; under ``grid.`` the rest is one grid key (``grid.model.norm``)."""
    parts = path.split(".")
    if parts[0] == "grid" and len(parts) > 2:
        parts = ["grid", ".".join(parts[1:])]
    node = raw
    for part in parts[:-1]:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {path}: {part!r} is not a table")
        node = nxt
    node[parts[-1]] = value


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    out = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set model.d_model=64")
        key, _, val = item.partition("=")
        key = key.strip()
        if not key or any(not p for p in key.split(".")):
            raise ConfigError(f"--set {item!r}: bad key {key!r}")
        out.append((key, parse_value(val.strip())))
    return out
