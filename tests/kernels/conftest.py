"""Kernel tests: every Triton kernel against its torch reference, forward and backward.

Without a CUDA device the kernels run in the Triton interpreter, which must be
switched on before anything imports triton (torch.compile imports it too).
This conftest is loaded when pytest enters tests/kernels/, which it collects
before the tests/test_*.py modules (directories and files are collected in
name order), so the variable is set first. With a CUDA device and no
TRITON_INTERPRET in the environment, the same tests run the compiled kernels
on the GPU. (The folder is a package, so this conftest is imported as
``kernels.conftest`` and does not shadow tests/conftest.py.)
"""

import os
import sys

import pytest

if "triton" not in sys.modules and not os.environ.get("TRITON_INTERPRET"):
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

triton = pytest.importorskip("triton")
import torch  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"


def _interpreter_is_active() -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(triton.language.zeros, InterpretedFunction)


def _interpreter_too_old() -> bool:
    # before 3.7 the interpreter cannot loop to a runtime bound (range(0, V, BLOCK))
    major, minor = (int(v) for v in triton.__version__.split(".")[:2])
    return (major, minor) < (3, 7)


def pytest_collection_modifyitems(config, items):
    reason = None
    if DEVICE == "cpu" and not _interpreter_is_active():
        reason = ("triton was imported before TRITON_INTERPRET=1 was set, so its kernels cannot run on "
                  "CPU; run with TRITON_INTERPRET=1 in the environment")
    elif DEVICE == "cpu" and _interpreter_too_old():
        reason = f"the Triton interpreter of triton {triton.__version__} is too old (needs >= 3.7)"
    if reason:
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if "kernels" in item.path.parts and item.path.name.startswith("test_kernels_"):
                item.add_marker(skip)


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture
def probe_on_cpu(monkeypatch, device):
    """The GPU probe's stages at tiny sizes in the interpreter: its CUDA-only timer (``probe_kernels.cuda_ms``)
    swapped for one timed CPU call, so every line of a stage's code runs without a GPU. Skipped on a GPU,
    where the probe itself runs them."""
    import time

    from abl.bench import probe_kernels

    if device != "cpu":
        pytest.skip("the interpreter run; on a GPU the probe itself runs it")

    def one_call_ms(fn, leaves=None, rep=40):
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    monkeypatch.setattr(probe_kernels, "cuda_ms", one_call_ms)
