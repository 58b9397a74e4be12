"""``abl selftest --quick`` (issue 40, item 7): fast, and still every kernel.

Making the quick run faster must not drop an op: its kernel section, run in the
Triton interpreter in a fresh process, reaches every Triton function defined in
abl.kernels (each launched kernel, each helper a kernel calls, each combine
function of a reduction), and checks every op of ``abl.kernels.OPS`` forward and
backward. The quick training cell on CPU stays a real cell (two steps, the
second under the memory tracker, an evaluation) while the full run's cells are
what they were.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import torch

from abl.bench import selftest_training as tr

CPU = torch.device("cpu")
CUDA = torch.device("cuda", 0)

# Run in a child: the interpreter must be on before triton is imported, and the recording
# patches triton's interpreter classes, which must not leak into other tests.
_PROBE = textwrap.dedent("""
    import importlib, json, pkgutil, sys
    from abl.kernels import enable_interpreter
    enable_interpreter()
    import torch
    from triton.runtime import interpreter
    from triton.runtime.autotuner import Autotuner, Heuristics
    import abl.kernels as K
    from abl.bench.selftest_kernels import check_kernels

    def name(fn):
        return f"{fn.__module__}.{fn.__qualname__}"

    reached = set()
    Interpreted = interpreter.InterpretedFunction
    run, call = Interpreted.run, Interpreted.__call__
    combine = interpreter.ReduceScanOpInterface.__init__

    def traced_run(self, *a, **k):  # a launch: kernel[grid](...)
        reached.add(name(self.fn))
        return run(self, *a, **k)

    def traced_call(self, *a, **k):  # a @triton.jit helper called from a kernel
        reached.add(name(self.fn))
        return call(self, *a, **k)

    def traced_combine(self, axis, combine_fn, *a, **k):  # tl.reduce / tl.associative_scan's function
        if isinstance(combine_fn, Interpreted):
            reached.add(name(combine_fn.fn))
        return combine(self, axis, combine_fn, *a, **k)

    Interpreted.run, Interpreted.__call__ = traced_run, traced_call
    interpreter.ReduceScanOpInterface.__init__ = traced_combine

    defined = set()
    for info in pkgutil.iter_modules(K.__path__):
        module = importlib.import_module(f"abl.kernels.{info.name}")
        for obj in vars(module).values():
            while isinstance(obj, (Autotuner, Heuristics)):
                obj = obj.fn
            if isinstance(obj, Interpreted) and obj.fn.__module__ == module.__name__:
                defined.add(name(obj.fn))

    rows, why = check_kernels(torch.device("cpu"), quick=sys.argv[1] == "quick")
    print(json.dumps({"why": why, "defined": sorted(defined), "reached": sorted(reached),
                      "rows": [{k: r[k] for k in ("op", "pass", "dtype", "ok", "detail")} for r in rows]}))
""")


def _probe(mode: str) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_quick_kernel_section_reaches_every_triton_function_and_checks_every_op_both_ways():
    from abl.kernels import OPS

    got = _probe("quick")
    assert got["why"] is None
    # the probe finds the kernels (a guard against a probe that looks nowhere)
    assert len(got["defined"]) >= len(OPS) and "abl.kernels.rmsnorm._rmsnorm_fwd_kernel" in got["defined"]
    missing = sorted(set(got["defined"]) - set(got["reached"]))
    assert not missing, f"abl selftest --quick never runs these Triton functions: {missing}"
    for op in OPS:
        for pass_ in ("fwd", "bwd"):
            rows = [r for r in got["rows"] if r["op"] == op and r["pass"] == pass_]
            assert {r["dtype"] for r in rows} == {"fp32", "bf16"}, (op, pass_)
            assert all(r["ok"] for r in rows), [r["detail"] for r in rows if not r["ok"]]


def test_quick_training_cell_on_cpu_is_small_but_real(registry):
    from abl.grid.gridfile import expand

    cells, _ = tr.plan(CPU, quick=True, registry=registry)
    assert ("fp32", "triton", False) in cells  # the Triton backend still trains (in the interpreter)
    s = tr.sizes(CPU, quick=True)
    # two steps: the second runs under the memory tracker (abl.train.loop.memory_tracked), the
    # first gives the step time; one evaluation at the end
    assert s["train"]["steps"] == 2 and s["train"]["eval_batches"] >= 1
    grid = expand(tr.grid_raw(CPU, True, cells), registry, source="test")
    cell = next(c for c in grid.cells if c.train.kernels == "triton")
    assert cell.train.eval_every == cell.train.steps and not cell.eval.decode
    assert cell.train.warmup_steps < cell.train.steps  # both steps learn (lr > 0)
    # more than one of the interpreter's 16-token attention tiles, the last one masked
    assert cell.model.context > 16 and cell.model.context % 16


def test_the_full_run_and_the_gpu_cells_are_unchanged(registry):
    from abl.grid.gridfile import expand

    assert tr.sizes(CPU, quick=False) == {"model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32},
                                          "train": {"steps": 20, "batch_size": 4, "warmup_steps": 2}}
    for quick, steps in ((True, 30), (False, 60)):
        assert tr.sizes(CUDA, quick) == {"model": {"d_model": 256, "n_layers": 4, "n_heads": 4, "context": 256},
                                         "train": {"steps": steps, "batch_size": 16, "warmup_steps": 5}}
    cells, _ = tr.plan(CPU, quick=False, registry=registry)
    raw = tr.grid_raw(CPU, False, cells)
    assert "eval" not in raw and raw["train"]["eval_batches"] == 2  # decoding benchmark on, two batches
    cell = expand(raw, registry, source="test").cells[0]
    assert cell.eval.decode and cell.train.eval_batches == 2
