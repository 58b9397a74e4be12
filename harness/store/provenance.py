"""Where a figure came from: code commit, package versions, device and its peaks.

Small and import-light on purpose: the runner, the worker, the trainer, the
kernel benchmark and the report all record these, and none of them should
have to import another to do it. ``torch`` is imported inside the functions
that need it, so ``abl --help`` does not load it.

The device peak is answered in one place, ``peak_flops(device, fmt)``: a
number (FLOP/s) or None. MFU and the benchmark's "fraction of peak" both use
it.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - types only
    import torch

    from ..contracts.config import Cell
    from ..contracts.registry import Registry

SOURCE_DIR = Path(__file__).resolve().parent.parent

# The number formats a peak is looked up for. A precision policy says which one
# its matmuls run in (``Precision.peak_format``).
FORMATS = ("fp32", "tf32", "bf16", "fp16", "fp8")


# ---------------------------------------------------------------- code and packages


def git_commit() -> str:
    """The commit of the abl source tree, with "-dirty" if it has local changes.

    "unknown" outside a git checkout (an installed wheel); never raises.
    """
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=SOURCE_DIR, capture_output=True,
                              text=True, timeout=5)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=SOURCE_DIR,
                               capture_output=True, text=True, timeout=5)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def package_version(dist: str) -> str | None:
    """The installed version of a distribution, or None when it is not installed."""
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def package_versions(dists: tuple[str, ...] = ("abl", "torch", "numpy", "duckdb", "pluggy", "triton"),
                     missing: str | None = "-") -> dict[str, str]:
    """Python's version and each distribution's; a missing one is ``missing`` (None: left out)."""
    out = {"python": platform.python_version()}
    for dist in dists:
        v = package_version(dist)
        if v is not None:
            out[dist] = v
        elif missing is not None:
            out[dist] = missing
    return out


def versions(cell: Cell, registry: Registry) -> dict[str, Any]:
    """Package versions plus the plugin and package of every component a cell uses."""
    out: dict[str, Any] = dict(package_versions())

    def describe(axis: str, name: str) -> str:
        c = registry.get(axis, name)
        return f"{name} ({c.plugin}, {c.package} {c.version})"

    out["components"] = {axis: describe(axis, spec["name"])
                         for axis, spec in cell.components.items() if axis != "layer_mixers"}
    for spec in cell.components.get("layer_mixers", []):  # hybrids: every mixer the pattern names
        out["components"][f"mixer:{spec['name']}"] = describe("mixer", spec["name"])
    return out


# ---------------------------------------------------------------- plugins


def component_keys(components: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(key, axis, name) of every component a config's ``components`` names: ``"axis:name"`` per axis, and
    for a hybrid each mixer its ``layer_mixers`` pattern names (axis ``mixer``)."""
    out: list[tuple[str, str, str]] = []
    for axis, spec in components.items():
        specs = spec if axis == "layer_mixers" and isinstance(spec, list) else [spec]
        for one in specs:
            name = one.get("name") if isinstance(one, dict) else None
            if isinstance(name, str):
                kind = "mixer" if axis == "layer_mixers" else axis
                out.append((f"{kind}:{name}", kind, name))
    return list(dict.fromkeys(out))


def plugin_records(cell: Cell, registry: Registry) -> dict[str, dict[str, str]]:
    """Which plugin provided each component of a cell, ``"axis:name"`` -> its origin
    (abl.contracts.plugin_manager.source: "builtin" and abl's version, a package and its version, or a
    plugins-folder file as the folder was given, its path inside it and its sha256). meta.json keeps it
    (``plugins``) and the store after ingest, so a reader without the plugin can name it."""
    from ..contracts.plugin_manager import source

    return {key: source(registry.get(axis, name).plugin) for key, axis, name in component_keys(cell.components)}


def describe_plugin(record: dict[str, Any]) -> str:
    """A stored origin (``plugin_records``) for a reader: "plugin file F in folder D (sha256 abcdef123456)",
    "package P V (entry point E)", "abl V's built-in plugin N"."""
    kind = record.get("kind")
    if kind == "file":
        return (f"plugin file {record.get('file')} in folder {record.get('folder')} "
                f"(sha256 {str(record.get('sha256') or '?')[:12]})")
    if kind == "package":
        return f"package {record.get('package')} {record.get('version')} (entry point {record.get('entry_point')})"
    if kind == "builtin":
        return f"abl {record.get('version')}'s built-in plugin {record.get('plugin')}"
    return f"plugin {record.get('plugin') or '?'} (registered in-process, by the program that ran it)"


def how_to_load(record: dict[str, Any] | None) -> str:
    """What makes a stored run's plugin available again, in words a user can act on."""
    record = record or {}
    kind = record.get("kind")
    if kind == "file":
        return f"load it with --plugins-dir {record.get('folder', '?')}"
    if kind == "package":
        return f"install the package: pip install '{record.get('package', '?')}=={record.get('version', '?')}'"
    if kind == "builtin":
        return (f"it is built into abl {record.get('version')}, not into this abl ({package_version('abl') or '?'}): "
                "use that version")
    if record:
        return "it was registered in-process by the program that ran it, and cannot be loaded by name"
    return ("its run recorded no plugin origin (run before abl recorded them): load its plugins folder with "
            "--plugins-dir DIR or install its package")


def missing_plugin(key: str, record: dict[str, Any] | None) -> str:
    """One sentence on a component of a stored run that no loaded plugin provides: which plugin provided it
    when the run ran, and how to load it (``key``: "axis:name")."""
    axis, _, name = key.partition(":")
    where = f" (provided by {describe_plugin(record)} when it ran)" if record else ""
    return f"{axis} {name!r}{where} is not loaded: {how_to_load(record)}"


def plugin_lines(records: list[dict[str, dict[str, Any]]]) -> list[str]:
    """What a report says of the plugins behind its runs (``records``: each run's ``plugins``): one line naming
    every component that is not built in with its origin, and a warning for each component whose runs got it
    from different plugins or versions (a plugin file edited between runs: a new sha256, its run id the same)."""
    seen: dict[str, dict[str, dict[str, Any]]] = {}  # "axis:name" -> {origin as JSON: origin}
    for rec in records:
        for key, origin in rec.items():
            seen.setdefault(key, {})[json.dumps(origin, sort_keys=True)] = origin
    out = []
    third = {key: origins for key, origins in seen.items()
             if any(o.get("kind") != "builtin" for o in origins.values())}
    if third:
        out.append("Components from plugins that are not built in: " + "; ".join(
            f"{_named(key)} from {' / '.join(describe_plugin(o) for o in origins.values())}"
            for key, origins in sorted(third.items())) + ".")
    for key, origins in sorted(seen.items()):
        if len(origins) > 1:
            out.append(f"WARNING: the runs got {_named(key)} from {len(origins)} different plugins or "
                       f"versions ({'; '.join(describe_plugin(o) for o in origins.values())}): a difference between "
                       "its runs may come from the plugin's code.")
    return out


def _named(key: str) -> str:
    axis, _, name = key.partition(":")
    return f"{axis} {name!r}"


def plugin_hint(message: str, db_option: str | None = None, source: str | None = None) -> str:
    """``message`` (a user error), plus, for each unknown component it names (abl.contracts.registry.
    unknown_names), which plugin provided it to the runs in the store (``missing_plugin``), or, where no run
    recorded it, how a plugin's component is loaded. The store: ``db_option`` (``--db``), else the
    ``experiment.db`` of the grid file ``source``, else the default store."""
    from ..contracts.registry import unknown_names
    from .workspace import DEFAULT_DB

    unknown = unknown_names(message)
    if not unknown:
        return message
    db = db_option or _grid_db(source) or DEFAULT_DB
    try:
        from .reader import recorded_plugins

        recorded = recorded_plugins(db)
    except Exception:  # noqa: BLE001 - a hint never hides the error it adds to
        recorded = {}
    notes: list[str] = []
    for axis, name in unknown:
        key = f"{axis}:{name}"
        if key in recorded:
            notes.append(f"The runs in {db} got {axis} {name!r} from {describe_plugin(recorded[key])}: "
                         f"{how_to_load(recorded[key])}. Named by experiment instead of grid file, the stored "
                         "runs are read without it.")
        elif "Closest match" not in message:  # not a near-miss of a loaded name: maybe a plugin's
            notes.append(f"If {axis} {name!r} comes from a plugin, load it: --plugins-dir DIR for a plugins "
                         "folder, or install its package.")
    return "\n".join([message, *notes])


def _grid_db(source: str | None) -> str:
    """The ``experiment.db`` a grid file names ("" when it is no readable grid file or names none)."""
    import tomllib

    if not source or not source.endswith(".toml"):
        return ""
    try:
        with open(source, "rb") as f:
            db = tomllib.load(f).get("experiment", {}).get("db")
    except (OSError, ValueError, AttributeError):
        return ""
    return db if isinstance(db, str) else ""


# ---------------------------------------------------------------- device


def device_name(device: torch.device) -> str:
    """The GPU's name as the driver reports it, or a CPU description with the thread count."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name(torch.get_num_threads())


def cpu_name(threads: int) -> str:
    """A CPU's device string at ``threads`` threads (``device_name``; also what a cell that has not
    started yet will record, abl.run.payback.expected_device)."""
    return f"cpu ({platform.processor() or platform.machine()}, {threads} threads)"


# name substring (lower case) -> (HBM GB/s, dense TFLOP/s by number format). Vendor
# datasheet figures, dense (the sparsity figures are twice these); fp32 is the
# non-tensor-core rate, tf32 the tensor-core rate for fp32 inputs. A format a
# device has no figure for gives no peak (None), never a guess. First match
# wins, so more specific names come first.
GPU_PEAKS: list[tuple[str, float, dict[str, float]]] = [
    ("gh200", 4000.0, {"fp8": 1979.0, "bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),
    ("h200", 4800.0, {"fp8": 1979.0, "bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),
    ("h100 pcie", 2000.0, {"fp8": 1513.0, "bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    ("h100 nvl", 3900.0, {"fp8": 1670.0, "bf16": 835.0, "fp16": 835.0, "tf32": 417.0, "fp32": 60.0}),
    ("h100", 3350.0, {"fp8": 1979.0, "bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),
    ("b200", 8000.0, {"fp8": 4500.0, "bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 80.0}),
    ("a100-sxm4-80gb", 2039.0, {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("a100 80gb pcie", 1935.0, {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("a100", 1555.0, {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("a10g", 600.0, {"bf16": 70.0, "fp16": 70.0, "fp32": 31.2}),
    ("a10", 600.0, {"bf16": 125.0, "fp16": 125.0, "fp32": 31.2}),
    ("l40s", 864.0, {"fp8": 733.0, "bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6}),
    ("l40", 864.0, {"bf16": 181.0, "fp16": 181.0, "fp32": 90.5}),
    ("l4", 300.0, {"fp8": 242.0, "bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("rtx 4090", 1008.0, {"bf16": 165.0, "fp16": 165.0, "fp32": 82.6}),
    ("rtx 3090", 936.0, {"bf16": 71.0, "fp16": 71.0, "fp32": 35.6}),
    ("v100", 900.0, {"fp16": 125.0, "fp32": 15.7}),
    ("t4", 320.0, {"fp16": 65.0, "fp32": 8.1}),
]


@dataclass
class Peak:
    """A device's peaks: memory bandwidth (GB/s) and dense TFLOP/s by number format."""

    device: str
    gbps: float | None  # DRAM / HBM bandwidth
    tflops: dict[str, float]
    basis: str
    cache_gbps: float | None = None  # cache-resident bandwidth, where measured (CPU)


def gpu_peak(name: str) -> Peak:
    """The datasheet peaks of a GPU named as ``torch.cuda.get_device_name`` reports it."""
    low = name.lower()
    for key, gbps, tflops in GPU_PEAKS:
        if key in low:
            return Peak(name, gbps, dict(tflops), f"datasheet ({key})")
    return Peak(name, None, {}, "unknown GPU: no peak in the table")


def cpu_peak_flops(fmt: str = "fp32") -> float | None:
    """This CPU's sustained matmul FLOP/s in number format ``fmt`` at torch's current
    thread count (abl.store.cpupeak: median of several bursts, cached per machine);
    None for a format with no CPU matmul (fp8)."""
    from . import cpupeak

    return cpupeak.matmul_flops(fmt)


def device_peak(device: torch.device) -> Peak:
    """Every peak of a device: the datasheet's on a GPU, measured (and cached) on a CPU."""
    name = device_name(device)
    if device.type == "cuda":
        return gpu_peak(name)
    from . import cpupeak

    tflops = {fmt: v / 1e12 for fmt in FORMATS if (v := cpupeak.matmul_flops(fmt))}
    return Peak(name, cpupeak.dram_gbps(), tflops, cpupeak.BASIS, cache_gbps=cpupeak.cache_gbps())


def peak_flops(device: torch.device, fmt: str) -> float | None:
    """The peak FLOP/s of ``device`` for matmuls in number format ``fmt`` (see FORMATS).

    A GPU's comes from the datasheet table (None when the GPU or the format is
    not in it); a CPU's is measured in that format (abl.store.cpupeak: sustained,
    median of several bursts, cached per machine). The one answer MFU uses.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown number format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if device.type == "cpu":
        return cpu_peak_flops(fmt)
    if device.type != "cuda":
        return None
    tflops = gpu_peak(device_name(device)).tflops.get(fmt)
    return tflops * 1e12 if tflops else None


def peak_basis(device: torch.device) -> str:
    """How ``peak_flops`` obtains its figure on this device (stored with the run)."""
    if device.type == "cpu":
        from . import cpupeak

        return cpupeak.BASIS
    return gpu_peak(device_name(device)).basis if device.type == "cuda" else "unknown device"
