"""The Triton kernel set: one module per op, its torch reference beside it.

Which path the ops take is a ``KernelBackend``: "triton" (the kernels) or
"torch" (the references). A run resolves one from ``train.kernels`` and its
device with ``resolve`` ("auto": triton on CUDA, torch elsewhere); the model
owns it (``DecoderLM.kernel_backend``) and activates it for the duration of
each forward. Ops and plugins ask ``use_triton()`` (the active backend) and
import the op's public function lazily, e.g.

    if use_triton():
        from abl.kernels.rmsnorm import rmsnorm
        return rmsnorm(x, self.weight, self.bias, self.eps)

Outside any activation (a module called on its own, a test) the torch path
runs. Modules (each: Triton kernels, launchers, autograd.Function, public
function with a shape docstring, torch reference): rmsnorm, layernorm, rope,
swiglu (swiglu, geglu), cross_entropy (cross_entropy, linear_cross_entropy),
flash_attention, ssd_scan; utils holds the optional triton import. On CPU the
kernels run only in the Triton interpreter (TRITON_INTERPRET=1 set before
triton is imported), which is how the tests exercise them.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any, Iterator

BACKENDS = ("triton", "torch")

# The widest head (last dim of q, k and v) flash_attention takes: its tiles hold a whole
# head row in on-chip memory (next power of two of the head dim).
FLASH_ATTENTION_MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class KernelBackend:
    """Which implementation the ops take: ``name`` "triton" or "torch".

    ``interpreted`` is True when the Triton kernels run in the Triton
    interpreter on CPU tensors (a correctness path, not a fast one).
    """

    name: str
    interpreted: bool = False

    def __post_init__(self) -> None:
        if self.name not in BACKENDS:
            raise ValueError(f"kernel backend must be 'triton' or 'torch', got {self.name!r}")
        if self.interpreted and self.name != "triton":
            raise ValueError("only the triton backend can be interpreted")

    @property
    def triton(self) -> bool:
        return self.name == "triton"

    @contextlib.contextmanager
    def activate(self) -> Iterator[KernelBackend]:
        """This backend inside the block (what ``use_triton()`` answers), the previous one after it."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)


TORCH = KernelBackend("torch")

# a context variable, not a module global: each thread (nn.DataParallel replicas)
# and each activation sees its own model's backend
_ACTIVE: contextvars.ContextVar[KernelBackend] = contextvars.ContextVar("abl_kernel_backend", default=TORCH)


def active() -> KernelBackend:
    """The backend of the forward running now (``TORCH`` outside any model's forward)."""
    return _ACTIVE.get()


def use_triton() -> bool:
    """True when the ops should call the Triton kernels: the active backend is triton."""
    return _ACTIVE.get().name == "triton"


def resolve(kernels: str, device: Any) -> KernelBackend:
    """The backend for ``train.kernels`` ("auto", "triton", "torch") on ``device``.

    "auto" is triton on CUDA only. Triton on CPU switches the Triton
    interpreter on, and is an error when that is no longer possible (triton
    was imported without it). ``device``: a ``torch.device`` or its type name.
    """
    if kernels not in ("auto", *BACKENDS):
        raise ValueError(f"train.kernels must be 'auto', 'triton' or 'torch', got {kernels!r}")
    kind = getattr(device, "type", None) or str(device).partition(":")[0]
    name = kernels if kernels != "auto" else ("triton" if kind == "cuda" else "torch")
    if name == "torch":
        return TORCH
    interpreted = kind == "cpu"
    if interpreted and not enable_interpreter():
        raise ValueError("train.kernels = \"triton\" on CPU needs the Triton interpreter, but triton was "
                         "imported in this process before it could be switched on; set TRITON_INTERPRET=1 "
                         "in the environment, or use train.kernels = \"torch\"")
    return KernelBackend("triton", interpreted=interpreted)


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
