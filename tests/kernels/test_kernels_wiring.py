"""``train.kernels = "triton"`` reaches the kernels from the plugins and the skeleton.

The kernels themselves are checked against their references in the other
files here; these tests check the wiring: with the triton backend a whole
model calls flash attention, RoPE and the (fused) cross-entropy kernels, and
gives the same loss, gradients and cached-decoding logits as the torch
backend. Shapes are tiny because the kernels run in the Triton interpreter
on CPU.
"""

import contextlib
import json

import duckdb
import pytest
import torch

from abl import kernels
from abl.contracts.config import ModelConfig
from abl.model.decoder import DecoderLM, ForwardContext
from tests.conftest import run_abl
from tests.kernels.helpers import assert_close


def build(registry, mixer="mha", position="rope", mixer_params=None, position_params=None, ffn="swiglu",
          norm="rmsnorm", device="cpu", backend="torch"):
    cfg = ModelConfig(d_model=64, n_layers=2, n_heads=2, context=24, vocab_size=50)
    comps = {}
    for axis, name, given in (("norm", norm, None), ("block", "pre", None),
                              ("position", position, position_params), ("mixer", mixer, mixer_params),
                              ("ffn", ffn, None)):
        comp = registry.get(axis, name)
        params = {k: p.default for k, p in comp.params.items()}
        params.update(given or {})
        comps[axis] = {"name": name, "params": params}
    torch.manual_seed(0)
    return DecoderLM(cfg, comps, registry, kernel_backend=kernels.KernelBackend(backend)).to(device)


class Calls:
    """Counts calls of the ops' Triton functions (each op looks its `_triton` function up per call)."""

    def __init__(self, monkeypatch, *names):
        import importlib

        self.counts = dict.fromkeys(names, 0)
        for name in names:
            module, fn = name.rsplit(".", 1)
            mod = importlib.import_module(f"abl.kernels.{module}")
            real = getattr(mod, fn)

            def counted(*args, __real=real, __name=name, **kwargs):
                self.counts[__name] += 1
                return __real(*args, **kwargs)

            monkeypatch.setattr(mod, fn, counted)


def loss_and_grads(model, idx, targets, backend, need_logits=True):
    model.zero_grad(set_to_none=True)
    ctx = ForwardContext(position=model.position, need_logits=need_logits)
    with model.using_kernels(kernels.KernelBackend(backend)):
        logits, loss, ctx = model(idx, targets, ctx)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert kernels.active() == kernels.TORCH  # the model's backend is active only inside its forward
    return logits, loss.detach(), grads


CASES = [
    # (mixer, mixer params, position, position params, flash attention used, rope kernel used)
    ("mha", {}, "rope", {}, True, True),
    ("mha", {}, "rope", {"layout": "half"}, True, True),
    ("gqa", {"n_kv_heads": 1}, "alibi", {}, True, False),
    ("mqa", {}, "nope", {}, True, False),
    ("sliding_window", {"window": 7}, "rope", {}, True, True),
    ("mha", {}, "t5", {}, False, False),  # a bucketed bias: SDPA with the bias tensor
    ("mha", {"softcap": 30.0}, "rope", {}, False, True),  # capped logits: the torch path
]


@pytest.mark.parametrize("mixer,mparams,position,pparams,flash,rope", CASES,
                         ids=[f"{c[0]}-{c[2]}{'-' + next(iter(c[3].values())) if c[3] else ''}"
                              f"{'-capped' if c[1].get('softcap') else ''}" for c in CASES])
def test_triton_backend_matches_torch_backend(registry, monkeypatch, device, mixer, mparams, position,
                                              pparams, flash, rope):
    model = build(registry, mixer, position, mparams, pparams, device=device)
    idx = torch.randint(0, 50, (2, 24), device=device)
    targets = torch.randint(0, 50, (2, 24), device=device)
    ref_logits, ref_loss, ref_grads = loss_and_grads(model, idx, targets, "torch")
    calls = Calls(monkeypatch, "flash_attention.flash_attention_triton", "rope.rope_qk_triton",
                  "cross_entropy.cross_entropy_triton", "rmsnorm.rmsnorm_triton", "swiglu.swiglu_triton")
    logits, loss, grads = loss_and_grads(model, idx, targets, "triton")
    assert calls.counts["flash_attention.flash_attention_triton"] == (2 if flash else 0)
    assert calls.counts["rope.rope_qk_triton"] == (2 if rope else 0)  # q and k together, once per layer
    assert calls.counts["cross_entropy.cross_entropy_triton"] == 1
    assert calls.counts["rmsnorm.rmsnorm_triton"] == 5 and calls.counts["swiglu.swiglu_triton"] == 2
    assert_close("logits", ref_logits, logits)
    assert_close("loss", ref_loss, loss)
    assert set(grads) == set(ref_grads)
    for name, g in ref_grads.items():
        assert_close(f"grad {name}", g, grads[name])


def test_training_step_fuses_the_lm_head_into_the_loss(registry, monkeypatch, device):
    model = build(registry, device=device)
    idx = torch.randint(0, 50, (2, 24), device=device)
    targets = torch.randint(0, 50, (2, 24), device=device)
    _, ref_loss, ref_grads = loss_and_grads(model, idx, targets, "torch", need_logits=False)
    calls = Calls(monkeypatch, "cross_entropy.linear_cross_entropy_triton", "cross_entropy.cross_entropy_triton")
    logits, loss, grads = loss_and_grads(model, idx, targets, "triton", need_logits=False)
    assert logits is None  # the [B*T, V] logits were never formed whole
    assert calls.counts == {"cross_entropy.linear_cross_entropy_triton": 1,
                            "cross_entropy.cross_entropy_triton": 0}
    assert_close("loss", ref_loss, loss)
    assert model.lm_head.weight is model.embed.weight  # tied: one gradient from both uses
    for name, g in ref_grads.items():
        assert_close(f"grad {name}", g, grads[name])


@pytest.mark.parametrize("mixer,mparams,position", [("gqa", {"n_kv_heads": 1}, "rope"),
                                                    ("sliding_window", {"window": 5}, "alibi")])
def test_cached_decoding_with_the_flash_kernel(registry, monkeypatch, device, mixer, mparams, position):
    """Prefill, then one token at a time: the kernel's bottom-right causal alignment
    (a query block appended to a KV cache) gives the torch backend's logits."""
    model = build(registry, mixer, position, mparams, device=device).eval()
    seq = torch.randint(0, 50, (2, 12), device=device)

    def decode(backend):
        cache: dict = {}
        with model.using_kernels(kernels.KernelBackend(backend)):
            out = [model(seq[:, :8], ctx=ForwardContext(position=model.position, start=0, cache=cache))[0][:, -1]]
            for t in range(8, 12):
                ctx = ForwardContext(position=model.position, start=t, cache=cache)
                out.append(model(seq[:, t:t + 1], ctx=ctx)[0][:, -1])
        return torch.stack(out, 1)

    with torch.no_grad():
        ref = decode("torch")
        calls = Calls(monkeypatch, "flash_attention.flash_attention_triton")
        got = decode("triton")
    assert calls.counts["flash_attention.flash_attention_triton"] == 2 * 5  # 2 layers x (prefill + 4 steps)
    assert_close("decoded logits", ref, got)


def test_flop_count_is_taken_on_the_reference_path(registry, device):
    """torch's counter cannot see inside a Triton kernel: the harness counts on the torch path,
    so the measured FLOPs do not depend on train.kernels."""
    from abl.model.flops import count_step_flops

    x = torch.randint(0, 50, (2, 24), device=device)
    counts = []
    for backend in ("torch", "triton"):
        model = build(registry, device=device, backend=backend)
        counts.append(count_step_flops(model, x, x, lambda: ForwardContext(position=model.position,
                                                                            need_logits=False),
                                       contextlib.nullcontext))
        assert model.kernel_backend == kernels.KernelBackend(backend)  # the model's own, after counting
    assert counts[0] == counts[1] > 0


@pytest.mark.slow
def test_abl_run_with_triton_kernels_on_cpu(tmp_path):
    """A whole cell through the worker with train.kernels = "triton": the worker switches the
    interpreter on, the run completes, and the run says the kernels were interpreted."""
    grid = tmp_path / "g.toml"
    grid.write_text("""
[experiment]
name = "triton-wiring"
seeds = [0]
[model]
d_model = 32
n_layers = 1
n_heads = 1
context = 16
mixer = "mha"
position = "alibi"
ffn = "swiglu"
norm = "rmsnorm"
[train]
steps = 3
batch_size = 2
eval_every = 3
eval_batches = 1
kernels = "triton"
threads = 1
[data]
dataset = "pystdlib"
""")
    db = tmp_path / "t.duckdb"
    env = {"TRITON_INTERPRET": ""}  # the worker must switch the interpreter on by itself
    r = run_abl(["run", str(grid), "--db", str(db), "--runs-dir", str(tmp_path / "runs")], env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    con = duckdb.connect(str(db), read_only=True)
    status, notes, env_json = con.execute("SELECT status, notes, env FROM runs").fetchone()
    val = con.execute("SELECT value FROM metrics WHERE name = 'val_loss' ORDER BY step DESC LIMIT 1").fetchone()
    con.close()
    assert status == "completed"
    assert json.loads(env_json)["kernels"] == "triton"
    assert "Triton interpreter" in notes
    assert 0 < val[0] < 10
