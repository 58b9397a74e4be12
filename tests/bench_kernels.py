"""pytest-benchmark suite over the kernel ops (not collected by default: the file name is not test_*).

Run it explicitly:

    python -m pytest tests/bench_kernels.py --benchmark-enable -m bench

On CUDA every provider available is timed (triton, torch, torch.compile); on
CPU the torch providers only (the Triton interpreter is not a timing path).
``abl bench kernels`` measures the same cases with p20/p50/p80 and stores them.
"""

import pytest
import torch

from abl.bench.kernelbench import available_providers, build_cases

pytestmark = pytest.mark.bench

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPE = "bf16" if DEVICE.type == "cuda" else "fp32"
AVAILABLE = [p for p, why in available_providers(DEVICE).items()
             if why is None and p in ("triton", "torch", "torch.compile")]
CASES = {c.op: c for c in build_cases(DEVICE, [DTYPE], "auto",
                                      ["rmsnorm", "layernorm", "rope", "swiglu", "geglu", "cross_entropy",
                                       "linear_cross_entropy", "flash_attention", "ssd_scan"])}
if "torch.compile" in AVAILABLE:
    import torch._functorch.config as functorch_config

    functorch_config.donated_buffer = False  # a compiled backward run twice needs it off


def _fn(case, provider):
    fn = case.providers["torch" if provider == "torch.compile" else provider]
    return torch.compile(fn, dynamic=False) if provider == "torch.compile" else fn


def _sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


@pytest.mark.parametrize("provider", AVAILABLE)
@pytest.mark.parametrize("pass_", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("op", sorted(CASES))
def test_kernel(benchmark, op, pass_, provider):
    case = CASES[op]
    if case.make is None:
        pytest.skip(case.notes.get("*", "unavailable"))
    args, leaves = case.make(DEVICE)
    fn = _fn(case, provider)
    benchmark.extra_info.update(op=op, shape=case.shape, dtype=case.dtype, provider=provider, device=str(DEVICE))

    def step():
        for t in leaves:
            t.grad = None
        out = fn(*args)
        out = out[0] if isinstance(out, (tuple, list)) else out
        if pass_ == "fwd+bwd":
            out.backward(torch.ones_like(out))
        _sync()

    step()  # compile / warm up outside the timing
    benchmark(step)
