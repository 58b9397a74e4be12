"""Registering a kernel launcher as a PyTorch custom op, so ``torch.compile`` keeps it in one graph.

Used by the rmsnorm, layernorm, rope and swiglu launchers (``kernel_op``).
"""

import torch

from .utils import HAS_TRITON, interpreting


def kernel_op(name: str, fake):
    """Register a launcher as the custom op ``name`` ("abl::..."), ``fake`` its fake (meta)
    implementation, so that ``torch.compile`` keeps a call to it inside one graph.

    The op is a ``torch.library.triton_op``, its kernels launched through
    ``wrap_triton(kernel)[grid](...)`` (which under the interpreter gives the kernel back): on a
    GPU, AOTAutograd decomposes it into the launches themselves, which inductor sees. In the
    Triton interpreter (CPU), and without triton, it stays one opaque node instead: the
    decomposition would run the interpreted kernel on fake tensors, so under
    FunctionalTensorMode the op is dispatched as itself (as ``torch.export`` keeps triton ops)
    and runs eagerly when the compiled graph runs. ``fake`` allocates the outputs with the real
    ones' shapes, dtypes and strides, and launches nothing.
    """

    def register(fn):
        if HAS_TRITON:
            op = torch.library.triton_op(name, mutates_args=())(fn)
        else:  # pragma: no cover - no triton (macOS): calling the op raises KernelUnavailable
            op = torch.library.custom_op(name, mutates_args=())(fn)
        op.register_fake(fake)
        if not HAS_TRITON or interpreting():
            from torch._subclasses.functional_tensor import FunctionalTensorMode

            op.register_torch_dispatch(FunctionalTensorMode, _dispatch_as_itself)
        return op

    return register


def _dispatch_as_itself(mode, op, types, args, kwargs):
    return mode.__torch_dispatch__(op, types, args, kwargs)


def no_tensor(like: torch.Tensor) -> torch.Tensor:
    """The empty fp32 tensor a backward op returns for a gradient that does not exist (an op
    cannot return None)."""
    return like.new_empty(0, dtype=torch.float32)
