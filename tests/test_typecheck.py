"""The static type checker over the package abl as pip installs it: harness/, plugins/ and dashboard/
(.ci/typecheck.py; the configuration is pyproject.toml's [tool.mypy]).

CI has no GPU, so a wrong call in a CUDA-only branch is caught here or nowhere:
the second test plants the call that once crashed every GPU cell at step 0
(``gpu_peak(name, dtype)``: one argument too many, and a ``Peak`` used as a
number) and checks that mypy names it.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "typecheck.py"


def typecheck(tmp_path: Path, *replace: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(SCRIPT), "--target", str(tmp_path / "site")]
    for r in replace:
        argv += ["--replace", r]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600)


def test_mypy_passes_over_harness_plugins_and_dashboard(tmp_path):
    r = typecheck(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success" in r.stdout
    # every module of the package's source folders was checked (no tree of links to keep in step)
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    assert {"harness", "plugins", "dashboard"} <= set(folders)
    n = sum(1 for d in folders for _ in (ROOT / d).rglob("*.py"))
    assert f"no issues found in {n} source files" in r.stdout, (n, r.stdout)


def test_mypy_flags_the_wrong_arity_gpu_peak_call_in_a_gpu_only_branch(tmp_path):
    planted = tmp_path / "provenance.py"
    planted.write_text((ROOT / "harness" / "store" / "provenance.py").read_text() + '''

def _mfu_peak(device: torch.device, dtype: torch.dtype) -> float:
    if device.type == "cuda":  # the GPU-only branch no CPU test reached
        peak = gpu_peak(device_name(device), dtype)
        return peak * 1e12
    return cpu_peak_flops()
''')
    r = typecheck(tmp_path, f"abl.store.provenance={planted}")
    assert r.returncode != 0
    # named where the source lives, not where the checked copy was installed
    assert 'harness/store/provenance.py:' in r.stdout and 'Too many arguments for "gpu_peak"' in r.stdout, r.stdout
    assert "Unsupported operand types" in r.stdout, r.stdout
