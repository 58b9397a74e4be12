"""Grid-file text: TOML parsing (with positions in its errors) and ``--set KEY=VALUE`` overrides."""

from __future__ import annotations

import errno
import os
import re
import stat
import tomllib
from pathlib import Path
from typing import Any

from ..contracts.config import ConfigError

# a grid file is a page of TOML; anything this large is not one (and /dev/zero never ends)
MAX_GRID_BYTES = 4 * 2**20


def parse_toml_text(text: str, source: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+), column (\d+)", str(exc))
        where = f"{source}:{m.group(1)}:{m.group(2)}" if m else source
        raise ConfigError(f"{where}: TOML syntax error: {exc}") from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise ConfigError(f"{source}: TOML nested too deeply (arrays or inline tables inside each other "
                          "hundreds of levels down); a grid file needs a few levels at most") from None


def read_toml(path: str | Path) -> dict:
    """A grid file's tables. Only a regular file of at most MAX_GRID_BYTES is read: a device
    (/dev/zero), a FIFO or a folder is refused by its type before a byte is read, and a
    symbolic link that resolves to nothing is named as one."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        if os.path.islink(p):
            raise ConfigError(f"{path}: a symbolic link whose target does not exist") from None
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{path}: a loop of symbolic links (it never reaches a file)") from None
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{path}: not a regular file ({_file_kind(st.st_mode)}); a grid file is a TOML text file")
    if st.st_size > MAX_GRID_BYTES:
        raise ConfigError(f"{path}: {st.st_size:,} bytes is too large for a grid file "
                          f"(at most {MAX_GRID_BYTES // 2**20} MiB)")
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_GRID_BYTES + 1)  # a file that grows while read is still bounded
        if len(data) > MAX_GRID_BYTES:
            raise ConfigError(f"{path}: more than {MAX_GRID_BYTES // 2**20} MiB; too large for a grid file")
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    return parse_toml_text(text, str(path))


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a plain file"


def parse_value(text: str) -> Any:
    """An override value is a TOML literal (1, 2.5, true, "x", [1, 2]); bare words are strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:
        raise ConfigError(f"--set value nested too deeply: {text[:40]}...") from None


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
