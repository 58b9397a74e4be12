"""Every op against its fp32 ground truth under both error bounds (abl.kernels.utils.check_error):
the fixed TOLERANCE and FlashAttention's tests' rule (at most 2x torch's own low-precision error on
the same inputs, plus a floor). The same inputs and checks as abl selftest's kernel section."""

import pytest
import torch

from abl.kernels import OPS
from abl.kernels.autoselect import check_op, first, make_inputs
from abl.kernels.utils import ERROR_FLOOR, LOWP_MULTIPLE, check_error, interpreting

from .helpers import DTYPE_NAMES, assert_bounded

SMALL = {  # one interpreter-sized shape per op, with masked tails
    "rmsnorm": (7, 100), "layernorm": (16, 64), "rope": (1, 2, 9, 48), "swiglu": (7, 50), "geglu": (16, 96),
    "cross_entropy": (9, 300), "linear_cross_entropy": (17, 32, 300), "flash_attention": (1, 2, 37, 32),
    "ssd_scan": (1, 37, 2, 24, 20),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: DTYPE_NAMES[d])
@pytest.mark.parametrize("op", list(OPS))
def test_every_op_within_both_bounds(op, dtype, device):
    rows = check_op(op, SMALL[op], dtype, torch.device(device))
    assert [r["pass"] for r in rows] == ["fwd", "bwd"]
    for r in rows:
        assert r["ok"], f"{op} {r['pass']}: {r['detail']}"
        assert r["tolerance"] <= r["fixed"] and r["torch_error"] is not None


def test_helper_checks_the_forward_of_flash_attention(device):
    torch.manual_seed(0)
    inp = make_inputs("flash_attention", (1, 2, 40, 64), torch.bfloat16, torch.device(device))
    truth = first(inp.reference(*inp.fp32_args()))
    c = assert_bounded("out", first(inp.kernel(*inp.args)), truth, first(inp.torch_path(*inp.args)), torch.bfloat16)
    assert 0 < c.torch_error < c.bound < c.fixed


def test_the_relative_rule_catches_what_the_fixed_bound_passes():
    torch.manual_seed(0)
    truth = torch.randn(4096)
    torch_out = truth.to(torch.bfloat16)  # rounding only: ~2^-9 of the largest value
    bad = (truth * 1.01).to(torch.bfloat16)  # 1% off: a lost tile's worth, inside bf16's fixed 2.5e-2
    c = check_error(bad, truth, torch_out, torch.bfloat16)
    assert c.error < c.fixed and not c.ok
    floor = ERROR_FLOOR["bfloat16"] * (2 if interpreting() else 1)  # the interpreter truncates to bf16
    assert c.bound == pytest.approx(LOWP_MULTIPLE * c.torch_error + floor, rel=1e-6)
    assert check_error(torch_out, truth, torch_out, torch.bfloat16).ok
    # without torch's path only the fixed bound holds
    assert check_error(bad, truth, None, torch.bfloat16).ok
