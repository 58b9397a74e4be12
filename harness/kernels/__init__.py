"""The Triton kernel set: one module per op, its torch reference beside it.

Which path the ops take is a ``KernelBackend``: "triton" (the kernels) or
"torch" (the references), and per op ``torch_ops`` (ops a triton backend sends
to their reference). A run resolves one from ``train.kernels`` and its device
with ``resolve`` ("auto": on CUDA the triton backend with each op on the faster
verified path for the run's shapes, measured once and cached (autoselect);
torch elsewhere); the model owns it (``DecoderLM.kernel_backend``) and
activates it for the duration of each forward.

Each op chooses its path itself: ``<op>`` asks ``use_triton()`` (the active
backend) and calls ``<op>_triton`` (the Triton kernels) or ``<op>_reference``
(the plain torch definition, the ground truth in tests). A component calls
the op and keeps no copy of its math, e.g.

    from abl.kernels.rmsnorm import rmsnorm
    ...
    def forward(self, x):
        return rmsnorm(x, self.weight, self.bias, self.eps)

Outside any activation (a module called on its own, a test) the torch path
runs. Modules (each: Triton kernels, launchers, custom-op registration and autograd, the
``_triton`` function with a shape docstring, the torch reference, the op):
rmsnorm, layernorm, rope, swiglu (swiglu, geglu), cross_entropy
(cross_entropy, linear_cross_entropy), flash_attention, ssd_scan; utils holds
the optional triton import. On CPU the kernels run only in the Triton
interpreter (TRITON_INTERPRET=1 set before triton is imported), which is how
the tests exercise them.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from pathlib import Path
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
    # ops that take their torch reference although the backend is triton: ``auto`` on a device
    # where the reference measured faster, or where the kernel is not verified (abl.kernels.autoselect)
    torch_ops: frozenset[str] = frozenset()
    # what ``auto`` chose per op and why (abl.kernels.autoselect.Choice.as_json); not part of equality
    choices: tuple[dict[str, Any], ...] = field(default=(), compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.name not in BACKENDS:
            raise ValueError(f"kernel backend must be 'triton' or 'torch', got {self.name!r}")
        if self.interpreted and self.name != "triton":
            raise ValueError("only the triton backend can be interpreted")

    @property
    def triton(self) -> bool:
        return self.name == "triton"

    @property
    def key(self) -> str:
        """The backend as cached measurements (memory, step times) must tell it apart: its name, and
        the ops it routes to torch (an ``auto`` run's figures are not a pure triton run's)."""
        if not self.triton or not self.torch_ops:
            return self.name
        return f"{self.name}-torch:{','.join(sorted(self.torch_ops))}"

    def info(self) -> dict[str, Any]:
        """What a run records of the per-op routing (its info.json): {} unless some op goes to torch
        or ``auto`` made choices."""
        if not self.torch_ops and not self.choices:
            return {}
        return {"kernel_torch_ops": sorted(self.torch_ops), "kernel_choices": [dict(c) for c in self.choices]}

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


def use_triton(op: str | None = None) -> bool:
    """True when the ops should call the Triton kernels: the active backend is triton (and,
    given ``op``, e.g. "ssd_scan", that op is not one the backend routes to its reference)."""
    backend = _ACTIVE.get()
    return backend.name == "triton" and (op is None or op not in backend.torch_ops)


def resolve(kernels: str, device: Any, workload: Any = None, cache_dir: Path | None = None,
            log: Any = None) -> KernelBackend:
    """The backend for ``train.kernels`` ("auto", "triton", "torch") on ``device``.

    "auto" is torch off CUDA. On CUDA it is the triton backend routing each op to the faster
    verified path for ``workload`` (an ``abl.kernels.autoselect.Workload``: the shapes the run
    will call the ops at), measured once per device, versions and shape class and cached in
    ``cache_dir`` (the store's shape-cache folder; None: not cached); the ops that lost, failed
    verification or were not measured go to torch (``torch_ops``). Without a workload nothing is
    measured, so every op goes to torch. Triton on CPU switches the Triton interpreter on, and is
    an error when that is no longer possible (triton was imported without it). ``device``: a
    ``torch.device`` or its type name.
    """
    if kernels not in ("auto", *BACKENDS):
        raise ValueError(f"train.kernels must be 'auto', 'triton' or 'torch', got {kernels!r}")
    kind = getattr(device, "type", None) or str(device).partition(":")[0]
    name = kernels if kernels != "auto" else ("triton" if kind == "cuda" else "torch")
    if name == "torch":
        return TORCH
    if kernels == "auto":
        if workload is None:
            return KernelBackend("triton", torch_ops=frozenset(OPS), choices=(
                {"op": "*", "choice": "torch", "why": "auto without the run's shapes: nothing measured"},))
        import importlib

        import torch

        # imported by name, as the op modules are (it imports this package: no cycle for the layer check)
        autoselect = importlib.import_module(f"{__name__}.autoselect")
        dev = device if isinstance(device, torch.device) else torch.device(device)
        return autoselect.choose(dev, workload, cache_dir, log=log or (lambda m: None))
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


# op -> (module, Triton function, torch reference); the op itself is the module's
# function named like the key. Imports stay lazy: importing this package imports
# neither torch nor triton, so ``abl --help`` stays fast and a test process can set
# TRITON_INTERPRET=1 before triton is imported.
OPS: dict[str, tuple[str, str, str]] = {
    "rmsnorm": ("rmsnorm", "rmsnorm_triton", "rmsnorm_reference"),
    "layernorm": ("layernorm", "layernorm_triton", "layernorm_reference"),
    "rope": ("rope", "rope_triton", "rope_reference"),
    "swiglu": ("swiglu", "swiglu_triton", "swiglu_reference"),
    "geglu": ("swiglu", "geglu_triton", "geglu_reference"),
    "cross_entropy": ("cross_entropy", "cross_entropy_triton", "cross_entropy_reference"),
    "linear_cross_entropy": ("cross_entropy", "linear_cross_entropy_triton", "linear_cross_entropy_reference"),
    "flash_attention": ("flash_attention", "flash_attention_triton", "attention_reference"),
    "ssd_scan": ("ssd_scan", "ssd_scan_triton", "ssd_chunked"),
}


def module_of(op: str):
    """The kernel module of an op (imported on first use)."""
    import importlib

    return importlib.import_module(f"{__name__}.{OPS[op][0]}")


def load(op: str):
    """(Triton function, torch reference) of an op, importing its module."""
    _, fn, ref = OPS[op]
    mod = module_of(op)
    return getattr(mod, fn), getattr(mod, ref)


def op(name: str):
    """The op itself (it picks the Triton function or the reference from the active backend)."""
    return getattr(module_of(name), name)
