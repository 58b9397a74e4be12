"""The peer kernels the benchmarks time beside abl's: importing them, and adapting their calls.

A peer is an optional package (liger-kernel, flash-attn, mamba-ssm, fla-core) that may be missing,
or fail to import, on any machine: ``peer`` answers None then. ``fla_ssd`` puts the SSD scan
into fla's terms.
"""

from __future__ import annotations

import importlib
from typing import Any


def peer(module: str) -> Any:
    """The imported module, or None when it is not installed (or fails to import) here."""
    try:
        return importlib.import_module(module)
    except Exception:  # noqa: BLE001 - any import failure means "not installed here"
        return None


def fla_ssd(chunk_simple_gla, x, dt, a, bm, cm):
    """The SSD scan ``y = ssd_chunked(x, dt, A, B, C)`` through fla's chunked simple-GLA kernel.

    Mamba-2's recurrence h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t^T, y_t = C_t^T h_t is simple GLA's
    S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = scale q_t^T S_t with q = C, k = dt B, v = x, g = dt A and
    scale 1 (fla's inputs are [B, T, H, *]; the group dim of B and C is broadcast over the heads).
    """
    b, t, h, _ = x.shape
    n = bm.shape[-1]
    rep = h // bm.shape[2]
    bh = bm.repeat_interleave(rep, dim=2) if rep > 1 else bm.expand(b, t, h, n)
    ch = cm.repeat_interleave(rep, dim=2) if rep > 1 else cm.expand(b, t, h, n)
    k = (bh.float() * dt[..., None]).to(x.dtype)
    out = chunk_simple_gla(q=ch.to(x.dtype).contiguous(), k=k.contiguous(), v=x.contiguous(),
                           g=(dt * a).float().contiguous(), scale=1.0)
    return out[0] if isinstance(out, (tuple, list)) else out
