"""Checkpoints of a training run: everything needed to continue bit-for-bit.

Model, optimizer, precision policy, every RNG and every rank's data order,
and the step; written atomically (a temp file, then a rename), so a run killed
while saving keeps its previous checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .. import files
from ..contracts.precision import Precision
from ..data.corpus import Batches


def save_checkpoint(path: Path, step: int, model, optimizer, precision: Precision,
                    data_states: list[torch.Tensor]) -> None:
    """Everything needed to continue bit-for-bit: written to a temp file, then renamed.

    ``data_states`` holds the data-order generator state of every rank.
    """
    import random

    import numpy as np

    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "precision": precision.state_dict(),
        "data_rng": data_states,
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy_rng": np.random.get_state(),
        "python_rng": random.getstate(),
    }
    with files.replacing(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: Path, model, optimizer, precision: Precision, batches: Batches, rank: int = 0) -> int:
    """Restore a checkpoint written by save_checkpoint; returns its step."""
    import random

    import numpy as np

    state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    precision.load_state_dict(state["precision"])
    batches.gen.set_state(state["data_rng"][rank])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    np.random.set_state(state["numpy_rng"])
    random.setstate(state["python_rng"])
    return int(state["step"])


def checkpoint_step(path: Path) -> int | None:
    """The step of the checkpoint at ``path`` (None if there is none or it is unreadable)."""
    if not path.exists():
        return None
    try:
        return int(torch.load(path, map_location="cpu", weights_only=False)["step"])
    except Exception:  # noqa: BLE001 - a torn checkpoint is as good as none
        return None

