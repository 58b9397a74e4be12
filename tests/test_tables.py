"""Config flattening (abl.analysis.tables): one function for the report's grid tables and the dashboard's config diff."""

import json

import pytest

from abl.analysis.tables import ABSENT, flatten

CONFIG = {"seed": 1, "model": {"d_model": 64, "norm": "rmsnorm", "sizes": [1, 2]},
          "train": {"lr": 1e-3, "schedule": {}},
          "layers": [{"kind": "attn"}, {"kind": "ssm", "state": 16}]}


def test_report_flattening_keeps_a_list_of_objects_as_one_json_cell():
    assert flatten(CONFIG) == {
        "seed": 1, "model.d_model": 64, "model.norm": "rmsnorm", "model.sizes": [1, 2], "train.lr": 1e-3,
        "layers": json.dumps(CONFIG["layers"], sort_keys=True)}


def test_diff_flattening_names_each_list_element():
    flat = flatten(CONFIG, index_lists=True)
    assert flat["layers[0].kind"] == "attn" and flat["layers[1].state"] == 16
    assert flat["model.sizes"] == [1, 2]  # a list of scalars stays one value
    assert "layers" not in flat and "train.schedule" not in flat


def test_config_diff_reads_json_text_ignores_the_seed_and_shows_absent_keys():
    pytest.importorskip("pandas")
    from abl.analysis.tables import config_diff

    other = json.loads(json.dumps(CONFIG))
    other["seed"] = 2
    other["layers"][1]["state"] = 32
    del other["train"]["lr"]
    d = config_diff(json.dumps(CONFIG), other)
    assert d.to_dict("records") == [
        {"path": "layers[1].state", "this run": "16", "baseline": "32"},
        {"path": "train.lr", "this run": "0.001", "baseline": ABSENT}]
