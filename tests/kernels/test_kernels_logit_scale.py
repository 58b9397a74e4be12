"""The fused LM head (Triton cross-entropy over the vocabulary) applies model.logit_scale like the torch
head: under the Triton interpreter on CPU (tests/kernels/conftest.py), compiled on a GPU."""

import pytest
import torch

from abl.model.decoder import ForwardContext
from tests.test_logit_options import V, _model

from .helpers import triton_device


@pytest.mark.skipif(triton_device() is None, reason="needs Triton (CUDA, or TRITON_INTERPRET=1 on CPU)")
def test_the_fused_head_applies_the_scale_too(registry):
    from abl.kernels import resolve

    device = triton_device()
    model = _model(registry, logit_scale="inv_sqrt_d_model").to(device)
    x = torch.randint(0, V, (2, 8), device=device)
    ref = model(x, x)[1]
    with model.using_kernels(resolve("triton", torch.device(device))):
        _, fused, _ = model(x, x, ForwardContext(position=model.position, need_logits=False))
    torch.testing.assert_close(fused, ref, rtol=1e-4, atol=1e-4)
