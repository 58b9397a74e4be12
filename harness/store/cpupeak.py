"""A CPU's peaks, measured so that they hold: in CPU time, repeated until stable, never from a busy moment.

MFU on a CPU divides by a measured peak, so the peak must not move between two
identical runs. One 0.1 s matmul at start-up did (MFU 0.169 and 0.088), and so
did short wall-clock bursts measured once on a shared machine: two fp32 peaks
10x apart, a cached copy "peak" of 0.0018 GB/s from a busy moment, MFU 0.079 and
0.158 for identical runs (issue 27). So:

- each burst is timed in **CPU time** of the threads doing the work
  (``time.thread_time`` for a one-thread measurement, ``time.process_time``
  otherwise), so time the OS gave to other processes is not counted as this
  CPU's slowness; its **share** (CPU time over wall time x threads) says
  whether the measuring threads ran at all while the clock ran;
- bursts are **repeated until stable**: the last ``MIN_BURSTS`` within
  ``STABLE_SPREAD`` of their median (max - min over the median), at most
  ``MAX_BURSTS``;
- a measurement that never settles, or whose threads got less than
  ``MIN_SHARE`` of the wall time, is **contended**: it is returned flagged,
  never cached, and gives no peak (so no ``mfu``; abl.train.loop also stores no
  ``mfu`` for a run whose own loop was contended).

The figures:

- ``matmul_flops(fmt)``: square matmuls in the run's number format (fp32,
  bf16, fp16; tf32 is fp32 on a CPU; fp8 has no CPU matmul and so no peak),
  measured on **one thread** (its CPU time is exactly ``time.thread_time``)
  and scaled by torch's thread count: the peak of perfectly parallel matmuls,
  an upper bound a run's MFU is measured against;
- ``copy_gbps(nbytes)``: ``dst.copy_(src)`` bandwidth (read + write) at a given
  working set, at torch's thread count. ``dram_gbps`` uses a working set of 4x
  the last-level cache (at least 256 MiB), ``cache_gbps`` one of 256 KiB, which
  sits in the caches: the two are stated separately, because an op whose inputs
  fit in cache can beat the DRAM figure by several times.

Measurements are cached in ``$ABL_CACHE_DIR`` (default ``~/.cache/abl``) in
``cpu_peaks.json``, keyed by CPU model, thread count (one for the per-thread
matmul figures) and torch version, so a grid pays for them once per machine,
not once per cell. ``refresh=True`` measures again.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import files

CACHE_FILE = "cpu_peaks.json"
CACHE_VERSION = 2  # 2: CPU-time bursts repeated until stable, per-thread matmul peaks (issue 27)
BURST_S = 0.25  # one burst: calls repeated for at least this long (wall time)
BURSTS = 5  # MIN_BURSTS: the figure is the median of the last this many bursts
MIN_BURSTS = BURSTS
MAX_BURSTS = 24  # never settled within this many (about 6 s): contended
STABLE_SPREAD = 0.10  # (max - min) / median of the last MIN_BURSTS bursts
MIN_SHARE = 0.85  # CPU time of the measuring threads over wall time x threads, in each of those bursts
CACHE_RESIDENT_BYTES = 256 * 1024

# number format -> torch dtype name of a CPU matmul in it (no entry: no CPU peak)
MATMUL_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class Measurement:
    """Bursts of one figure: the median is the figure; p20/p80 its spread; ``share`` the CPU time the
    measuring threads got over their wall time (1: undisturbed); ``contended``: not a peak (never cached)."""

    median: float
    p20: float
    p80: float
    bursts: int
    share: float = 1.0
    contended: bool = False

    @property
    def spread(self) -> float:
        """(p80 - p20) / median: how noisy the machine was while measuring."""
        return (self.p80 - self.p20) / self.median if self.median else float("inf")


def cache_dir() -> Path:
    env = os.environ.get("ABL_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "abl"


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def last_level_cache_bytes() -> int | None:
    """The largest cache size the OS reports for cpu0 (Linux sysfs), or None."""
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    sizes = []
    for size in root.glob("index*/size"):
        try:
            text = size.read_text().strip().upper()
        except OSError:
            continue
        mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * mult)
    return max(sizes) if sizes else None


def machine_key(threads: int) -> str:
    import torch

    return f"v{CACHE_VERSION}|{cpu_model()}|{os.cpu_count()} cpus|{threads} threads|torch {torch.__version__}"


def _settled(rates: list[float], shares: list[float]) -> bool:
    last, share = rates[-MIN_BURSTS:], shares[-MIN_BURSTS:]
    med = statistics.median(last)
    return med > 0 and (max(last) - min(last)) / med <= STABLE_SPREAD and min(share) >= MIN_SHARE


def bursts(fn: Callable[[], object], work: float, burst_s: float = BURST_S, n: int = MIN_BURSTS,
           threads: int = 1, max_bursts: int = MAX_BURSTS,
           clock: Callable[[], float] | None = None) -> Measurement:
    """``work`` units per call of ``fn``: units per CPU-second (of ``threads`` threads), over bursts of at
    least ``burst_s`` wall seconds each, repeated until the last ``n`` agree (see the module docstring)."""
    cpu_clock = clock or (time.thread_time if threads == 1 else time.process_time)
    deadline = time.perf_counter() + burst_s  # warm-up: one burst's worth, not timed
    while time.perf_counter() < deadline:
        fn()
    rates: list[float] = []
    shares: list[float] = []
    settled = False
    while len(rates) < max(n, max_bursts) and not settled:
        calls, t0, c0 = 0, time.perf_counter(), cpu_clock()
        while True:
            fn()
            calls += 1
            dt = time.perf_counter() - t0
            if dt >= burst_s:
                break
        cpu = max(cpu_clock() - c0, 1e-9)
        rates.append(calls * work / cpu * threads)  # what the threads do in a second they fully run
        shares.append(cpu / (dt * threads))
        settled = len(rates) >= n and _settled(rates[-n:], shares[-n:])
    last = rates[-n:]
    q = statistics.quantiles(last, n=10, method="inclusive") if len(last) > 1 else [last[0]] * 9
    return Measurement(statistics.median(last), q[1], q[7], len(rates), statistics.median(shares[-n:]),
                       contended=not settled)


def measure_matmul_flops(fmt: str, n: int | None = None, burst_s: float = BURST_S,
                         count: int = BURSTS) -> Measurement:
    """FLOP/s per CPU-second of ``n``x``n`` matmuls in number format ``fmt`` (call it on one thread:
    ``per_thread``).

    ``n`` defaults to the largest of 1024, 512, 256, 128 whose matmul takes at most
    a fifth of a burst here (fp16 matmuls on CPUs without fp16 units run at well
    under a GFLOP/s: a 1024^3 one would take seconds).
    """
    import torch

    dtype = getattr(torch, MATMUL_DTYPES[fmt])
    if n is None:
        probe = 128
        a = torch.randn(probe, probe).to(dtype)
        torch.mm(a, a)
        t0 = time.perf_counter()
        torch.mm(a, a)
        rate = 2.0 * probe**3 / max(time.perf_counter() - t0, 1e-9)
        n = next((k for k in (1024, 512, 256) if 2.0 * k**3 / rate <= burst_s / 5), probe)
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    out = torch.empty(n, n, dtype=dtype)
    return bursts(lambda: torch.mm(a, b, out=out), 2.0 * n**3, burst_s, count, threads=1)


def per_thread(measure: Callable[[], Measurement]) -> Measurement:
    """``measure`` with torch on one thread (its CPU time is then the calling thread's own)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return measure()
    finally:
        torch.set_num_threads(before)


def measure_copy_gbps(nbytes: int, burst_s: float = BURST_S, count: int = BURSTS) -> Measurement:
    """GB/s of copying an fp32 buffer of ``nbytes`` (read + write counted)."""
    import torch

    src = torch.randn(max(1, nbytes // 4))
    dst = torch.empty_like(src)
    return bursts(lambda: dst.copy_(src), 2.0 * src.numel() * 4 / 1e9, burst_s, count,
                  threads=max(1, torch.get_num_threads()))


def dram_bytes() -> int:
    llc = last_level_cache_bytes() or 32 * 1024**2
    return max(256 * 1024**2, 4 * llc)


def _read_cache() -> dict:
    data = files.read_json(cache_dir() / CACHE_FILE, {})  # never blocks on a FIFO
    return data if isinstance(data, dict) else {}


def _write_cache(data: dict) -> None:
    path = cache_dir() / CACHE_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        files.write_json(path, data)
    except OSError:  # a read-only home: measure again next time, never fail a run for a cache
        pass


_MEMO: dict[tuple[str, str], Measurement] = {}


def cached(name: str, measure: Callable[[], Measurement], refresh: bool = False,
           threads: int | None = None) -> Measurement:
    """The measurement ``name`` for this machine: from this process, the cache file, or measured now.
    A contended measurement is returned as it is and never cached nor kept for this process."""
    import torch

    key = machine_key(torch.get_num_threads() if threads is None else threads)
    memo_key = (key, name)
    if not refresh and memo_key in _MEMO:
        return _MEMO[memo_key]
    data = _read_cache()
    entry = data.get(key, {}).get(name)
    if refresh or not isinstance(entry, dict):
        m = measure()
        if m.contended:
            return m
        data = _read_cache()  # another process may have written meanwhile
        old = data.get(key, {}).get(name)
        if isinstance(old, dict) and isinstance(old.get("median"), (int, float)) and old["median"] > m.median:
            # a peak is the best this machine sustains: a measurement taken while it was busy never lowers it
            m = Measurement(float(old["median"]), float(old["p20"]), float(old["p80"]), int(old["bursts"]))
        data.setdefault(key, {})[name] = {"median": m.median, "p20": m.p20, "p80": m.p80, "bursts": m.bursts,
                                          "share": m.share,
                                          "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        _write_cache(data)
    else:
        m = Measurement(float(entry["median"]), float(entry["p20"]), float(entry["p80"]), int(entry["bursts"]))
    _MEMO[memo_key] = m
    return m


def matmul_flops(fmt: str, refresh: bool = False) -> float | None:
    """The CPU's matmul FLOP/s in ``fmt`` at torch's thread count: the one-thread peak times the threads.
    None for a format with no CPU matmul (fp8), and None while the machine is too busy to measure it."""
    import torch

    if fmt not in MATMUL_DTYPES:
        return None
    m = cached(f"matmul_{MATMUL_DTYPES[fmt]}_per_thread", lambda: per_thread(lambda: measure_matmul_flops(fmt)),
               refresh, threads=1)
    return None if m.contended else m.median * max(1, torch.get_num_threads())


def dram_gbps(refresh: bool = False) -> float | None:
    """DRAM copy bandwidth at torch's thread count (None while the machine is too busy to measure it)."""
    m = cached("copy_dram", lambda: measure_copy_gbps(dram_bytes()), refresh)
    return None if m.contended else m.median


def cache_gbps(refresh: bool = False) -> float | None:
    m = cached("copy_cache", lambda: measure_copy_gbps(CACHE_RESIDENT_BYTES), refresh)
    return None if m.contended else m.median


BASIS = (f"measured in CPU time: median of the last {MIN_BURSTS} of bursts of {BURST_S:g} s repeated until they "
         f"agree within {STABLE_SPREAD:.0%} (square matmuls of up to 1024 in the run's format on one thread, "
         f"times the threads; copies of 256 KiB for the cache-resident and 4x the last-level cache for the "
         f"DRAM bandwidth); a contended measurement is never used or cached; cached per machine")
