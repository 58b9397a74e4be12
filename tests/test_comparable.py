"""val_loss is not tested across tokenizers (issue 26): nats per token do not compare between cells
whose tokens differ; val_bpb does. abl.analysis.comparable, applied in abl.analysis.verdicts.analyse_runs
(the summary, abl compare and the dashboard's verdict tables)."""

from __future__ import annotations

import pytest
from conftest import stored_run

from abl.analysis import comparable, verdicts


def config(tok, vocab=None, ffn="gelu"):
    comps = {"dataset": {"name": "pystdlib", "params": {"max_bytes": 100}},
             "tokenizer": {"name": tok, "params": {"vocab_size": vocab} if vocab else {}}}
    return {"model": {"ffn": ffn, "context": 32}, "train": {"batch_size": 4},
            "data": {"dataset": "pystdlib", "tokenizer": tok}, "components": comps}


def runs(cells):
    out = []
    for key, cfg, loss, bpb in cells:
        for s in range(4):
            out.append(stored_run(key, s, {"val_loss": loss + s / 100, "val_bpb": bpb + s / 97}, cfg,
                                  data_fingerprint=f"fp-{key}"))
    return out


TOKENIZER_GRID = runs([("byte", config("byte"), 1.0, 1.44), ("bpe1k", config("bpe", 1024), 3.0, 1.20),
                       ("bpe4k", config("bpe", 4096), 3.5, 1.10)])


def test_val_loss_gets_no_verdict_between_cells_with_different_tokenizers():
    cells, analysis, what = verdicts.analyse_runs(TOKENIZER_GRID, metric="val_loss")
    assert analysis.comparisons == [] or not list(analysis.comparisons)
    assert "2 comparisons left out" in what and "compare val_bpb" in what
    _, by_pairs, what = verdicts.analyse_runs(TOKENIZER_GRID, metric="val_loss", pairs=["bpe1k,bpe4k"])
    assert not list(by_pairs.comparisons) and "1 comparison left out" in what  # another vocabulary: another unit


def test_val_bpb_is_compared_across_tokenizers():
    _, analysis, what = verdicts.analyse_runs(TOKENIZER_GRID, metric="val_bpb")
    assert len(analysis.comparisons) == 2 and "left out" not in what


def test_val_loss_is_still_compared_within_one_tokenizer():
    grid = runs([("gelu", config("bpe", 1024), 3.0, 1.2), ("relu", config("bpe", 1024, "relu"), 3.1, 1.25)])
    _, analysis, what = verdicts.analyse_runs(grid, metric="val_loss")
    assert len(analysis.comparisons) == 1 and "left out" not in what


@pytest.mark.parametrize("metric, same, expected", [
    ("val_loss", False, False), ("val_loss", True, True), ("val_bpb", False, True), ("tokens_per_s", False, False),
    ("peak_mem_bytes", False, True)])
def test_may_compare_follows_the_catalogue(metric, same, expected):
    a = verdicts.settings(config("byte"))
    b = verdicts.settings(config("byte" if same else "bpe", None if same else 1024))
    assert comparable.may_compare(metric, a, b) is expected
