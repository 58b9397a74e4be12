"""Checkpoints of a training run: everything needed to continue bit-for-bit.

Model, optimizer, precision policy, every RNG and every rank's data order,
and the step; written atomically (a temp file, then a rename), so a run killed
while saving keeps its previous checkpoint.

A checkpoint is data, never code: it is read with torch's safe loader
(``weights_only=True``), which builds tensors, numbers, strings, lists, tuples and
dicts and refuses anything else. Anyone who can write into a run folder can replace
``checkpoint.pt``; such a file is refused, never executed (the cell then starts over).
So everything saved here is of those plain types: the RNG states of numpy and Python
are stored as lists of ints (``FORMAT`` 2). A checkpoint of the older format (numpy's
state as an array) is refused the same way: its cell starts over.
"""

from __future__ import annotations

import os
import pickle
import stat
import sys
from pathlib import Path
from typing import Any

import torch

from .. import files
from ..contracts.precision import Precision
from ..data.corpus import Batches

# the layout of the saved dict; a checkpoint without it (or with another) is refused
FORMAT = 2


class CheckpointRefused(Exception):
    """The file is not a checkpoint this version can read safely (the cell starts over)."""


def save_checkpoint(path: Path, step: int, model, optimizer, precision: Precision,
                    data_states: list[torch.Tensor]) -> None:
    """Everything needed to continue bit-for-bit: written to a temp file, then renamed.

    ``data_states`` holds the data-order generator state of every rank.
    """
    state = {
        "format": FORMAT,
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "precision": precision.state_dict(),
        "data_rng": data_states,
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy_rng": _numpy_state(),
        "python_rng": _python_state(),
    }
    with files.replacing(path) as tmp:
        torch.save(state, tmp)


def _numpy_state() -> list[Any]:
    """numpy's global RNG state as plain values: [name, keys as ints, pos, has_gauss, cached_gaussian]."""
    import numpy as np

    name, keys, pos, has_gauss, cached = np.random.get_state()
    return [str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]


def _python_state() -> list[Any]:
    """Python's ``random`` state as plain values: [version, internal state as ints, gauss_next]."""
    import random

    version, internal, gauss_next = random.getstate()
    return [int(version), [int(x) for x in internal], gauss_next]


def read_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint at ``path`` read safely (data only), or ``CheckpointRefused`` saying why.

    A file that would need code to load (a crafted pickle, a checkpoint of an older
    format) is refused before any of it runs."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the reader for ever
            raise CheckpointRefused(f"{path.name} is not a regular file")
        state = torch.load(path, map_location="cpu", weights_only=True)
    except CheckpointRefused:
        raise
    except pickle.UnpicklingError as exc:
        first = (str(exc).strip().splitlines() or ["?"])[0]
        raise CheckpointRefused(f"{path.name} holds more than plain data (refused, not loaded: {first[:200]})") \
            from None
    except Exception as exc:  # noqa: BLE001 - a torn or foreign file: as good as none
        raise CheckpointRefused(f"{path.name} is not a readable checkpoint ({type(exc).__name__})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointRefused(f"{path.name} is not a checkpoint of format {FORMAT} (written by another "
                                "version of abl, or not a checkpoint)")
    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointRefused(f"{path.name} has no valid step")
    return state


def load_checkpoint(path: Path, model, optimizer, precision: Precision, batches: Batches, rank: int = 0) -> int:
    """Restore a checkpoint written by save_checkpoint; returns its step."""
    import random

    import numpy as np

    state = read_checkpoint(path)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    precision.load_state_dict(state["precision"])
    batches.gen.set_state(state["data_rng"][rank])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    name, keys, pos, has_gauss, cached = state["numpy_rng"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss_next = state["python_rng"]
    random.setstate((version, tuple(internal), gauss_next))
    return int(state["step"])


def checkpoint_step(path: Path) -> int | None:
    """The step of the checkpoint at ``path`` (None if there is none, or it is unreadable or refused:
    the cell then starts over; a refused file is named on stderr, the worker's log)."""
    if not path.exists():
        return None
    try:
        return int(read_checkpoint(path)["step"])
    except CheckpointRefused as exc:
        print(f"abl worker: {exc}; the cell starts from step 0", file=sys.stderr, flush=True)
        return None
