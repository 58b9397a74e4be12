"""Compile every kernel configuration the launchers can pick for an H100 (sm_90), without a GPU.

Two classes of defect depend only on how Triton compiles a kernel, so they can be
caught on a machine with no GPU (``python -m abl.kernels.compilecheck``; CI runs
it from tests/kernels/test_compilecheck.py):

- **Asynchronous-MMA buffer hazards.** On sm_90 Triton issues ``tl.dot`` as
  ``wgmma.mma_async`` (``ttng.warp_group_dot {isAsync = true}`` in TTGIR), which
  reads its shared-memory operands after the instruction has been issued, until a
  ``wgmma.wait_group`` retires it. Triton's software pipeliner prefetches the next
  iteration's tiles with ``cp.async`` (``ttg.async_copy_global_to_local``) into a
  ring of shared buffers. When the ring has a single slot and the copy into it
  comes before a wait (``warp_group_dot_wait {pendings = N}``, which waits for
  all but the N most recent groups) retires the MMA reading it, the copy overwrites an operand the tensor cores may still be
  reading: a write-after-read race whose result depends on timing (run-to-run
  varying gradients; the class of bug Triton PR #3106 fixed once). The check finds
  every asynchronous MMA operand that traces back to a mutable shared allocation,
  every asynchronous copy into the same allocation in the same loop, and fails
  unless a wait that retires the MMA lies between it and the copy on the loop's path.
- **Register spills** above a budget, from ``ptxas -v`` on the kernel's PTX (the
  ptxas that ships in the triton wheel).
- **Rows not read as vectors** (``narrow_accesses``, for the kernels of ``VECTOR_KERNELS``): a
  memory-bound kernel on 16-bit rows that Triton knows are 16-byte aligned must not load or store
  them 2 bytes at a time (``ld.global.b16``/``st.global.b16`` in the PTX). The RoPE kernel's old
  interleaved path did, and was the slowest kernel of the 126M cell on an H100 (docs/kernels.md).

The launches are the launchers' own: under ``abl.kernels.utils.compile_check()``
they choose their CUDA tiles for CPU tensors and (where they try several in
turn) launch every tile they could pick; Triton's JIT is pointed at an sm_90
target through a stand-in driver, and each launch's exact specialization
(signature, constexprs, alignment attributes, warps, stages) is recorded instead
of compiled and run. This module must run in a process without
``TRITON_INTERPRET=1`` (the interpreter replaces the JIT).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator

# The spill budget: bytes of spill stores per thread a shipped configuration may have.
SPILL_BUDGET_BYTES = 0
# Shared memory one block may use on an H100 (sm_90: 227 KiB); a configuration needing more can never launch.
SM90_SHARED_BYTES = 232448


@dataclass
class Launch:
    """One kernel launch as Triton's JIT specialised it."""

    kernel: str
    case: str
    num_warps: int
    num_stages: int
    fn: Any = field(repr=False, compare=False)
    signature: dict = field(repr=False, compare=False)
    constexprs: dict = field(repr=False, compare=False)
    attrs: dict = field(repr=False, compare=False)
    options: dict = field(repr=False, compare=False)

    @property
    def key(self) -> tuple:
        consts = tuple(sorted((str(k), repr(v)) for k, v in self.constexprs.items()))
        return (self.kernel, tuple(sorted(self.signature.items())), consts, repr(sorted(self.attrs.items())),
                self.num_warps, self.num_stages)

    @property
    def label(self) -> str:
        blocks = ",".join(f"{k}={v}" for k, v in self._named_constexprs().items()
                          if k.startswith("BLOCK") or k == "HEAD_DIM")
        return f"{self.kernel}[{blocks}, warps={self.num_warps}, stages={self.num_stages}] ({self.case})"

    def _named_constexprs(self) -> dict:
        names = list(self.fn.arg_names) if hasattr(self.fn, "arg_names") else []
        out = {}
        for k, v in self.constexprs.items():
            idx = k[0] if isinstance(k, tuple) else k
            name = names[idx] if isinstance(idx, int) and idx < len(names) else str(k)
            out[name] = getattr(v, "value", v)
        return out


@dataclass
class Result:
    label: str
    kernel: str
    registers: int | None
    spill_store_bytes: int | None
    spill_load_bytes: int | None
    stack_bytes: int | None
    shared_bytes: int | None
    hazards: list[str]
    error: str | None = None

    @property
    def ok(self) -> bool:
        return (self.error is None and not self.hazards
                and (self.spill_store_bytes or 0) <= SPILL_BUDGET_BYTES
                and (self.shared_bytes or 0) <= SM90_SHARED_BYTES)


class _Sm90Driver:
    """A stand-in for Triton's active driver: an sm_90 target, no device behind it."""

    def __init__(self, real):
        from triton.backends.compiler import GPUTarget

        self._real = real
        self.target = GPUTarget("cuda", 90, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return "abl-compilecheck-sm90"

    def get_current_stream(self, device=None):
        return 0

    def __getattr__(self, name):  # anything else the JIT asks of a driver
        return getattr(self._real, name)


@contextlib.contextmanager
def recording(case: str) -> Iterator[list[Launch]]:
    """Inside the block, kernel launches are recorded (not compiled, not run); launchers
    choose their CUDA configurations (``compile_check``)."""
    from triton.runtime.driver import driver as active_driver
    from triton.runtime.jit import JITFunction

    from .utils import compile_check

    launches: list[Launch] = []
    real_do_compile = JITFunction._do_compile

    def record(self, key, signature, device, constexprs, options, attrs, warmup):
        launches.append(Launch(kernel=self.fn.__name__, case=case, num_warps=options.num_warps,
                               num_stages=options.num_stages, fn=self, signature=dict(signature),
                               constexprs=dict(constexprs), attrs=dict(attrs), options=dict(options.__dict__)))
        return None  # no kernel: the JIT returns without launching

    previous = active_driver._active
    fake = _Sm90Driver(previous)
    active_driver.set_active(fake)
    JITFunction._do_compile = record  # type: ignore[method-assign]
    try:
        with compile_check():
            yield launches
    finally:
        JITFunction._do_compile = real_do_compile  # type: ignore[method-assign]
        active_driver._active = previous
        for fn in {id(x.fn): x.fn for x in launches}.values():
            fn.device_caches.pop("abl-compilecheck-sm90", None)


# ---------------------------------------------------------------- what the launchers can pick


def _attention_cases():
    import torch

    from .flash_attention import flash_attention_triton

    # Every tile of every (kernel, head-dim class, dtype class) with the causal mask; the other
    # masks' code (no mask, window + ALiBi) in bf16 at the head dims the models use most. fp16
    # compiles as bf16 does (same tiles, same layouts), so it is checked at one head dim.
    plan = [(torch.bfloat16, d, "causal") for d in (64, 128, 256)]
    plan += [(torch.bfloat16, d, v) for d in (64, 128) for v in ("full", "window+alibi")]
    plan += [(torch.float16, 128, "causal"), (torch.bfloat16, 128, "alibi")]
    plan += [(torch.float32, d, "causal") for d in (64, 128, 256)] + [(torch.float32, 64, "causal tf32")]
    masks = {"causal": dict(causal=True), "full": dict(causal=False), "alibi": dict(alibi_slopes=torch.ones(4)),
             "window+alibi": dict(causal=True, window=64, alibi_slopes=torch.ones(4))}
    for dtype, d, name in plan:
        def run(dtype=dtype, d=d, kw=masks[name.split()[0]], tf32=name.endswith("tf32")):
            q = torch.zeros(1, 4, 256, d, dtype=dtype, requires_grad=True)
            k = torch.zeros(1, 2, 256, d, dtype=dtype, requires_grad=True)
            v = torch.zeros(1, 2, 256, d, dtype=dtype, requires_grad=True)
            before = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32  # the tf32 precision policy's products
            try:
                o = flash_attention_triton(q, k, v, **kw)
                o.backward(torch.zeros_like(o))
            finally:
                torch.backends.cuda.matmul.allow_tf32 = before
        yield f"flash_attention {str(dtype)[6:]} D{d} {name}", run


def _ssd_cases():
    from .ssd_scan import compile_check_cases

    return compile_check_cases()


def _rope_cases():
    from .rope import compile_check_cases

    return compile_check_cases()


CASES: dict[str, Callable[[], Iterator[tuple[str, Callable[[], None]]]]] = {
    "flash_attention": _attention_cases,
    "ssd_scan": _ssd_cases,
    "rope": _rope_cases,
}


def register_cases(op: str, cases: Callable[[], Iterator[tuple[str, Callable[[], None]]]]) -> None:
    """Add an op's cases: a generator of (label, function that calls the op forward and backward)."""
    CASES[op] = cases


def launches(ops: list[str] | None = None) -> list[Launch]:
    """Every distinct launch the launchers of ``ops`` (default: all) make for the cases."""
    seen: dict[tuple, Launch] = {}
    for op in ops or list(CASES):
        for case, run in CASES[op]():
            with recording(case) as got:
                try:
                    run()
                except Exception as exc:  # noqa: BLE001 - reported as the case's failure
                    raise RuntimeError(f"{case}: the launch could not be recorded: {exc!r}") from exc
            for launch in got:
                seen.setdefault(launch.key, launch)
    return list(seen.values())


# ---------------------------------------------------------------- compiling and reading


def compile_sm90(launch: Launch):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(launch.fn, launch.signature, launch.constexprs, launch.attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=launch.options)


def ptxas_path() -> str:
    """The ptxas this triton compiles sm_90 with (its wheel ships two; each triton picks by arch)."""
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(90).path


def ptxas_usage(ptx: str) -> dict[str, int]:
    """Registers, spill bytes and stack frame of the PTX's kernel, from ``ptxas -v`` for sm_90a."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as fh:
            fh.write(ptx)
        out = subprocess.run([ptxas_path(), "-v", "--gpu-name", "sm_90a", src, "-o", os.path.join(tmp, "k.o")],
                             capture_output=True, text=True, check=True)
    text = out.stdout + out.stderr
    usage: dict[str, int] = {}
    for key, pattern in (("registers", r"Used (\d+) registers"), ("stack", r"(\d+) bytes stack frame"),
                         ("spill_stores", r"(\d+) bytes spill stores"),
                         ("spill_loads", r"(\d+) bytes spill loads")):
        found = re.findall(pattern, text)
        usage[key] = max(int(x) for x in found) if found else 0
    return usage


_SSA = r"%[\w.#]+"
_DEF = re.compile(rf"^\s*({_SSA}(?::\d+)?(?:\s*,\s*{_SSA})*)\s*=\s*([\w.]+)(.*)$")


def _defs(line: str) -> tuple[list[str], str, str] | None:
    m = _DEF.match(line)
    if not m:
        return None
    names = [n.strip().split(":")[0] for n in m.group(1).split(",")]
    return names, m.group(2), m.group(3)


def _operands(rest: str) -> list[str]:
    head = rest.split(":", 1)[0] if " : " in rest else rest
    head = re.split(r"\{", head, maxsplit=1)[0]
    return re.findall(_SSA, head)


def _slots(alloc_type: str) -> int:
    """The number of buffers of a pipelined allocation: the leading dim of its memdesc type."""
    m = re.search(r"memdesc<(\d+)x", alloc_type)
    return int(m.group(1)) if m else 1


def wgmma_hazards(ttgir: str) -> list[str]:
    """Asynchronous MMAs whose shared operand an asynchronous copy may overwrite before a wait retires them.

    Reads TTGIR as text: each ``scf.for`` body is a region; inside it, an async
    ``ttng.warp_group_dot`` operand is traced through views (``memdesc_index``,
    ``memdesc_subview``, ``memdesc_trans``, ``memdesc_reinterpret``) and
    loop-carried arguments to its allocation. An ``async_copy_global_to_local``
    into the same allocation is a hazard unless a ``warp_group_dot_wait {pendings
    = N}`` that retires the MMA (at least N asynchronous MMAs issued after it) comes
    after the MMA and before the copy, going round the loop body.
    """
    lines = ttgir.splitlines()
    root: dict[str, str] = {}
    mutable_alloc: dict[str, str] = {}
    carried: dict[str, list[str]] = {}
    for line in lines:
        d = _defs(line)
        if not d:
            continue
        names, op, rest = d
        if op == "ttg.local_alloc":
            if "mutable" in rest and not _operands(rest):
                mutable_alloc[names[0]] = rest.strip()
            root[names[0]] = names[0]
        elif op in ("ttg.memdesc_index", "ttg.memdesc_subview", "ttg.memdesc_trans",
                    "ttg.memdesc_reinterpret", "ttg.memdesc_reshape", "ttg.memdesc_subslice"):
            ops_ = _operands(rest)
            if ops_:
                root[names[0]] = ops_[0]
        elif op == "scf.for":
            m = re.search(r"iter_args\((.*?)\)\s*->", rest)
            if m:
                for pair in m.group(1).split(","):
                    if "=" in pair:
                        arg, init = (x.strip() for x in pair.split("=", 1))
                        carried.setdefault(arg, []).append(init)

    def alloc_of(name: str, depth: int = 0) -> set[str]:
        if depth > 50:
            return set()
        if name in mutable_alloc:
            return {name}
        found: set[str] = set()
        if name in root and root[name] != name:
            found |= alloc_of(root[name], depth + 1)
        for init in carried.get(name, []):
            found |= alloc_of(init, depth + 1)
        return found

    # loop bodies: indices of lines between an scf.for and its closing brace
    hazards: list[str] = []
    stack: list[int] = []
    bodies: list[tuple[int, int]] = []
    for i, line in enumerate(lines):
        opens, closes = line.count("{"), line.count("}")
        if "scf.for" in line and line.rstrip().endswith("{"):
            stack.append(i)
            continue
        if stack and closes > opens and line.strip().startswith("}"):
            depth_line = line
            # an scf.for body ends at the first dedented "}" that matches its indentation
            start = stack[-1]
            indent_for = len(lines[start]) - len(lines[start].lstrip())
            indent_close = len(depth_line) - len(depth_line.lstrip())
            if indent_close == indent_for:
                stack.pop()
                bodies.append((start + 1, i))
    for start, end in bodies:
        body = list(range(start, end))
        events: list[tuple[int, str, set[str], int]] = []  # (line, kind, allocations, pendings)
        for i in body:
            d = _defs(lines[i])
            text = lines[i]
            if d and d[1] == "ttng.warp_group_dot" and "isAsync = true" in text:
                allocs: set[str] = set()
                for operand in _operands(d[2])[:2]:
                    allocs |= alloc_of(operand)
                events.append((i, "mma", allocs, 0))
            elif d and d[1] == "ttg.async_copy_global_to_local":
                ops_ = _operands(d[2])
                if len(ops_) >= 2:
                    events.append((i, "copy", alloc_of(ops_[1]), 0))
            elif d and d[1] == "ttng.warp_group_dot_wait":
                m = re.search(r"pendings\s*=\s*(\d+)", text)
                events.append((i, "wait", set(), int(m.group(1)) if m else 0))
        n = len(events)
        for a, (line_a, kind_a, allocs_a, _) in enumerate(events):
            if kind_a != "mma":
                continue
            for alloc in sorted(allocs_a):
                # The copy that overwrites the slot this MMA reads: with one slot, the next copy
                # into the allocation (later in this iteration, or in the next); with a ring of
                # slots, the pipeliner writes the slot read in iteration i no earlier than
                # iteration i + 1 (copies later in iteration i fill other slots). The MMA is retired
                # by a wait that leaves fewer groups pending than were issued after it
                # (``wgmma.wait_group N`` waits for all but the N most recent).
                single = _slots(mutable_alloc[alloc]) == 1
                issued_after = 0
                for step in range(1, 2 * n + 1):
                    line_b, kind_b, allocs_b, pendings = events[(a + step) % n]
                    if kind_b == "mma":
                        issued_after += 1
                        continue
                    if kind_b == "wait" and pendings <= issued_after:
                        break
                    if kind_b == "copy" and alloc in allocs_b and (single or a + step >= n):
                        found = (f"async MMA at TTGIR line {line_a + 1} reads {alloc} "
                                 f"({mutable_alloc[alloc].split('->')[-1].split(' loc(')[0].strip()}), which the "
                                 f"async copy at line {line_b + 1} overwrites before a wait retires it")
                        if found not in hazards:  # an inner loop's lines are also in its outer loop's body
                            hazards.append(found)
                        break
    return hazards


_NARROW_GLOBAL = re.compile(r"\b(ld|st)\.global(?:\.[a-z]+)*\.[bsu]16\b")


def narrow_accesses(launch: Launch, ptx: str) -> list[str]:
    """Findings for a launch of a kernel in ``VECTOR_KERNELS`` on 16-bit data whose row strides and
    sizes Triton knows to be multiples of 16 elements: every global load and store of its rows must
    be a vector; a scalar 2-byte ``ld.global``/``st.global`` in the PTX means rows are read or
    written an element at a time (the RoPE kernel's old interleaved path: x at stride 2)."""
    args = VECTOR_KERNELS.get(launch.kernel)
    if args is None or launch.signature.get(args[0]) not in ("*bf16", "*fp16"):
        return []
    names = list(launch.fn.arg_names)
    divisible = {names[k[0]] for k, v in launch.attrs.items()
                 if isinstance(k, tuple) and k and k[0] < len(names) and ["tt.divisibility", 16] in v}
    if not set(args[1]) <= divisible:
        return []
    narrow = [m.group(0) for m in _NARROW_GLOBAL.finditer(ptx)]
    if not narrow:
        return []
    kinds = ", ".join(f"{n} x {k}" for k, n in sorted({k: narrow.count(k) for k in narrow}.items()))
    return [f"{len(narrow)} scalar 16-bit global accesses ({kinds}) where every row is 16-byte aligned: "
            "rows are not read and written as vectors"]


# Kernels whose 16-bit rows must be read and written as vectors when aligned: kernel -> (its data
# pointer argument, the integer arguments that must be multiples of 16 for the rows to be aligned).
VECTOR_KERNELS: dict[str, tuple[str, tuple[str, ...]]] = {
    # the RoPE kernel before issue 36's rewrite (tests/kernels/data/old_rope_kernel.py), and the one now
    "_rope_kernel": ("X", ("stride_xh", "stride_xt", "stride_yh", "stride_yt", "HALF")),
    "_rope_qk_kernel": ("Q", ("stride_qh", "stride_qt", "stride_qoh", "stride_qot", "stride_kh", "stride_kt",
                              "stride_koh", "stride_kot", "HALF")),
}


def check(launch: Launch) -> Result:
    try:
        compiled = compile_sm90(launch)
        ttgir = compiled.asm["ttgir"]
        usage = ptxas_usage(compiled.asm["ptx"])
    except Exception as exc:  # noqa: BLE001 - a configuration that does not compile is a finding
        return Result(launch.label, launch.kernel, None, None, None, None, None, [], error=repr(exc)[:500])
    shared = getattr(compiled.metadata, "shared", None)
    return Result(launch.label, launch.kernel, usage["registers"], usage["spill_stores"], usage["spill_loads"],
                  usage["stack"], shared, wgmma_hazards(ttgir) + narrow_accesses(launch, compiled.asm["ptx"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m abl.kernels.compilecheck", description=__doc__.split("\n")[0])
    parser.add_argument("--op", action="append", help="an op of CASES (default: every op)")
    parser.add_argument("--json", action="store_true", help="one JSON object per configuration")
    parser.add_argument("--shard", default="0/1", help="I/N: check every N-th launch from the I-th (parallel runs)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes"):
        print("compilecheck needs the Triton compiler: unset TRITON_INTERPRET", file=sys.stderr)
        return 2
    import triton

    index, _, count = args.shard.partition("/")
    failed = 0
    for launch in launches(args.op)[int(index)::int(count or 1)]:
        result = check(launch)
        failed += not result.ok
        if args.json:
            print(json.dumps({**asdict(result), "ok": result.ok, "triton": triton.__version__}), flush=True)
        else:
            status = "ok" if result.ok else "FAIL"
            print(f"{status:4} {result.label}: {result.registers} registers, {result.spill_store_bytes} B spill "
                  f"stores, {result.shared_bytes} B shared" + "".join(f"\n     {h}" for h in result.hazards)
                  + (f"\n     {result.error}" if result.error else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
