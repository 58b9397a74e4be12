"""The precision policy interface (axis ``precision``) and its one dtype answer.

"Which dtype does this precision compute in" has one answer: the policy's
``compute_dtype`` (the dtype of activations, and so of decoding caches). Its
autocast context, the cost model's bytes per activation, the decode metrics'
cache dtype and the device-peak lookup for MFU (``peak_format``) all derive
from it. No code outside a policy asks for a policy by name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch

_FORMAT_OF_DTYPE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


class Precision:
    """Base class of precision policies (the ``precision`` axis).

    Subclasses set ``compute_dtype`` and override what differs: ``backward``/
    ``step`` for loss scaling, ``setup`` to swap modules (fp8), ``peak_format``
    when the matmuls run in another format than the activations (TF32, fp8).
    ``emulated`` must be True when a feature runs as an emulation (e.g. fp8 on
    a device without fp8 matmuls); ``info()`` is stored with the run.
    ``gemm_transient_bytes`` declares the working memory of matmuls the policy
    replaces (the cost model adds it to the predicted training peak).
    """

    name = "base"
    emulated = False
    compute_dtype: torch.dtype = torch.float32

    def setup(self, model: torch.nn.Module, device: torch.device) -> None:
        """Called once after the model is on its device, before the optimizer exists."""

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        """The context the forward pass runs in: autocast to ``compute_dtype``, or nothing for fp32."""
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.compute_dtype)

    def peak_format(self) -> str:
        """The number format the matmuls run in, for ``abl.store.provenance.peak_flops`` (MFU)."""
        return _FORMAT_OF_DTYPE.get(self.compute_dtype, "fp32")

    def gemm_transient_bytes(self, linears: Iterable[tuple[str, int, int, bool]], rows: int) -> int:
        """Bytes the policy's matmuls hold at once beyond their operands, at worst, in one training step.

        ``linears``: the model's ``nn.Linear`` layers as (qualified name,
        in_features, out_features, has bias), produced lazily (the cost model
        builds the model on the meta device only when it is iterated); ``rows``:
        the tokens of one step (batch x context), each linear's input rows.
        Count what the policy's own GEMM code allocates while a layer's operands
        (its input, weight and, backward, the incoming gradient) are live: working
        copies (e.g. quantized or rescaled operands), layout copies, and results
        held while the next GEMM runs. ``abl.model.costmodel`` adds the largest to
        the training peak, where it coincides with the saved activations (in the
        place of the loss's backward transient when larger). Default 0: an
        autocast matmul allocates its result only.
        """
        return 0

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, optimizer, params, grad_clip: float) -> dict[str, Any]:
        """Clip, step, and return step metrics (at least grad_norm)."""
        max_norm = grad_clip if grad_clip > 0 else float("inf")
        gn = torch.nn.utils.clip_grad_norm_(params, max_norm)
        optimizer.step()
        return {"grad_norm": gn}

    def info(self) -> dict[str, Any]:
        return {"precision": self.name, "emulated": self.emulated,
                "compute_dtype": str(self.compute_dtype).removeprefix("torch."),
                "peak_format": self.peak_format()}

    def state_dict(self) -> dict[str, Any]:
        """State to checkpoint (e.g. a loss scaler's)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
