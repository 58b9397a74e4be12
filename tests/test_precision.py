"""Precision policies: registration, fp16 dynamic loss scaling, fp8 quantisation rules, tf32/fp8 records."""

import copy

import pytest
import torch
import torch.nn as nn

from abl.plugins.precision import (
    BF16,
    E4M3,
    E5M2,
    FP8,
    FP16,
    FP32,
    TF32,
    FP8Linear,
    fp8_dequantize,
    fp8_matmul,
    fp8_quantize,
)

CPU = torch.device("cpu")


def test_every_precision_is_registered(registry):
    assert {"fp32", "tf32", "bf16", "fp16", "fp8"} <= set(registry.names("precision"))


# ---------------------------------------------------------------- fp16


def _fp16_step(policy, model, x, opt):
    opt.zero_grad(set_to_none=True)
    with policy.autocast(CPU):
        loss = model(x).float().pow(2).mean()
    policy.backward(loss)
    return policy.step(opt, list(model.parameters()), 1.0)


def test_fp16_skips_the_step_and_backs_off_on_inf_grads():
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    policy = FP16(init_scale=16.0, backoff_factor=0.5)
    before = copy.deepcopy(model.state_dict())
    # the weight gradient (~1e3 * 1e3 * 4 rows * S) overflows fp16 (max 65504) -> inf
    out = _fp16_step(policy, model, torch.full((4, 8), 1e3), opt)
    assert out == {"loss_scale": 16.0, "skipped_steps": 1, "step_skipped": 1.0}
    assert policy.scale == 8.0
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), "a skipped step must not change the weights"
    assert not opt.state, "nor the optimizer state"
    out = _fp16_step(policy, model, torch.randn(4, 8), opt)
    assert out["step_skipped"] == 0.0 and out["skipped_steps"] == 1 and out["loss_scale"] == 8.0
    assert torch.isfinite(out["grad_norm"])
    assert not torch.equal(model.weight, before["weight"])


def test_fp16_grows_the_scale_after_growth_interval_good_steps():
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    policy = FP16(init_scale=8.0, growth_factor=2.0, growth_interval=2)
    scales = [_fp16_step(policy, model, torch.randn(3, 4), opt)["loss_scale"] for _ in range(5)]
    assert scales == [8.0, 8.0, 16.0, 16.0, 32.0]
    state = policy.state_dict()
    fresh = FP16()
    fresh.load_state_dict(state)
    assert fresh.scale == policy.scale and fresh.good_steps == policy.good_steps


def test_fp16_unscales_gradients_exactly():
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    x = torch.randn(5, 6)
    ref = copy.deepcopy(model)
    ref(x).pow(2).mean().backward()
    policy = FP16(init_scale=1024.0)
    policy.backward(model(x).pow(2).mean())  # fp32 forward: only the scaling differs
    assert not policy.unscale_(list(model.parameters()))
    for p, r in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, r.grad)


def test_fp16_and_bf16_autocast_dtypes():
    lin = nn.Linear(4, 4)
    for policy, dtype in ((FP16(), torch.float16), (BF16(), torch.bfloat16)):
        with policy.autocast(CPU):
            assert lin(torch.randn(2, 4)).dtype == dtype
    assert lin.weight.dtype == torch.float32  # master weights stay fp32


# ---------------------------------------------------------------- tf32


def test_tf32_off_ampere_is_recorded_as_fp32():
    policy = TF32()
    policy.setup(nn.Linear(2, 2), CPU)
    info = policy.info()
    assert info["precision"] == "tf32" and info["tf32_active"] is False
    assert info["effective_precision"] == "fp32" and info["emulated"] is False
    assert info["peak_format"] == "fp32"
    assert FP32().info() == {"precision": "fp32", "emulated": False, "compute_dtype": "float32",
                             "peak_format": "fp32"}


# ---------------------------------------------------------------- fp8 quantisation


@pytest.mark.parametrize("dtype,mantissa,min_normal_exp", [(E4M3, 3, -6), (E5M2, 2, -14)],
                         ids=["e4m3", "e5m2"])
def test_fp8_per_tensor_error_bound(dtype, mantissa, min_normal_exp):
    """|x - dq(q(x))| <= half an ulp: 2^-(m+1) |x| for normals, 2^(e_min - m - 1) / S below."""
    torch.manual_seed(0)
    x = torch.randn(4096) * torch.logspace(-6, 2, 4096)  # many decades, subnormals included
    x_q, scale = fp8_quantize(x, dtype)
    assert x_q.dtype == dtype and scale.dim() == 0
    err = (fp8_dequantize(x_q, scale) - x).abs()
    bound = torch.maximum(2.0 ** -(mantissa + 1) * x.abs(),
                          torch.full_like(x, 2.0 ** (min_normal_exp - mantissa - 1)) / scale)
    assert (err <= bound * (1 + 1e-5) + 1e-12).all()


def test_fp8_amax_maps_to_the_format_max():
    x = torch.randn(64, 32)
    for dtype in (E4M3, E5M2):
        x_q, scale = fp8_quantize(x, dtype)
        assert x_q.float().abs().max() == torch.finfo(dtype).max
        amax = x.abs().max()
        torch.testing.assert_close(fp8_dequantize(x_q, scale).abs().max(), amax, rtol=1e-6, atol=0)


def test_fp8_per_channel_scales_each_row_and_beats_per_tensor_on_uneven_rows():
    torch.manual_seed(0)
    w = torch.randn(8, 64) * torch.logspace(-4, 1, 8)[:, None]  # loud and quiet output channels
    q_c, s_c = fp8_quantize(w, E4M3, dim=1)
    assert s_c.shape == (8, 1)
    assert torch.equal(q_c.float().abs().amax(dim=1), torch.full((8,), 448.0))
    q_t, s_t = fp8_quantize(w, E4M3)
    rel = lambda q, s: ((fp8_dequantize(q, s) - w).norm(dim=1) / w.norm(dim=1))  # noqa: E731
    assert (rel(q_c, s_c) <= 2.0 ** -4).all()
    assert rel(q_t, s_t)[0] > 10 * rel(q_c, s_c)[0]  # the quietest row loses its precision per tensor


def test_fp8_zero_tensor_and_matmul_rules():
    x_q, s = fp8_quantize(torch.zeros(3, 4), E4M3)
    assert s == 1 and torch.equal(fp8_dequantize(x_q, s), torch.zeros(3, 4))
    torch.manual_seed(0)
    a, b = torch.randn(16, 64), torch.randn(64, 24)
    exact = a @ b
    for per_channel in (False, True):
        y = fp8_matmul(a, b, E4M3, E4M3, per_channel, torch.float32, real=False)
        # the emulation is exactly the product of the dequantized operands
        aq, sa = fp8_quantize(a, E4M3, 1 if per_channel else None)
        bq, sb = fp8_quantize(b, E4M3, 0 if per_channel else None)
        torch.testing.assert_close(y, fp8_dequantize(aq, sa) @ fp8_dequantize(bq, sb))
        assert (y - exact).norm() / exact.norm() < 0.08


# ---------------------------------------------------------------- fp8 policy


def _tiny_lm(registry):
    from abl.contracts.config import ModelConfig
    from abl.model.decoder import DecoderLM

    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, context=16, vocab_size=64)
    comps = {axis: {"name": name, "params": registry.get(axis, name).resolve_params({}, axis)[0]}
             for axis, name in (("norm", "rmsnorm"), ("position", "rope"), ("mixer", "mha"),
                                ("ffn", "swiglu"), ("block", "pre"))}
    return DecoderLM(cfg, comps, registry)


@pytest.mark.parametrize("scaling", ["per_tensor", "per_channel"])
def test_fp8_policy_swaps_linears_keeps_fp32_masters_and_records_emulation(registry, scaling):
    torch.manual_seed(0)
    model = _tiny_lm(registry)
    params_before = {id(p) for p in model.parameters()}
    policy = FP8(scaling=scaling)
    assert policy.info()["emulated"] is True  # before setup nothing is claimed
    policy.setup(model, CPU)
    info = policy.info()
    assert info["emulated"] is True and info["precision"] == "fp8" and info["fp8_scaling"] == scaling
    assert "emulated" in info["fp8_gemm"]
    assert isinstance(model.lm_head, nn.Linear) and not isinstance(model.lm_head, FP8Linear)
    swapped = [m for m in model.modules() if isinstance(m, FP8Linear)]
    assert len(swapped) == info["fp8_layers"] > 0
    assert all(not m.real for m in swapped)
    assert {id(p) for p in model.parameters()} == params_before  # same fp32 master parameters
    x = torch.randint(0, 64, (2, 16))
    with policy.autocast(CPU):
        _, loss, _ = model(x, x)
    loss.backward()
    for p in model.parameters():
        assert p.dtype == torch.float32
        assert p.grad is not None and p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all()


def test_fp8_linear_gradients_use_e5m2_and_stay_close():
    torch.manual_seed(0)
    lin = nn.Linear(32, 16)
    fp8 = FP8Linear(copy.deepcopy(lin), per_channel=False, real=False)
    x = torch.randn(8, 32, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    lin(x).sum().backward()
    fp8(x2).sum().backward()
    for a, b in ((x.grad, x2.grad), (lin.weight.grad, fp8.weight.grad)):
        assert (a - b).norm() / a.norm() < 0.15  # E5M2 gradients: 2 mantissa bits
    torch.testing.assert_close(lin.bias.grad, fp8.bias.grad)


# ---------------------------------------------------------------- through the trainer

GRID = {
    "experiment": {"name": "p", "seeds": [0]},
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 4, "context": 32},
    "train": {"steps": 3, "batch_size": 4, "warmup_steps": 1, "eval_every": 3, "eval_batches": 1},
    "dataset": {"pystdlib": {"max_bytes": 200_000}},
}


class _Sink:
    def __init__(self):
        self.rows = []

    def log(self, step, metrics):
        self.rows.append((step, dict(metrics)))


@pytest.mark.parametrize("precision,params", [("fp16", {}), ("fp8", {"scaling": "per_channel"}),
                                              ("tf32", {})])
def test_precisions_train_and_record_what_ran(registry, precision, params):
    from abl.grid.gridfile import expand
    from abl.train.loop import train

    grid = copy.deepcopy(GRID)
    grid["train"]["precision"] = precision
    if params:
        grid["precision"] = {precision: params}
    cell = expand(grid, registry).cells[0]
    sink, info = _Sink(), {}
    train(cell, registry, sink, on_info=info.update)
    steps = [m for s, m in sink.rows if "train_loss" in m]
    assert len(steps) == 3
    if precision == "fp16":
        assert all("loss_scale" in m and "skipped_steps" in m for m in steps)
        assert info["precision"] == "fp16" and info["emulated"] is False
    elif precision == "fp8":
        assert info["emulated"] is True and info["fp8_scaling"] == "per_channel" and info["fp8_layers"] > 0
    else:
        assert info["effective_precision"] == "fp32" and info["tf32_active"] is False


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="real fp8 GEMMs need an H100-class GPU (sm_90+)")
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_real_fp8_matches_the_emulation_on_h100(per_channel):  # pragma: no cover - needs a GPU
    dev = torch.device("cuda")
    a, b = torch.randn(50, 96, device=dev), torch.randn(96, 40, device=dev)  # padded to 16 inside
    real = fp8_matmul(a, b, E4M3, E4M3, per_channel, torch.float32, real=True)
    emul = fp8_matmul(a, b, E4M3, E4M3, per_channel, torch.float32, real=False)
    assert (real - emul).abs().max() <= 2e-2 * emul.abs().max()
    lin = nn.Linear(96, 40).to(dev)
    policy = FP8(scaling="per_channel" if per_channel else "per_tensor")
    policy.setup(nn.Sequential(lin), dev)
    assert policy.info()["emulated"] is False
