"""The Triton kernel set: one module per op, its torch reference beside it.

Which path the plugins take is a process-wide choice made by the trainer from
``train.kernels``: "triton" (the kernels), "torch" (the references), "auto"
(triton on CUDA, torch elsewhere). Plugins ask ``backend()``.
"""

from __future__ import annotations

_BACKEND = "torch"


def set_backend(name: str) -> None:
    if name not in ("triton", "torch"):
        raise ValueError(f"kernel backend must be 'triton' or 'torch', got {name!r}")
    global _BACKEND
    _BACKEND = name


def backend() -> str:
    return _BACKEND
