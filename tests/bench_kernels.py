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


# Self-consistency (issue 27, 2): ``abl bench kernels`` once reported rope fwd+bwd at 21.9 ms against
# 0.38 + 0.89 ms for its fwd and bwd, on a CPU that other jobs kept busy. The bench's fwd+bwd should be
# its fwd + bwd within noise. Noise is the measured p20-p80 spread: the ratio fwd+bwd / (fwd + bwd) is
# known only to lie in [fwd+bwd p20 / (fwd p80 + bwd p80), fwd+bwd p80 / (fwd p20 + bwd p20)]. Beyond
# noise, separate passes cannot share everything a fused one does: the bwd pass reruns a retained
# graph, while fwd+bwd builds and frees one each call (its saved tensors, fresh allocations). On an
# idle or a busy 2-core CPU at one thread that gave ratios up to 1.6 (p50s: swiglu 3.21 ms vs
# 0.70 + 1.33) with the p20-p80 band still reaching below 1.25; so the band must reach into
# [1 / SYSTEMATIC, SYSTEMATIC]. A band wider than DECIDES (its p80 end over its p20 end) decides
# nothing: a fwd whose p80 is 8 ms against a p50 of 0.09 ms (measured, torch's default threads on a busy
# 2-core CPU) makes any ratio agree, so such an attempt does not count. A load burst that lands on one
# pass alone can still spoil an attempt: the op is measured again, up to ATTEMPTS times, and fails only
# if no attempt agrees.
SYSTEMATIC = 1.5
DECIDES = 4.0
ATTEMPTS = 3
CONSISTENCY_OPS = ["rope", "rmsnorm", "layernorm", "swiglu"]


def ratio_band(rows):
    by = {r["pass"]: r for r in rows}
    f, b, fb = by["fwd"], by["bwd"], by["fwd+bwd"]
    return fb["p20"] / (f["p80"] + b["p80"]), fb["p50"] / (f["p50"] + b["p50"]), fb["p80"] / (f["p20"] + b["p20"])


@pytest.mark.parametrize("op", CONSISTENCY_OPS)
def test_fwd_plus_bwd_agrees_with_fwd_and_bwd(benchmark, op):
    import os

    from abl.bench.kernelbench import PASSES, run_bench

    attempts = []

    def measure():
        rows = run_bench(DEVICE, ops=[op], providers=["torch"], dtypes=[DTYPE], passes=list(PASSES))
        attempts.append({"load_1min": os.getloadavg()[0], "timing": rows[0]["timing"],
                         **{f"{r['pass']} p20/p50/p80 ms": [round(r[q], 4) for q in ("p20", "p50", "p80")]
                            for r in rows},
                         "ratio band (p20-based, p50, p80-based)": [round(x, 3) for x in ratio_band(rows)]})
        return ratio_band(rows)

    def agrees(band):
        return band[2] / band[0] <= DECIDES and band[0] <= SYSTEMATIC and band[2] >= 1 / SYSTEMATIC

    band = benchmark.pedantic(measure, rounds=1, iterations=1)
    while not agrees(band) and len(attempts) < ATTEMPTS:
        band = measure()
    benchmark.extra_info.update(op=op, device=str(DEVICE), dtype=DTYPE, attempts=attempts)
    assert agrees(band), (
        f"{op}: fwd+bwd / (fwd + bwd) lies in [{band[0]:.2f}, {band[2]:.2f}] (p50 {band[1]:.2f}): wider than "
        f"{DECIDES}x or outside [1/{SYSTEMATIC}, {SYSTEMATIC}] in all {len(attempts)} attempts: {attempts}")
