"""The RoPE kernel compiled for sm_90 at the 126M cell's own launch reads and writes its rows as vectors.

The GPU probe of 2026-11-28 found ``_rope_kernel`` at about 54% of the 126M cell's CUDA time
(docs/gpu.md), while ``abl bench kernels`` had timed it near copy bandwidth: the bench ran the "half"
layout on a contiguous tensor, the cell runs the default "interleaved" layout on strided q/k views.
The old kernel's interleaved path loaded and stored the pairs at stride 2, 2 bytes at a time.
``abl.kernels.compilecheck`` now fails a 16-bit RoPE launch with aligned rows that compiles to scalar
2-byte global accesses. Like tests/kernels/test_compilecheck.py, this runs the compiler in a subprocess
without ``TRITON_INTERPRET``, with the pinned triton and, in CI, the GPU machines' triton 3.6.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from .test_compilecheck import _can_compile_sm90, _run, _tritons

CELL = textwrap.dedent("""
    import json, sys
    import torch
    sys.path.insert(0, "tests/kernels/data")
    from old_rope_kernel import _rope_kernel as old
    from abl.kernels import compilecheck as cc
    from abl.kernels.rope import rope_launch

    B, T, H, D = 16, 1024, 16, 64  # scripts/gpu_big.toml
    q = torch.empty(B, T, H, D, dtype=torch.bfloat16).transpose(1, 2)
    ang = torch.empty(T, D // 2)
    out = {}
    for interleaved in (True, False):
        with cc.recording("the 126M cell's q") as got:
            rope_launch(q, ang, ang, interleaved, False)
        with cc.recording("old kernel, the 126M cell's q") as old_got:
            y = torch.empty(B, H, T, D, dtype=q.dtype)
            c = ang[None].expand(B, T, D // 2)
            old[(B * H, T // 64)](q, y, c, c, q.stride(0), q.stride(1), q.stride(2), y.stride(0), y.stride(1),
                                  y.stride(2), 0, c.stride(1), H, T, D // 2, INTERLEAVED=interleaved,
                                  BACKWARD=False, BLOCK_T=64, BLOCK_K=32, num_warps=4)
        for name, launches in (("new", got), ("old", old_got)):
            r = cc.check(launches[0])
            out[f"{name} {'interleaved' if interleaved else 'half'}"] = dict(
                ok=r.ok, hazards=r.hazards, spills=r.spill_store_bytes, label=r.label, error=r.error)
    print(json.dumps(out))
""")


@pytest.mark.parametrize("pythonpath", _tritons(), ids=lambda p: "pinned triton" if p is None else "second triton")
def test_the_cell_launch_is_vectorised_and_the_old_interleaved_kernel_is_caught(pythonpath):
    why = _can_compile_sm90(pythonpath)
    if why:
        pytest.skip(f"this triton cannot compile for sm_90 here: {why}")
    r = _run(["-c", CELL], pythonpath, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for layout in ("interleaved", "half"):
        new = got[f"new {layout}"]
        assert new["ok"] and new["hazards"] == [] and new["spills"] == 0, new
    old = got["old interleaved"]
    assert not old["ok"] and any("scalar 16-bit global accesses" in h for h in old["hazards"]), old
    # the check is not "everything fails": the old kernel's half layout did load whole half rows
    assert got["old half"]["ok"], got["old half"]


def test_compilecheck_covers_the_cell_launch_in_both_layouts():
    why = _can_compile_sm90(None)
    if why:
        pytest.skip(f"this triton cannot compile for sm_90 here: {why}")
    r = _run(["-m", "abl.kernels.compilecheck", "--op", "rope", "--json"], None, timeout=600)
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert r.returncode == 0 and rows and all(row["ok"] for row in rows), (r.stdout[-2000:], r.stderr[-2000:])
    cell = [row for row in rows if "126M cell" in row["label"]]
    assert {("interleaved" in row["label"]) for row in cell} == {True, False}
    # q and k in one launch; the forward and the backward (BACKWARD, a constexpr: launches of their
    # own) under labels of their own, every label once
    assert {row["label"].rsplit(", ", 1)[-1] for row in cell} == {"forward)", "backward)"}, [r["label"] for r in cell]
    assert all("q and k views in one launch" in row["label"] for row in cell)
    assert len({row["label"] for row in rows}) == len(rows), [row["label"] for row in rows]
