import math

import pytest

from abl.grid.gridfile import expand
from abl.train.optim import lr_at
from abl.train.loop import train
from abl.train.state import Diverged

GRID = {
    "experiment": {"name": "t", "seeds": [0]},
    "model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "context": 32},
    "train": {"steps": 40, "batch_size": 8, "lr": 3e-3, "warmup_steps": 5, "eval_every": 20,
              "eval_batches": 2},
    "dataset": {"pystdlib": {"max_bytes": 200_000}},
}


class ListSink:
    def __init__(self):
        self.rows = []

    def log(self, step, metrics):
        self.rows.append((step, dict(metrics)))

    def series(self, name):
        return [(s, m[name]) for s, m in self.rows if name in m]


def test_schedule_warms_up_then_decays_to_the_floor():
    class C:
        lr, warmup_steps, steps, min_lr_ratio = 1.0, 10, 110, 0.1

    assert lr_at(0, C) == pytest.approx(0.1)
    assert lr_at(9, C) == pytest.approx(1.0)
    assert lr_at(60, C) == pytest.approx(0.55)
    assert lr_at(110, C) == pytest.approx(0.1)
    assert all(lr_at(s, C) >= lr_at(s + 1, C) for s in range(10, 110))


def test_training_learns_and_records_the_metrics(registry):
    cell = expand(GRID, registry).cells[0]
    sink = ListSink()
    summary = train(cell, registry, sink)
    losses = [v for _, v in sink.series("train_loss")]
    assert len(losses) == 40
    assert losses[-1] < losses[0] - 1.0  # byte-level text: from ~5.5 down well below
    vals = sink.series("val_loss")
    assert [s for s, _ in vals] == [20, 40]
    for name in ("lr", "grad_norm"):
        assert len(sink.series(name)) == 40
    # step 2 runs under the tensor-memory tracker: it records the peak instead of a throughput
    assert [s for s, _ in sink.series("tokens_per_s")] == [1] + list(range(3, 41))
    (step, peak), = sink.series("peak_tensor_bytes")
    assert step == 2 and peak >= 16 * summary["n_params"]  # at least weights, grads, AdamW moments
    assert summary["n_params"] > 0 and summary["peak_mem_bytes"] > 0 and summary["wall_s"] > 0


def test_same_seed_same_losses(registry):
    cell = expand(GRID, registry).cells[0]
    a, b = ListSink(), ListSink()
    cell.train.steps = 5
    train(cell, registry, a)
    train(cell, registry, b)
    assert a.series("train_loss") == b.series("train_loss")


def test_divergence_stops_the_run(registry):
    grid = {**GRID, "train": {**GRID["train"], "lr": 1e6, "warmup_steps": 0, "grad_clip": 0.0,
                              "diverge_loss": 20.0}}
    cell = expand(grid, registry).cells[0]
    sink = ListSink()
    with pytest.raises(Diverged, match="diverged at step"):
        train(cell, registry, sink)
    last = sink.series("train_loss")[-1][1]
    assert not math.isfinite(last) or last > 20.0


TINY = {
    "experiment": {"name": "t", "seeds": [0]},
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 4, "context": 16, "position": "rope", "mixer": "gqa"},
    "train": {"steps": 2, "batch_size": 4, "eval_every": 2, "eval_batches": 1, "threads": 1},
    "dataset": {"pystdlib": {"max_bytes": 200_000}},
}


@pytest.mark.parametrize("off", ["decode", "extrapolation"])
def test_a_switched_off_evaluation_records_none_of_its_metrics(registry, off):
    from abl.train.evaluations import registered

    EVALUATIONS = registered()
    (on,) = {"decode", "extrapolation"} - {off}
    cell = expand({**TINY, "eval": {off: False, on: True}}, registry).cells[0]
    sink = ListSink()
    summary = train(cell, registry, sink)
    recorded = {name for _, row in sink.rows for name in row}
    assert not recorded & set(EVALUATIONS[off].metrics)
    assert not any(off in note for note in summary["notes"])
    assert set(EVALUATIONS[on].metrics) <= recorded  # rope and gqa: every metric of the other one
    # the regular evaluation and the summary do not depend on the switches
    assert [s for s, _ in sink.series("val_loss")] == [2]
    assert {"peak_mem_bytes", "wall_s"} <= recorded


def test_with_every_evaluation_off_training_still_records_its_own_metrics(registry):
    from abl.train.evaluations import registered

    EVALUATIONS = registered()
    cell = expand({**TINY, "eval": {"decode": False, "extrapolation": False, "probes": []}}, registry).cells[0]
    sink = ListSink()
    train(cell, registry, sink)
    recorded = {name for _, row in sink.rows for name in row}
    assert not recorded & {m for e in EVALUATIONS.values() for m in e.metrics}
    assert {"train_loss", "lr", "grad_norm", "val_loss", "n_params", "flops_per_step_measured",
            "peak_mem_bytes", "wall_s"} <= recorded
    assert all(row for _, row in sink.rows)  # no empty row where the evaluations were


def test_the_trainer_builds_the_model_on_the_resolved_kernel_backend(registry, monkeypatch):
    import abl.train.loop as trainer
    from abl.kernels import TORCH

    built = []
    real = trainer.DecoderLM

    def spy(*args, **kwargs):
        model = real(*args, **kwargs)
        built.append(model.kernel_backend)
        return model

    monkeypatch.setattr(trainer, "DecoderLM", spy)
    infos = []
    cell = expand({**TINY, "eval": {"decode": False, "extrapolation": False}}, registry).cells[0]
    train(cell, registry, ListSink(), on_info=infos.append)
    assert built == [TORCH] and infos[0]["kernels"] == "torch"  # train.kernels = auto on CPU
    assert infos[0]["optimizer"] == {"name": "AdamW", "fused": False}  # CPU: the default implementation


def test_divergence_is_reported_at_the_step_whose_loss_diverged(registry):
    """The check reads each step's loss once the step is done: the step it names is the one
    whose loss crossed the bound, and every step before it was recorded below the bound."""
    grid = {**GRID, "train": {**GRID["train"], "lr": 1e6, "warmup_steps": 0, "grad_clip": 0.0,
                              "diverge_loss": 20.0}}
    cell = expand(grid, registry).cells[0]
    sink = ListSink()
    with pytest.raises(Diverged) as raised:
        train(cell, registry, sink)
    losses = sink.series("train_loss")
    step, last = losses[-1]
    assert str(raised.value).startswith(f"diverged at step {step}: ")
    assert [s for s, _ in losses] == list(range(1, step + 1))
    assert all(math.isfinite(v) and v <= 20.0 for _, v in losses[:-1])
    assert not math.isfinite(last) or last > 20.0


def test_no_device_value_is_read_between_the_forward_and_the_backward(registry, monkeypatch):
    """A .item() / float() / bool() of a tensor between a training step's forward and its
    backward makes the host wait for the forward before it can queue the backward."""
    import torch

    import abl.train.loop as trainer
    from abl.model.decoder import DecoderLM

    events: list[str] = []
    stepping = []  # non-empty inside train_step: the loop's steps, not the cost measurement or evaluation

    def recorded(name, real):
        def wrapper(self, *args, **kwargs):
            if stepping:
                events.append(name)
            return real(self, *args, **kwargs)
        return wrapper

    for name in ("item", "__float__", "__bool__", "__int__", "tolist", "backward"):
        monkeypatch.setattr(torch.Tensor, name, recorded(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(DecoderLM, "forward", recorded("forward", DecoderLM.forward))
    real_step = trainer.train_step

    def step(*args, **kwargs):
        stepping.append(True)
        try:
            return real_step(*args, **kwargs)
        finally:
            stepping.pop()
            events.append("end")

    monkeypatch.setattr(trainer, "train_step", step)
    cell = expand({**TINY, "eval": {"decode": False, "extrapolation": False}}, registry).cells[0]
    sink = ListSink()
    train(cell, registry, sink)
    steps = " ".join(events).split("end")[:-1]
    assert len(steps) == 2 and len(sink.series("train_loss")) == 2
    for one in steps:
        calls = one.split()
        assert calls.count("forward") == 1 and calls.count("backward") == 1, calls
        between = calls[calls.index("forward") + 1:calls.index("backward")]
        assert not between, f"read between forward and backward: {between}"


def test_fused_adamw_on_cuda_with_the_same_groups_and_steps():
    """The CUDA branch (the device given as CUDA; the parameters stay on the CPU, where torch's
    fused AdamW runs too): a fused AdamW with each group's hyperparameters, stepping as the
    default implementation does (to rounding); on the CPU the optimizer is left as it is."""
    import torch

    from abl.train.optim import make_optimizer
    from abl.train.loop import fused_where_supported, optimizer_info

    class Cfg:
        lr, beta1, beta2, adam_eps, weight_decay = 1e-2, 0.9, 0.95, 1e-8, 0.1

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))

    plain_model, fused_model = model(), model()
    plain = make_optimizer(plain_model, Cfg)
    assert fused_where_supported(plain, torch.device("cpu")) is plain
    fused = fused_where_supported(make_optimizer(fused_model, Cfg), torch.device("cuda"))
    assert fused.defaults["fused"] is True and optimizer_info(fused) == {"name": "AdamW", "fused": True}
    assert optimizer_info(plain) == {"name": "AdamW", "fused": False}
    for a, b in zip(plain.param_groups, fused.param_groups):
        assert {k: a[k] for k in ("lr", "betas", "eps", "weight_decay")} == \
            {k: b[k] for k in ("lr", "betas", "eps", "weight_decay")}
        assert [id(p) for p in b["params"]] == [id(p) for p in fused_model.parameters() if
                                                any(p is q for q in b["params"])]
    x = torch.randn(32, 8)
    for _ in range(3):
        for m, opt in ((plain_model, plain), (fused_model, fused)):
            opt.zero_grad()
            m(x).square().mean().backward()
            opt.step()
    for p, q in zip(plain_model.parameters(), fused_model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)


def test_fused_adamw_only_where_every_parameter_dtype_has_the_kernel():
    import torch

    from abl.train.loop import fused_where_supported

    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.complex64))
    opt = torch.optim.AdamW([p])
    assert fused_where_supported(opt, torch.device("cuda")) is opt
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(4))], lr=0.1)
    assert fused_where_supported(sgd, torch.device("cuda")) is sgd
