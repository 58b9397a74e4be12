"""Every kernel configuration a launcher can pick compiles for an H100 (sm_90) race-free and spill-free.

The check (``abl.kernels.compilecheck``) needs Triton's compiler, not its interpreter, so it runs in
a subprocess without ``TRITON_INTERPRET``. It runs with the pinned triton, and also with a second
triton where ``ABL_COMPILECHECK_TRITON`` names a folder holding one (``.ci/run`` installs the GPU
image's triton 3.6 there): the GPU machines compile with that one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from abl.kernels.compilecheck import wgmma_hazards

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tritons() -> list[str | None]:
    extra = os.environ.get("ABL_COMPILECHECK_TRITON")
    if extra and not os.path.isabs(extra):
        extra = os.path.join(ROOT, extra)
    return [None] + ([extra] if extra and os.path.isdir(extra) else [])


def _env(pythonpath: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(args: list[str], pythonpath: str | None, timeout: int = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=_env(pythonpath),
                          cwd=ROOT, timeout=timeout)


def _can_compile_sm90(pythonpath: str | None) -> str | None:
    probe = _run(["-c", "from triton.backends.compiler import GPUTarget; "
                        "from triton.backends.nvidia.compiler import get_ptxas; print(get_ptxas(90).path)"],
                 pythonpath, timeout=120)
    return None if probe.returncode == 0 else probe.stderr.strip().splitlines()[-1:]


@pytest.mark.parametrize("pythonpath", _tritons(), ids=lambda p: "pinned triton" if p is None else "second triton")
def test_every_shipped_kernel_configuration_compiles_for_sm90_without_hazard_or_spill(pythonpath):
    why = _can_compile_sm90(pythonpath)
    if why:
        pytest.skip(f"this triton cannot compile for sm_90 here: {why}")
    shards = max(1, min(4, os.cpu_count() or 1))
    procs = [subprocess.Popen([sys.executable, "-m", "abl.kernels.compilecheck", "--json", "--shard", f"{i}/{shards}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(pythonpath),
                              cwd=ROOT) for i in range(shards)]
    outs = [p.communicate(timeout=1500) for p in procs]
    rows = [json.loads(line) for out, _ in outs for line in out.splitlines() if line.startswith("{")]
    bad = [row for row in rows if not row["ok"]]
    assert not bad, "\n".join(f"{row['label']}: {row['hazards'] or ''} {row['spill_store_bytes']} B spill stores "
                              f"{row['error'] or ''}" for row in bad)
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    kernels = {row["kernel"] for row in rows}
    assert {"_attn_fwd_kernel", "_attn_bwd_dkdv_kernel", "_attn_bwd_dq_kernel", "_ssd_chunk_scan_kernel",
            "_ssd_bmm_chunk_kernel", "_ssd_chunk_state_kernel"} <= kernels
    # every tile of every class was compiled: 3 head-dim classes + fp32, each with several tiles
    assert sum(row["kernel"] == "_attn_bwd_dkdv_kernel" for row in rows) >= 10


OLD_TILE = textwrap.dedent("""
    import json, math, sys
    import torch
    sys.path.insert(0, "tests/kernels/data")
    from old_dkdv_kernel import _attn_bwd_dkdv_kernel as old
    from abl.kernels import compilecheck as cc

    def launch(bm, bn, warps, stages, d=128, dtype=torch.bfloat16, b=1, h=4, hk=2, t=256):
        q, k, v, do = (torch.zeros(b, n, t, d, dtype=dtype) for n in (h, hk, hk, h))
        lse, delta = torch.zeros(b, h, t), torch.zeros(b, h, t)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        old[(t // bn, b * hk)](
            q, k, v, do, lse, delta, dk, dv, lse,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
            dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
            h, hk, h // hk, t, t, 0, 0, 1.4426950408889634 / math.sqrt(d), 1 / math.sqrt(d),
            HEAD_DIM=d, IS_CAUSAL=True, HAS_WINDOW=False, HAS_ALIBI=False, BLOCK_D=d, DOT_PRECISION=None,
            UPCAST=False, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)

    out = []
    for cfg in ((32, 64, 4, 2), (64, 64, 8, 2)):  # the racing tile, and one that compiles race-free
        with cc.recording("old dK/dV kernel, bf16 D128 causal") as got:
            launch(*cfg)
        r = cc.check(got[0])
        out.append(dict(label=r.label, hazards=r.hazards, ok=r.ok))
    print(json.dumps(out))
""")


@pytest.mark.parametrize("pythonpath", _tritons(), ids=lambda p: "pinned triton" if p is None else "second triton")
def test_the_check_fails_on_the_old_racing_dkdv_tile(pythonpath):
    why = _can_compile_sm90(pythonpath)
    if why:
        pytest.skip(f"this triton cannot compile for sm_90 here: {why}")
    r = _run(["-c", OLD_TILE], pythonpath)
    assert r.returncode == 0, r.stderr[-2000:]
    racing, clean = json.loads(r.stdout.strip().splitlines()[-1])
    assert "BLOCK_M=32,BLOCK_N=64" in racing["label"] and "warps=4, stages=2" in racing["label"]
    assert not racing["ok"]
    # the race itself: q and dO in a one-slot buffer refilled by a cp.async before a wait retires the MMAs
    assert any("1x32x128xbf16" in h for h in racing["hazards"]), racing["hazards"]
    # the hazard test is not "everything fails": the same kernel at another tile has no hazard
    assert "BLOCK_M=64,BLOCK_N=64" in clean["label"] and clean["hazards"] == [], clean


# ---------------------------------------------------------------- the analysis on hand-made TTGIR

_LOOP = """\
    %buf = ttg.local_alloc : () -> !ttg.memdesc<{slots}x32x128xbf16, #shared1, #smem, mutable> loc(#loc1)
    %r:2 = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %cst, %tok = %t0) -> (tensor<64x128xf32, #mma>, !ttg.async.token)  : i32 {{
      %w = ttg.async_wait %tok {{num = 0 : i32}} loc(#loc2)
      %cur = ttg.memdesc_index %buf[%slot] : !ttg.memdesc<{slots}x32x128xbf16, #shared1, #smem, mutable> -> !ttg.memdesc<32x128xbf16, #shared1, #smem, mutable> loc(#loc3)
      %d = ttng.warp_group_dot %a, %cur, %acc {{inputPrecision = 0 : i32, isAsync = true}} : tensor<64x32xbf16, #dot> * !ttg.memdesc<32x128xbf16, #shared1, #smem, mutable> -> tensor<64x128xf32, #mma> loc(#loc4)
      %dw:2 = ttng.warp_group_dot_wait %d, %cur {{pendings = {pendings} : i32}} : tensor<64x128xf32, #mma>, !ttg.memdesc<32x128xbf16, #shared1, #smem, mutable> loc(#loc5)
      %nxt = ttg.memdesc_index %buf[%slot2] : !ttg.memdesc<{slots}x32x128xbf16, #shared1, #smem, mutable> -> !ttg.memdesc<32x128xbf16, #shared1, #smem, mutable> loc(#loc6)
      %c = ttg.async_copy_global_to_local %ptrs, %nxt mask %m other %z : tensor<32x128x!tt.ptr<bf16>, #blocked> -> <32x128xbf16, #shared1, #smem, mutable> loc(#loc7)
      %ct = ttg.async_commit_group tokens %c loc(#loc8)
      scf.yield %dw#0, %ct : tensor<64x128xf32, #mma>, !ttg.async.token loc(#loc9)
    }} loc(#loc10)
"""


def test_a_single_slot_buffer_refilled_before_a_full_wait_is_a_hazard():
    found = wgmma_hazards(_LOOP.format(slots=1, pendings=1))
    assert len(found) == 1 and "%buf" in found[0] and "1x32x128xbf16" in found[0]


def test_a_full_wait_between_the_mma_and_the_copy_clears_it():
    assert wgmma_hazards(_LOOP.format(slots=1, pendings=0)) == []


def test_a_ring_of_slots_refilled_next_iteration_after_a_retiring_wait_is_safe():
    # two slots: the copy in this iteration fills the other slot, and the slot the MMA read is
    # refilled in the next iteration. With waits that keep two groups pending, nothing retires
    # the MMA before that copy: a hazard. A full wait at the top of the loop retires it; so does
    # the next iteration's "pendings = 1" wait, issued after that iteration's own MMA.
    assert wgmma_hazards(_LOOP.format(slots=2, pendings=2))
    with_wait = _LOOP.format(slots=2, pendings=2).replace(
        "      %w = ttg.async_wait",
        "      %w0:1 = ttng.warp_group_dot_wait %acc {pendings = 0 : i32} : tensor<64x128xf32, #mma> loc(#loc0)\n"
        "      %w = ttg.async_wait")
    assert wgmma_hazards(with_wait) == []
    assert wgmma_hazards(_LOOP.format(slots=2, pendings=1)) == []


def test_a_wait_that_leaves_only_later_mmas_pending_retires_the_earlier_one():
    # wgmma.wait_group 1 waits for all but the most recent group: after a second MMA it retires the
    # first (Triton's pipeliner keeps one product in flight this way); right after the only MMA it does not
    second = ("      %d2 = ttng.warp_group_dot %a, %other, %acc {inputPrecision = 0 : i32, isAsync = true} : "
              "tensor<64x32xbf16, #dot> * !ttg.memdesc<32x128xbf16, #shared1, #smem> -> tensor<64x128xf32, #mma> "
              "loc(#loc40)\n")
    loop = _LOOP.format(slots=1, pendings=1)
    assert wgmma_hazards(loop)
    at = loop.index("      %dw:2 = ttng.warp_group_dot_wait")
    assert wgmma_hazards(loop[:at] + second + loop[at:]) == []
