"""Within-cell contrasts as verdicts (issue 41, item 2): extrapolation and no-recall baselines, paired by seed."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from scipy import stats as sps

from abl.analysis.contrasts import contrasts_of, within_cell


@dataclass
class Run:
    cell_key: str
    label: str
    seed: int
    final: dict = field(default_factory=dict)
    status: str = "completed"


def _runs(seeds=(0, 1, 2, 3)):
    rng = np.random.default_rng(0)
    out = []
    for s in seeds:
        base = 2.0 + 0.05 * rng.standard_normal()  # a seed moves every length alike
        out.append(Run("rope", "position=rope", s, {"val_loss_x1": base, "val_loss_x2": base + 0.4 + 0.01 * rng.standard_normal(),
                                                   "val_loss_x4": base + 1.0 + 0.02 * rng.standard_normal()}))
        out.append(Run("alibi", "position=alibi", s, {"val_loss_x1": base, "val_loss_x2": base + 0.01 * rng.standard_normal(),
                                                     "val_loss_x4": base + 0.01 * rng.standard_normal()}))
        out.append(Run("mqar", "mixer=mha", s, {"mqar_accuracy": 0.9 + 0.01 * rng.standard_normal(),
                                                "mqar_no_recall_baseline": 0.562}))
        out.append(Run("mqar-none", "mixer=none", s, {"mqar_accuracy": 0.562 + 0.01 * rng.standard_normal(),
                                                     "mqar_no_recall_baseline": 0.562}))
    return out


def test_the_contrasts_follow_the_recorded_metrics():
    names = [c.name for c in contrasts_of(["val_loss_x1", "val_loss_x2", "val_loss_x4", "mqar_accuracy",
                                           "mqar_no_recall_baseline", "probe_induction_accuracy"])]
    assert names == ["length x2 vs x1", "length x4 vs x1", "mqar accuracy vs its no-recall baseline"]
    assert contrasts_of(["val_loss_x2", "val_loss_x4"]) == []  # no x1: nothing to contrast with


def test_extrapolation_degradation_is_a_verdict_paired_by_seed():
    out = {(w.cell, w.contrast.name): w for w in within_cell(_runs())}
    rope4 = out[("rope", "length x4 vs x1")]
    assert rope4.answer() == "degrades at 4x"
    d = [r.final["val_loss_x4"] - r.final["val_loss_x1"] for r in _runs() if r.cell_key == "rope"]
    t = sps.ttest_1samp(d, 0.0)
    assert rope4.row.delta == pytest.approx(np.mean(d))
    assert rope4.row.p_value == pytest.approx(t.pvalue)
    assert rope4.row.p_adjusted >= rope4.row.p_value  # Holm over every contrast shown
    assert out[("alibi", "length x4 vs x1")].answer() == "not distinguishable"


def test_accuracy_against_the_no_recall_baseline_reads_above_or_not():
    out = {(w.cell, w.contrast.metric): w for w in within_cell(_runs())}
    assert out[("mqar", "mqar_accuracy")].answer() == "above the no-recall baseline"
    assert out[("mqar", "mqar_accuracy")].row.verdict == "better"
    assert out[("mqar-none", "mqar_accuracy")].answer() == "not distinguishable"


def test_two_seeds_are_too_few_to_decide():
    out = within_cell(_runs(seeds=(0, 1)))
    assert out and all(w.answer().startswith("too few seeds") for w in out)


def test_the_summary_answers_within_each_cell(tmp_path, monkeypatch, registry):
    """abl compare (the run summary's view) answers extrapolation within each cell, once, in its words."""
    import zlib

    from click.testing import CliRunner

    from abl.cli import cli
    from conftest import completed_store, tiny_grid_text

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "g.toml"
    path.write_text(tiny_grid_text(experiment={"seeds": [0, 1, 2]}))

    def noise(cell, what):
        return np.random.default_rng(zlib.crc32(f"{cell.label}{cell.seed}{what}".encode())).standard_normal()

    def x(cell):
        base = 3.0 + 0.02 * noise(cell, "b")
        degrade = 0.5 if cell.model.norm == "rmsnorm" else 0.0
        return {"val_loss_x1": base, "val_loss_x4": base + degrade + 0.01 * noise(cell, "x4")}

    _, db = completed_store(path, registry, lambda c: 3.0 + 0.01 * noise(c, "v"), extra=x, results=tmp_path)
    out = CliRunner().invoke(cli, ["compare", str(path), "--db", str(db), "--wide"], terminal_width=200)
    assert out.exit_code == 0, out.output
    text = out.output
    assert text.count("Within each cell") == 1
    line = next(ln for ln in text.splitlines() if "norm=rmsnorm" in ln and "length x4 vs x1" in ln)
    assert line.rstrip().endswith("degrades at 4x")
    other = next(ln for ln in text.splitlines() if "norm=layernorm" in ln and "length x4 vs x1" in ln)
    assert other.rstrip().endswith("not distinguishable")
    narrow = CliRunner().invoke(cli, ["compare", str(path), "--db", str(db)], terminal_width=60)
    assert narrow.exit_code == 0 and narrow.output.count("Within each cell") == 1
    assert "degrades at 4x" in " ".join(narrow.output.split())

    report = CliRunner().invoke(cli, ["report", str(path), "--db", str(db), "--out", str(tmp_path / "rep")])
    assert report.exit_code == 0, report.output
    md = (tmp_path / "rep" / "report.md").read_text()
    section = md[md.index("Length extrapolation"):]
    assert "Within each cell" in section and "length x4 vs x1" in section and "degrades at 4x" in section
