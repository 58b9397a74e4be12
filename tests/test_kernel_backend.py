"""The kernel backend: one object, resolved once from train.kernels and the device, owned by the
model and active only while its forward runs. No Triton kernel runs here (no GPU, no interpreter
needed): the forward is stopped before the first op, or counted on the torch path."""

import contextlib
import dataclasses
import threading

import pytest
import torch

from abl import kernels
from abl.contracts.config import ModelConfig
from abl.kernels import TORCH, KernelBackend, resolve
from abl.model.decoder import DecoderLM, ForwardContext

TRITON = KernelBackend("triton")


@pytest.fixture
def no_interpreter(monkeypatch):
    """Fail if resolve() tries to switch the Triton interpreter on (it must not on CUDA)."""

    def refuse():
        raise AssertionError("the interpreter was asked for")

    monkeypatch.setattr(kernels, "enable_interpreter", refuse)


def test_auto_resolves_to_triton_only_on_cuda(no_interpreter):
    # torch.device("cuda") is only a name: nothing touches a GPU. Without the run's shapes auto measures
    # nothing, so no kernel is verified and every op takes its torch path (tests/test_autoselect.py: with them)
    for cuda in (torch.device("cuda"), torch.device("cuda", 1), "cuda", "cuda:0"):
        backend = resolve("auto", cuda)
        assert backend.triton and not backend.interpreted and backend.torch_ops == frozenset(kernels.OPS)
        assert backend.info()["kernel_torch_ops"] == sorted(kernels.OPS)
    for other in (torch.device("cpu"), "cpu", torch.device("meta")):
        assert resolve("auto", other) == TORCH
    assert resolve("torch", torch.device("cuda")) == TORCH
    assert resolve("triton", torch.device("cuda")) == TRITON


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.setattr(kernels, "enable_interpreter", lambda: True)
    assert resolve("triton", torch.device("cpu")) == KernelBackend("triton", interpreted=True)
    monkeypatch.setattr(kernels, "enable_interpreter", lambda: False)
    with pytest.raises(ValueError, match="needs the Triton interpreter"):
        resolve("triton", torch.device("cpu"))
    assert resolve("auto", torch.device("cpu")) == TORCH  # auto never needs it


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="train.kernels must be"):
        resolve("cuda", "cpu")
    with pytest.raises(ValueError, match="'triton' or 'torch'"):
        KernelBackend("cuda")
    with pytest.raises(ValueError, match="only the triton backend"):
        KernelBackend("torch", interpreted=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        TORCH.name = "triton"  # type: ignore[misc]


def test_activation_is_scoped_nested_and_per_thread():
    assert kernels.active() == TORCH and not kernels.use_triton()
    with TRITON.activate():
        assert kernels.use_triton()
        with TORCH.activate():
            assert not kernels.use_triton()
        assert kernels.use_triton()
        seen = []
        t = threading.Thread(target=lambda: seen.append(kernels.active()))
        t.start()
        t.join()
        assert seen == [TORCH]  # not a process-wide switch
    assert kernels.active() == TORCH


def tiny_model(registry, backend):
    cfg = ModelConfig(d_model=16, n_layers=2, n_heads=2, context=8, vocab_size=32)
    comps = {}
    for axis, name in (("norm", "rmsnorm"), ("block", "pre"), ("position", "rope"), ("mixer", "mha"),
                       ("ffn", "swiglu")):
        params, errs = registry.get(axis, name).resolve_params({}, name)
        assert not errs
        comps[axis] = {"name": name, "params": params}
    torch.manual_seed(0)
    return DecoderLM(cfg, comps, registry, kernel_backend=backend)


class Stop(Exception):
    pass


def test_the_model_activates_its_backend_only_during_its_forward(registry):
    model = tiny_model(registry, TRITON)
    seen = []

    def look_then_stop(module, args):
        seen.append(kernels.active())
        raise Stop  # before any op could call a Triton kernel

    model.blocks[0].register_forward_pre_hook(look_then_stop)
    assert kernels.active() == TORCH
    with pytest.raises(Stop):
        model(torch.zeros(1, 4, dtype=torch.long))
    assert seen == [TRITON]
    assert kernels.active() == TORCH  # restored, even though the forward raised

    # a model's own backend wins over whatever is active around it
    torch_model = tiny_model(registry, TORCH)
    torch_model.blocks[0].register_forward_pre_hook(lambda m, a: seen.append(kernels.active()))
    with TRITON.activate():
        torch_model(torch.zeros(1, 4, dtype=torch.long))
    assert seen == [TRITON, TORCH]


def test_the_flop_counter_counts_on_the_torch_path_and_leaves_the_backend(registry):
    from abl.model.flops import count_step_flops

    model = tiny_model(registry, TRITON)
    seen = []
    model.blocks[0].register_forward_pre_hook(lambda m, a: seen.append(kernels.active()))
    x = torch.randint(0, 32, (2, 8))
    flops = count_step_flops(model, x, x, lambda: ForwardContext(position=model.position, need_logits=False),
                             contextlib.nullcontext)
    assert flops > 0 and seen == [TORCH]
    assert model.kernel_backend == TRITON


def test_no_kernels_string_is_passed_around(registry):
    assert "kernels" not in {f.name for f in dataclasses.fields(ForwardContext)}
    with pytest.raises(TypeError):
        ForwardContext(position=None, kernels="torch")  # type: ignore[call-arg]
    model = tiny_model(registry, TORCH)
    assert not hasattr(model, "kernels") and model.kernel_backend == TORCH
    for gone in ("set_backend", "backend", "using"):
        assert not hasattr(kernels, gone)


def test_the_cache_key_of_a_backend_names_the_ops_it_routes_to_torch():
    """An auto run's memory and step-time figures are not a pure triton run's: their cache keys differ."""
    from abl.kernels import TORCH, KernelBackend

    assert TORCH.key == "torch" and KernelBackend("triton").key == "triton"
    routed = KernelBackend("triton", torch_ops=frozenset({"ssd_scan", "layernorm"}))
    assert routed.key == "triton-torch:layernorm,ssd_scan" != KernelBackend("triton").key
