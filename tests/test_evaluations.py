"""The post-training evaluation registry (abl.train.evaluations) and its [eval] switches."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from abl.contracts.config import EvalConfig
from abl.train import evaluations
from abl.train.evaluations import EVALUATIONS, TrainedRun, register_evaluation, run_evaluations, switched_on


def test_every_built_in_evaluation_has_a_switch_and_every_switch_an_evaluation():
    built_in = evaluations.registered()  # registered by abl.plugins.evaluations (hook register_evaluations)
    assert list(built_in) == ["decode", "extrapolation", "probes"]
    assert {e.plugin for e in built_in.values()} == {"evaluations"}
    assert [f.name for f in dataclasses.fields(EvalConfig)] == list(built_in)
    for f in dataclasses.fields(EvalConfig):
        assert f.metadata["doc"]
    defaults = {f.name: f.default_factory() if f.name == "probes" else f.default  # type: ignore[misc]
                for f in dataclasses.fields(EvalConfig)}
    # decode is cheap and on; extrapolation's longer windows are on where a grid asks; probes: a list, off while empty
    assert defaults == {"decode": True, "extrapolation": False, "probes": []}
    assert built_in["extrapolation"].metrics == ("val_loss_x1", "val_loss_x2", "val_loss_x4")
    assert "decode_agreement" in built_in["decode"].metrics


def test_switched_on_follows_the_switches_in_registration_order():
    assert [e.name for e in switched_on(EvalConfig())] == ["decode"]
    assert [e.name for e in switched_on(EvalConfig(extrapolation=True))] == ["decode", "extrapolation"]
    assert [e.name for e in switched_on(EvalConfig(decode=False, extrapolation=True))] == ["extrapolation"]
    assert switched_on(EvalConfig(decode=False, extrapolation=False)) == []
    assert [e.name for e in switched_on(EvalConfig(decode=False, probes=["mqar"]))] == ["probes"]


@pytest.fixture
def scratch_registry(monkeypatch):
    """Registrations made in a test go to a copy of the registry."""
    monkeypatch.setattr(evaluations, "EVALUATIONS", dict(EVALUATIONS))
    return evaluations.EVALUATIONS


def fake_run():
    model = torch.nn.Linear(2, 2).train()
    return TrainedRun(model=model, cell=SimpleNamespace(), registry=None, batches=None,  # type: ignore[arg-type]
                      precision=None, device=torch.device("cpu"))  # type: ignore[arg-type]


def test_an_evaluation_that_raises_is_a_note_and_the_others_still_run(scratch_registry):
    ran = []

    @register_evaluation("broken", metrics=("x",))
    def broken(run):
        ran.append("broken")
        assert not run.model.training  # evaluations see the model in eval mode
        raise RuntimeError("no luck")

    @register_evaluation("fine", metrics=("y",))
    def fine(run):
        ran.append("fine")
        return {"y": 1.0}, ["a remark"]

    run = fake_run()
    switches = EvalConfig(decode=False, extrapolation=False)
    metrics, notes = run_evaluations(run, switches)
    assert ran == ["broken", "fine"]  # no switch of their own: they always run
    assert metrics == {"y": 1.0}
    assert notes == ["broken metrics not recorded: RuntimeError: no luck", "a remark"]
    assert run.model.training  # left as it was


def test_a_name_is_registered_once(scratch_registry):
    with pytest.raises(ValueError, match="registered twice"):
        register_evaluation("decode", metrics=())(lambda run: ({}, []))
