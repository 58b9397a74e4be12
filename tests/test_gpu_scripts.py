"""scripts/gpu_run.sh end to end on the CPU (tiny sizes, this interpreter's abl: no install, no
network), and scripts/gpu_prepare.sh's budget and refusals with pip faked (docs/gpu.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gpu_run_script_runs_end_to_end_on_cpu(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), ABL_GPU_INSTALL="0", ABL_GPU_TINY="1", ABL_GPU_PYTHON=sys.executable,
               TMPDIR=str(tmp_path), TRITON_INTERPRET="1")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_run.sh")], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=1200, check=False)
    status = (out / "status.txt").read_text() if (out / "status.txt").exists() else ""
    assert r.returncode == 0, status + r.stdout[-2000:] + r.stderr[-2000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all(p.is_file() for p in out.iterdir())  # what the device tool brings back
    assert set(files) == {"env.txt", "selftest.json", "selftest.txt", "grids.txt", "big.txt", "abl.duckdb",
                          "status.txt"}
    assert json.loads((out / "selftest.json").read_text())["passed"]
    # every stage ran and said so: selftest, 2 grids x 2 kernel backends, the big cell
    assert len(status.strip().splitlines()) == 6 and "exit 0" in status
    con = duckdb.connect(str(out / "abl.duckdb"), read_only=True)
    experiments = {e for (e,) in con.execute("SELECT DISTINCT experiment FROM runs WHERE status = 'completed'")
                   .fetchall()}
    kernels = {k for (k,) in con.execute("SELECT DISTINCT json_extract_string(config, '$.train.kernels') "
                                         "FROM runs").fetchall()}
    assert con.execute("SELECT count(*) FROM selftest").fetchone()[0] > 0
    con.close()
    assert experiments == {"norms-triton", "norms-torch", "precision-triton", "precision-torch", "gpu-big"}
    assert kernels >= {"triton", "torch"}
    assert "non-embedding" in (out / "big.txt").read_text().lower() or "params" in (out / "big.txt").read_text()


@pytest.mark.slow
def test_gpu_probe_runs_end_to_end_on_cpu(tmp_path):
    from abl.bench.probe import STAGES

    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), ABL_GPU_INSTALL="0", ABL_GPU_TINY="1", ABL_GPU_PYTHON=sys.executable,
               TMPDIR=str(tmp_path), TRITON_INTERPRET="1", ABL_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_run.sh"), "probe"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=900, check=False)
    status = (out / "status.txt").read_text() if (out / "status.txt").exists() else ""
    assert r.returncode == 0, status + r.stdout[-2000:] + r.stderr[-2000:]
    files = sorted(p.name for p in out.iterdir())
    # one file per stage and the status (with the environment): what the device tool brings back
    assert files == sorted(["status.txt"] + [f"probe-{letter}-{name}.txt" for name, letter in STAGES.items()])
    assert len(files) <= 8
    for name in ("determinism", "attention", "lce", "ssd", "layernorm"):  # the GPU stages say why they did not run
        text = (out / f"probe-{STAGES[name]}-{name}.txt").read_text()
        assert "skipped: no CUDA" in text and text.rstrip().splitlines()[-1].startswith("skipped in")
    profile = (out / "probe-f-profile.txt").read_text()
    assert "median step" in profile and "graph breaks:" in profile and "Self CPU" in profile
    assert profile.rstrip().splitlines()[-1].startswith("done in")
    assert "median step" in (out / "probe-g-torch-cell.txt").read_text()
    lines = [ln for ln in status.splitlines() if ln.startswith("probe ")]
    assert len(lines) == len(STAGES) and all("exit 0" in ln for ln in lines)
    assert "torch" in status and "python" in status  # the environment heads the status file


@pytest.mark.slow
def test_gpu_run_script_seeds_stage_runs_on_cpu(tmp_path):
    """The seeds stage (issue 37, item 4): abl bench seeds on both kernel settings, each said in seeds.txt."""
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), ABL_GPU_INSTALL="0", ABL_GPU_TINY="1", ABL_GPU_PYTHON=sys.executable,
               TMPDIR=str(tmp_path), ABL_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_run.sh"), "seeds"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600, check=False)
    status = (out / "status.txt").read_text()
    assert r.returncode == 0, status + r.stdout[-2000:] + r.stderr[-2000:]
    text = (out / "seeds.txt").read_text()
    assert text.count("stacked (vmap)") == 2 and text.count("concurrent (a process each)") == 2
    assert "seeds kernels=torch: exit 0" in status and "seeds kernels=auto: exit 0" in status


def test_probe_stages_fit_their_call():
    from abl.bench.probe import GRACE_S, LIMITS, STAGES

    assert list(LIMITS) == list(STAGES) and len(STAGES) == 7
    # every stage's limit (and the 5 s timeout gives a stage that ignores SIGTERM) under 9 minutes, leaving
    # the rest of a 10-minute call to the installs
    assert sum(LIMITS.values()) + 5 * len(LIMITS) < 9 * 60
    assert all(n > GRACE_S for n in LIMITS.values())


def test_gpu_run_script_runs_the_probe_alone(tmp_path):
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_run.sh"), "probe", "selftest"], cwd=tmp_path,
                       env=dict(os.environ, OUT=str(tmp_path / "out")), capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 2 and "probe runs alone" in r.stderr


def test_gpu_run_script_refuses_an_unknown_stage(tmp_path):
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_run.sh"), "everything"], cwd=tmp_path,
                       env=dict(os.environ, OUT=str(tmp_path / "out")), capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 2 and "unknown stage" in r.stderr


def test_gpu_run_script_without_prepared_wheels_says_what_to_do(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path / "out"), ABL_GPU_WHEELS=str(tmp_path / "none"))
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_run.sh")], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 2 and "gpu_prepare.sh" in r.stderr


FAKE_PIP = """#!/usr/bin/env bash
# a stand-in for "python -m pip download ... -d DIR SPEC": writes DIR/NAME-1.0-py3-none-any.whl of the size
# FAKE_SIZE_<NAME> says (KiB), or fails for a name in FAKE_MISSING
dest=""; spec=""
while [ $# -gt 0 ]; do
    case $1 in -d) dest=$2; shift 2;; -*) shift;; *) spec=$1; shift;; esac
done
name=${spec%%[<>=]*}; var=FAKE_SIZE_${name//-/_}
case " $FAKE_MISSING " in *" $name "*) exit 1;; esac
head -c $(( ${!var:-100} * 1024 )) /dev/zero > "$dest/${name//-/_}-1.0-py3-none-any.whl"
"""


def _prepare(tmp_path, **env):
    fake = tmp_path / "fakepython"
    fake.write_text(FAKE_PIP)
    fake.chmod(0o755)
    wheels = ROOT / ".gpu-wheels-test"
    full = dict(os.environ, PYTHON=str(fake), ABL_GPU_WHEELS=str(wheels.name), **env)
    try:
        r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_prepare.sh")], cwd=ROOT, env=full,
                           capture_output=True, text=True, timeout=120, check=False)
        kept = sorted(p.name.split("-")[0] for p in wheels.glob("*.whl")) if wheels.exists() else []
    finally:
        for p in wheels.glob("*") if wheels.exists() else []:
            p.unlink()
        if wheels.exists():
            wheels.rmdir()
    return r, kept


def test_gpu_prepare_keeps_optional_wheels_only_within_the_budget(tmp_path):
    # the budget: the working tree plus 100 KiB of duckdb, 200 KiB of liger-kernel, 100 KiB of nvidia-ml-py;
    # fla-core's 10 MiB is over
    tree = subprocess.run("git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- | tail -1",
                          shell=True, cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()[0]
    budget_mib = (int(tree) + 2 * 2**20) // 2**20 + 1
    r, kept = _prepare(tmp_path, ABL_GPU_BUDGET_MIB=str(budget_mib), FAKE_SIZE_liger_kernel="200",
                       FAKE_SIZE_fla_core=str(10 * 1024))
    assert r.returncode == 0, r.stdout + r.stderr
    assert kept == ["duckdb", "liger_kernel", "nvidia_ml_py"]  # the NVML bindings: the GPU busy share
    assert "skipped fla-core" in r.stdout and "budget" in r.stdout


def test_gpu_prepare_fails_without_duckdb_but_not_without_an_optional_wheel(tmp_path):
    r, kept = _prepare(tmp_path, FAKE_MISSING="duckdb")
    assert r.returncode != 0 and "duckdb" in r.stderr
    r, kept = _prepare(tmp_path, FAKE_MISSING="fla-core")
    assert r.returncode == 0 and "skipped fla-core: no wheel" in r.stdout and "duckdb" in kept


@pytest.mark.slow
def test_gpu_run_script_ladder_stage_runs_on_cpu(tmp_path):
    """The ladder stage (issue 41): the GPU ladder's grid at tiny sizes, then abl ladder's verdicts."""
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), ABL_GPU_INSTALL="0", ABL_GPU_TINY="1", ABL_GPU_PYTHON=sys.executable,
               TMPDIR=str(tmp_path))
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_run.sh"), "ladder"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=1200, check=False)
    status = (out / "status.txt").read_text() if (out / "status.txt").exists() else ""
    assert r.returncode == 0, status + r.stdout[-2000:] + r.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["abl.duckdb", "env.txt", "ladder.txt", "status.txt"]
    text = (out / "ladder.txt").read_text()
    assert "ladder: exit 0" in status
    assert "val_loss along the ladder" in text and "ffn=gelu vs ffn=swiglu" in " ".join(text.split())
