"""The Triton path at a head width that is not d_model / n_heads (``model.head_dim``).

A whole model with d_model 32, 4 heads of 12 dims (q/k/v 48 wide): flash
attention and the RoPE kernel run at D = 12 and give the torch backend's
loss and every gradient; cached decoding through the kernel gives its logits.
"""

import pytest
import torch

from abl import kernels
from abl.grid.gridfile import expand
from abl.model.decoder import DecoderLM, ForwardContext
from tests.kernels.helpers import assert_close
from tests.kernels.test_kernels_wiring import Calls, loss_and_grads

CASES = [("mha", {}, "rope"), ("gqa", {"n_kv_heads": 2}, "alibi"), ("mqa", {}, "rope"),
         ("sliding_window", {"window": 7}, "nope")]


def build(registry, mixer, params, position, device):
    raw = {"model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "head_dim": 12, "context": 24,
                     "vocab_size": 50, "mixer": mixer, "position": position, "ffn": "swiglu"},
           "mixer": {mixer: params}, "train": {"kernels": "triton"}}
    c = expand(raw, registry).cells[0]
    assert c.model.head_dim * c.model.n_heads != c.model.d_model
    torch.manual_seed(0)
    return DecoderLM(c.model, c.components, registry).to(device)


@pytest.mark.parametrize("mixer,params,position", CASES, ids=[f"{m}-{p}" for m, _, p in CASES])
def test_flash_attention_at_an_independent_head_dim_matches_torch(registry, monkeypatch, device, mixer, params,
                                                                  position):
    model = build(registry, mixer, params, position, device)
    idx = torch.randint(0, 50, (2, 24), device=device)
    targets = torch.randint(0, 50, (2, 24), device=device)
    ref_logits, ref_loss, ref_grads = loss_and_grads(model, idx, targets, "torch")
    calls = Calls(monkeypatch, "flash_attention.flash_attention_triton", "rope.rope_qk_triton")
    logits, loss, grads = loss_and_grads(model, idx, targets, "triton")
    assert calls.counts["flash_attention.flash_attention_triton"] == 2
    assert calls.counts["rope.rope_qk_triton"] == (2 if position == "rope" else 0)  # q and k in one launch a layer
    assert_close("logits", ref_logits, logits)
    assert_close("loss", ref_loss, loss)
    assert set(grads) == set(ref_grads)
    for name, g in ref_grads.items():
        assert_close(f"grad {name}", g, grads[name])


def test_cached_decoding_through_the_kernel_at_an_independent_head_dim(registry, monkeypatch, device):
    model = build(registry, "gqa", {"n_kv_heads": 1}, "rope", device).eval()
    seq = torch.randint(0, 50, (2, 12), device=device)

    def decode(backend):
        cache: dict = {}
        with model.using_kernels(kernels.KernelBackend(backend)):
            out = [model(seq[:, :8], ctx=ForwardContext(position=model.position, start=0, cache=cache))[0][:, -1]]
            for t in range(8, 12):
                ctx = ForwardContext(position=model.position, start=t, cache=cache)
                out.append(model(seq[:, t:t + 1], ctx=ctx)[0][:, -1])
        return torch.stack(out, 1), cache

    with torch.no_grad():
        ref, _ = decode("torch")
        calls = Calls(monkeypatch, "flash_attention.flash_attention_triton")
        got, cache = decode("triton")
    assert calls.counts["flash_attention.flash_attention_triton"] == 2 * 5
    assert next(iter(cache.values()))["k"].shape[-1] == 12
    assert_close("decoded logits", ref, got)
