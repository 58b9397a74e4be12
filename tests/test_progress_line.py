"""The progress line keeps the varied values at 80 columns (issue 40, finding 6): a long label is cut
from the middle of its values, never so far that two levels of an axis read the same, the fixed parts
are shortened first, and a finished cell's line gives its final loss."""

import io
import itertools
import re
from types import SimpleNamespace

from rich.console import Console

from abl.present.termlayout import cut_middle, distinct_width, fit_varied
from abl.run.executors import Job
from abl.run.progress import BarProgress, axis_levels

MIXERS = ["softmax_attention", "linear_attention", "sliding_window_attention", "gated_delta_net"]
NORMS = ["layernorm_without_bias", "layernorm", "rmsnorm_with_learned_scale", "rmsnorm"]
TIMER = r"(\d+:\d\d:\d\d|-:--:--)"


def jobs():
    out = []
    for i, (m, n) in enumerate(itertools.product(MIXERS, NORMS)):
        varied = {"model.mixer": m, "model.norm": n}
        cell = SimpleNamespace(label=f"mixer={m}, norm={n}", seed=1, run_id=f"r{i}", varied=varied,
                               train=SimpleNamespace(steps=1000))
        out.append(Job(cell=cell, run_dir=None, index=i))  # type: ignore[arg-type]
    return out


def readable(token: str, axis: str, levels: list[str]) -> list[str]:
    """The levels of ``axis`` a shown token can be (its whole value, axis=value, or a middle cut of it)."""
    token = token.removeprefix(axis + "=")
    if "…" not in token:
        return [v for v in levels if v == token]
    head, tail = token.split("…")
    return [v for v in levels if v.startswith(head) and v.endswith(tail) and len(v) >= len(token)]


def check_keeps_levels(text: str, job: Job) -> None:
    label = re.search(r"\] (.*) seed=1", text)
    assert label, text
    tokens = label.group(1).split(", ")
    assert len(tokens) == 2, text
    for token, (axis, levels) in zip(tokens, (("mixer", MIXERS), ("norm", NORMS))):
        own = job.cell.varied[f"model.{axis}"]
        assert readable(token, axis, levels) == [own], (text, token, own)


def test_bars_keep_every_varied_value_at_80_columns():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80, color_system=None)
    all_jobs = jobs()
    bars = BarProgress(console, len(all_jobs), levels=axis_levels(all_jobs))
    for job in all_jobs:
        job.step, job.train_loss, job.val_loss = 120, 3.4123, 3.5
        bars.update(job)
    render = io.StringIO()
    Console(file=render, width=80, color_system=None).print(bars.progress.get_renderable())
    lines = [line for line in render.getvalue().splitlines() if line.strip()][1:]
    assert len(lines) == len(all_jobs)
    for line, job in zip(lines, all_jobs):
        assert len(line) <= 80, line
        assert re.search(TIMER + r"\s+" + TIMER + r"\s*$", line), line  # both timers whole
        assert f"[{job.index + 1}/{len(all_jobs)}]" in line and "120 loss 3.412" in line, line
        check_keeps_levels(line, job)
    # one form for the whole grid: the axis names on every line or on none
    assert len({"mixer=" in line for line in lines}) == 1, lines


def test_a_finished_cells_line_gives_its_final_loss_at_80_columns():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80, color_system=None)
    all_jobs = jobs()
    bars = BarProgress(console, len(all_jobs), levels=axis_levels(all_jobs))
    for job in all_jobs:
        job.step, job.train_loss, job.val_loss = 1000, 3.2101, 3.3456
        bars.update(job)
        line = bars.end_line(job, "completed", 74.0)
        assert len(line) <= 80, line
        assert line.endswith(": completed, loss 3.210 val 3.346, 1m14s"), line
        check_keeps_levels(line, job)
        bars.finish(job, "completed", 74.0)
    assert "loss 3.210 val 3.346" in out.getvalue()


def test_a_label_that_fits_is_shown_whole_and_the_axis_names_go_first():
    assert fit_varied([("norm", "rmsnorm"), ("block", "post")], 40) == "norm=rmsnorm, block=post"
    assert fit_varied([("norm", "rmsnorm"), ("block", "post")], 16) == "rmsnorm, post"
    assert cut_middle("softmax_attention", 9) == "soft…tion"
    # a cut that could be read as another level is too short: rms…rm could be rmsnorm itself
    assert cut_middle("rmsnorm_over_the_rmsnorm", distinct_width(["rmsnorm", "rmsnorm_over_the_rmsnorm"])) \
        not in ("rms…rm", "rms…orm", "rmsn…norm")
    assert distinct_width(["softmax_attention", "linear_attention"]) == 5
    # too little room: every level stays apart from its axis's others, the caller's column cuts the end
    text = fit_varied([("a", "layernorm_without_bias"), ("b", "x")], 5, [NORMS, ["x", "y"]])
    assert readable(text.split(", ")[0], "a", NORMS) == ["layernorm_without_bias"]
