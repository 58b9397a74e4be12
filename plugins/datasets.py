"""Datasets (axis ``dataset``). Every factory is ``factory(**params)`` -> TokenData.

``pystdlib`` is the embedded default: real text that needs no download, the
Python source of the standard library of the interpreter running abl. Its
fingerprint (stored with every run) changes with the Python version.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

from abl import DataError, Param, from_documents, from_text_file, from_token_bin, hookimpl

_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def python_stdlib(max_bytes: int = 8_000_000, val_fraction: float = 0.1):
    """Byte-level Python standard-library source; whole files split train/val by name hash."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs, total = [], 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _SKIP_DIRS.intersection(rel.parts[:-1]):
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if total + len(data) > max_bytes:
            continue
        docs.append((rel.as_posix(), data))
        total += len(data)
    if not docs:
        raise DataError(f"no Python source found under the standard library ({sys.version.split()[0]})")
    v = sys.version_info
    return from_documents(docs, val_fraction,
                          f"Python {v.major}.{v.minor}.{v.micro} stdlib source, "
                          f"{len(docs)} files, {total} bytes")


def text_file(path: str = "", val_fraction: float = 0.1):
    """Any local text file, byte-level; the last val_fraction of it is validation."""
    if not path:
        raise DataError("dataset text_file needs a path: [dataset.text_file] path = \"corpus.txt\"")
    return from_text_file(path, val_fraction)


def token_bin(path: str = "", val_path: str = "", vocab_size: int = 0, val_fraction: float = 0.1):
    """Pre-tokenised uint16 .bin (nanoGPT format); val from val_path or the tail of path."""
    if not path:
        raise DataError("dataset token_bin needs a path: [dataset.token_bin] path = \"train.bin\"")
    return from_token_bin(path, vocab_size, val_path, val_fraction)


@hookimpl
def register_components(register):
    frac = Param(0.1, doc="share of the data held out for validation", min=0.001, max=0.9)
    register("dataset", "pystdlib", python_stdlib, params={
        "max_bytes": Param(8_000_000, doc="stop adding files past this many bytes", min=10_000),
        "val_fraction": frac,
    })
    register("dataset", "text_file", text_file, params={
        "path": Param("", doc="path of a UTF-8 (or any byte) text file"),
        "val_fraction": frac,
    })
    register("dataset", "token_bin", token_bin, params={
        "path": Param("", doc="flat uint16 token file (train, or all if val_path is empty)"),
        "val_path": Param("", doc="optional separate validation token file"),
        "vocab_size": Param(0, doc="0 = max token id + 1", min=0),
        "val_fraction": frac,
    })
