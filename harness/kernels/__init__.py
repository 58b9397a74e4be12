"""The Triton kernel set: one module per op, its torch reference beside it.

Which path the plugins take is a process-wide choice made by the trainer from
``train.kernels``: "triton" (the kernels), "torch" (the references), "auto"
(triton on CUDA, torch elsewhere). Plugins ask ``backend()`` / ``use_triton()``
and import the op's public function lazily, e.g.

    if use_triton():
        from abl.kernels.rmsnorm import rmsnorm
        return rmsnorm(x, self.weight, self.bias, self.eps)

Modules (each: Triton kernels, launchers, autograd.Function, public function
with a shape docstring, torch reference): rmsnorm, layernorm, rope, swiglu
(swiglu, geglu), cross_entropy (cross_entropy, linear_cross_entropy),
flash_attention, ssd_scan; utils holds the optional triton import. On CPU the
kernels run only in the Triton interpreter (TRITON_INTERPRET=1 set before
triton is imported), which is how the tests exercise them.
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


class using:
    """Context manager: the given backend inside the block, the previous one after it."""

    def __init__(self, name: str):
        self.name, self.previous = name, None

    def __enter__(self):
        self.previous = _BACKEND
        set_backend(self.name)
        return self

    def __exit__(self, *exc):
        set_backend(self.previous)
        return False


def use_triton() -> bool:
    """True when the plugins should call the Triton kernels (``train.kernels`` resolved to triton)."""
    return _BACKEND == "triton"


def enable_interpreter() -> bool:
    """Make Triton kernels runnable on CPU tensors by switching on its interpreter.

    Must happen before triton is imported (it decides once). Returns True when
    the interpreter is (now) on; False when triton was already imported without
    it, so the kernels cannot run on CPU in this process.
    """
    import os
    import sys

    if os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes"):
        return True
    if "triton" in sys.modules:
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    return True


# op -> (module, public function, torch reference). Imports stay lazy: importing
# this package imports neither torch nor triton, so ``abl --help`` stays fast and a
# test process can set TRITON_INTERPRET=1 before triton is imported.
OPS: dict[str, tuple[str, str, str]] = {
    "rmsnorm": ("rmsnorm", "rmsnorm", "rmsnorm_reference"),
    "layernorm": ("layernorm", "layernorm", "layernorm_reference"),
    "rope": ("rope", "rope", "rope_reference"),
    "swiglu": ("swiglu", "swiglu", "swiglu_reference"),
    "geglu": ("swiglu", "geglu", "geglu_reference"),
    "cross_entropy": ("cross_entropy", "cross_entropy", "cross_entropy_reference"),
    "linear_cross_entropy": ("cross_entropy", "linear_cross_entropy", "linear_cross_entropy_reference"),
    "flash_attention": ("flash_attention", "flash_attention", "attention_reference"),
    "ssd_scan": ("ssd_scan", "ssd_scan", "ssd_chunked"),
}


def load(op: str):
    """(triton function, torch reference) of an op, importing its module."""
    import importlib

    module, fn, ref = OPS[op]
    mod = importlib.import_module(f"{__name__}.{module}")
    return getattr(mod, fn), getattr(mod, ref)
