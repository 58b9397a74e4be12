"""Numeric precision policies (axis ``precision``).

Seeds 000 sec. 7 (FP32, BF16 mixed precision with fp32 master weights).
Every factory is ``factory(**params)`` and returns a ``harness.train.Precision``.
"""

from __future__ import annotations

import torch

from harness.hookspecs import hookimpl
from harness.train import Precision


class FP32(Precision):
    """Everything in fp32."""

    name = "fp32"


class BF16(Precision):
    """torch.autocast to bfloat16 for matmuls; fp32 master weights and AdamW state.

    bf16 has fp32's exponent range, so no loss scaling is needed.
    """

    name = "bf16"

    def autocast(self, device):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


@hookimpl
def register_components(register):
    register("precision", "fp32", FP32)
    register("precision", "bf16", BF16)
