"""Bits per byte on identical bytes across tokenizers (issue 26), and lossy tokenizers refused.

Before: each cell scored val_bpb over its own token stream's validation windows, so a byte cell
and a BPE cell scored different text (1.9% and 5.1-6.7% of the split, in different places) and a
fixed model rated the two samples up to 0.09 bits/byte apart. Now every cell scores the same
fixed byte spans of the validation text, each tokenised whole (abl.data.spans, abl.train.spanscore).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from conftest import run_abl

from abl.data import tokenstore
from abl.data.corpus import DOCUMENT_SEPARATOR, Batches, DataError
from abl.data.spans import choose_byte_spans
from abl.grid.gridfile import expand
from abl.train.spanscore import IGNORE, score_spans, span_windows

BYTE = {"name": "byte", "params": {}}
DATASET = {"name": "pystdlib", "params": {"max_bytes": 300_000}}


def bpe_spec(vocab):
    return {"name": "bpe", "params": {"vocab_size": vocab, "min_frequency": 2}}


def store_data(registry, tokenizer):
    p = tokenstore.prepare_tokens(DATASET, tokenizer, registry, None, "byte")
    return tokenstore.tokendata(p.meta, p.arrays)


@pytest.fixture(scope="module")
def datas(registry):
    return {"byte": store_data(registry, BYTE), "bpe-300": store_data(registry, bpe_spec(300)),
            "bpe-1k": store_data(registry, bpe_spec(1024))}


@pytest.fixture(scope="module")
def val_text(registry):
    corpus = tokenstore.load_corpus(DATASET, registry)
    return DOCUMENT_SEPARATOR.join(corpus.val_docs), b"".join(corpus.train_docs)


class BigramBytes:
    """A fixed, model-free scorer: a byte bigram model (add-one) of the training text. A token's nats are
    the sum over its bytes, each given the byte before it, so the nats of a span do not depend on
    how it is cut into tokens: the bits per byte of identical bytes must come out identical."""

    def __init__(self, train: bytes):
        counts = np.ones((256, 256))
        a = np.frombuffer(train, np.uint8)
        np.add.at(counts, (a[:-1], a[1:]), 1)
        self.logp = np.log(counts / counts.sum(1, keepdims=True))

    def text_nats(self, text: bytes, before: int) -> float:
        b = np.frombuffer(bytes([before]) + text, np.uint8)
        return float(-self.logp[b[:-1], b[1:]].sum())

    def scorer(self, pieces: dict[int, bytes]):
        def nats(x, y):
            total = 0.0
            for xs, ys in zip(x, y):
                for prev, tgt in zip(xs, ys):
                    if tgt != IGNORE:
                        total += self.text_nats(pieces[int(tgt)], pieces[int(prev)][-1])
            return total
        return nats


@pytest.fixture(scope="module")
def tokenizers(registry, datas):
    toks = {"byte": tokenstore.make_tokenizer(BYTE, registry)}
    corpus = tokenstore.load_corpus(DATASET, registry)
    for key, vocab in (("bpe-300", 300), ("bpe-1k", 1024)):
        tok = tokenstore.make_tokenizer(bpe_spec(vocab), registry)
        tok.train(corpus)
        toks[key] = tok
    return toks


def id_bytes(tok, data) -> dict[int, bytes]:
    """id -> bytes via the tokenizer's own byte counts over each span (exact for a lossless tokenizer)."""
    spans, out = data.val_spans, {}
    for i in range(len(spans)):
        ids = spans.span(i)
        text = tok.decode(ids[spans.prefix:])
        counts = tok.encode([text])[0][1]
        at = 0
        for t, n in zip(ids[spans.prefix:], counts):
            out[int(t)] = text[at:at + int(n)]
            at += int(n)
        for t in ids[:spans.prefix]:
            out[int(t)] = DOCUMENT_SEPARATOR
    return out


def test_every_tokenizer_gets_the_same_byte_spans_and_each_span_is_its_text(datas, val_text):
    text = val_text[0]
    tables = {k: (list(d.val_spans.starts), list(d.val_spans.lengths)) for k, d in datas.items()}
    assert tables["byte"] == tables["bpe-300"] == tables["bpe-1k"]
    assert len(tables["byte"][0]) > 16 and all(n > 0 for n in tables["byte"][1])
    assert [tuple(s) for s in zip(*tables["byte"])] == choose_byte_spans(text)  # from the text alone
    chosen = {k: list(d.val_spans.chosen(8 * 16 * 128)) for k, d in datas.items()}
    assert chosen["byte"] == chosen["bpe-300"] == chosen["bpe-1k"] and len(chosen["byte"]) == 16
    byte = datas["byte"].val_spans
    for i in range(len(byte)):  # the byte tokenizer's span tokens are the span's bytes, after a separator
        a, n = int(byte.starts[i]), int(byte.lengths[i])
        assert bytes(byte.span(i)[byte.prefix:].astype(np.uint8)) == text[a:a + n]


def test_every_target_of_a_span_is_scored_once(datas):
    spans = datas["bpe-300"].val_spans
    x, y = span_windows(spans, [0, 3], context=16)
    targets = y[y != IGNORE]
    expected = np.concatenate([spans.span(i)[spans.prefix:] for i in (0, 3)])
    assert np.array_equal(targets, expected)
    # an input is always the token before its target
    for xs, ys in zip(x, y):
        both = (ys[:-1] != IGNORE) & (ys[1:] != IGNORE)
        assert np.array_equal(xs[1:][both], ys[:-1][both])


def test_a_fixed_scorer_gives_identical_bits_per_byte_under_every_tokenizer(datas, tokenizers, val_text):
    """The finding: a fixed bigram model rated the byte and BPE cells' validation samples up to 0.09
    bits/byte apart. On the spans it must give one figure, the one of the bytes themselves."""
    text, train = val_text
    model = BigramBytes(train)
    spans = datas["byte"].val_spans
    chosen = spans.chosen(8 * 16 * 128)
    direct = sum(model.text_nats(text[int(spans.starts[i]):int(spans.starts[i] + spans.lengths[i])], 0)
                 for i in chosen) / (math.log(2) * sum(int(spans.lengths[i]) for i in chosen))
    got = {k: score_spans(model.scorer(id_bytes(tokenizers[k], d)), d.val_spans, chosen, 32, 8)
           for k, d in datas.items()}
    for k, v in got.items():
        assert v == pytest.approx(direct, abs=1e-9), k
    # today's windows: the same model over each tokenizer's own validation windows (the old val_bpb)
    old = {}
    for k, d in datas.items():
        pieces = id_bytes(tokenizers[k], d)
        batches = Batches(d, 32, 16, seed=0)
        nats = sum(model.scorer(pieces)(x.numpy(), y.numpy()) for x, y in batches.val_batches(8))
        old[k] = nats / (math.log(2) * batches.val_target_counts(8)[1])
    assert max(old.values()) - min(old.values()) > 0.01  # the confound the spans remove


def test_training_scores_val_bpb_on_the_same_spans_whatever_the_tokenizer(tmp_path, registry):
    from test_tokenstore import ListSink, grid

    from abl.train.loop import train

    infos, sinks = {}, {}
    for tok in ("byte", "bpe"):
        raw = grid(tmp_path, tok, tokenizer={"bpe": {"vocab_size": 300}})
        cell = expand(raw, registry).cells[0]
        got: list[dict] = []
        sinks[tok] = ListSink()
        train(cell, registry, sinks[tok], on_info=got.append)
        infos[tok] = got[0]
    assert infos["byte"]["val_bpb_spans"] == infos["bpe"]["val_bpb_spans"]
    assert infos["byte"]["val_bpb_spans"]["bytes"] >= 2 * 4 * 32  # eval_batches x batch_size x context
    # what the analysis compares (abl.analysis.verdicts.flag_different_targets): val_bpb on the same bytes,
    # val_loss on different tokens
    byte_fp, bpe_fp = infos["byte"]["scored_targets"], infos["bpe"]["scored_targets"]
    assert byte_fp["val_bpb"] == bpe_fp["val_bpb"] == infos["byte"]["val_bpb_spans"]["sha256"]
    assert byte_fp["val_loss"] != bpe_fp["val_loss"]
    for tok in ("byte", "bpe"):
        bpb = sinks[tok].series("val_bpb")
        assert len(bpb) == 2 and all(0 < v < 9 for v in bpb)


@pytest.mark.parametrize("tok", ["byte", "bpe"])
def test_val_bpb_is_the_models_nats_over_the_spans_bytes(tmp_path, registry, tok):
    """Recomputed through the model's own loss, window by window, over the bytes of the chosen spans."""
    import torch
    from test_tokenstore import grid

    from abl.train import spanscore
    from abl.train.loop import prepare

    cell = expand(grid(tmp_path, tok, tokenizer={"bpe": {"vocab_size": 300}}), registry).cells[0]
    run = prepare(cell, registry)
    got = spanscore.val_bpb(run, float("nan"))
    spans, ctx_len = run.data.val_spans, cell.model.context
    assert spans.prefix == 1
    chosen = spans.chosen(cell.train.eval_batches * cell.train.batch_size * ctx_len)
    total, n_bytes = 0.0, 0
    run.core.eval()
    with torch.no_grad():
        for i in chosen:
            z = torch.from_numpy(spans.span(int(i)))
            n_bytes += int(spans.lengths[int(i)])
            for k in range(0, len(z) - 1, ctx_len):
                y = z[k + 1:k + 1 + ctx_len][None]
                _, _, c = run.core(z[k:k + y.shape[1]][None], y)
                total += float(c.metrics["ce_loss"]) * y.shape[1]
    assert got == pytest.approx(total / (math.log(2) * n_bytes), rel=1e-5)
    if tok == "byte":  # one token per byte: as many targets as bytes
        assert sum(len(spans.span(int(i))) - 1 for i in chosen) == n_bytes


# ---------------------------------------------------------------- lossy tokenizers


@pytest.fixture(scope="module")
def lossy_json(tmp_path_factory, val_text):
    """A tokenizer.json that lowercases its input: decode(encode(s)) != s for any text with capitals."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([val_text[1][:100_000].decode()], trainer=trainer)
    path = tmp_path_factory.mktemp("lossy") / "tokenizer.json"
    path.write_text(tok.to_str())
    return path


def lossy_grid(tmp_path, path, **data):
    from test_tokenstore import grid

    raw = grid(tmp_path, "pretrained", tokenizer={"pretrained": {"path": str(path)}})
    raw["data"].update(data)
    return raw


def test_a_lossy_tokenizer_is_refused_before_training(tmp_path, registry, lossy_json):
    cells = expand(lossy_grid(tmp_path, lossy_json), registry).cells
    with pytest.raises(DataError, match="does not give back the validation text.*accept_lossy_tokenizer = true"):
        tokenstore.prepare_store(cells, registry, tmp_path / "tokens")
    assert not (tmp_path / "tokens").exists()


def test_a_lossy_tokenizer_the_grid_accepts_trains_and_its_run_carries_a_note(tmp_path, registry, lossy_json):
    from test_tokenstore import ListSink

    from abl.train.loop import train

    cells = expand(lossy_grid(tmp_path, lossy_json, accept_lossy_tokenizer=True), registry).cells
    assert cells[0].config["data"]["accept_lossy_tokenizer"] is True
    entries = tokenstore.prepare_store(cells, registry, tmp_path / "tokens")
    tokenstore.link_run(tmp_path, entries[cells[0].run_id])
    tokenstore.bind(tmp_path)
    try:
        summary = train(cells[0], registry, ListSink())
    finally:
        tokenstore.bind(tmp_path / "nowhere")
    assert any("does not give back the validation text" in n and "accepted" in n for n in summary["notes"])


def test_the_default_leaves_the_stored_config_and_run_ids_as_they_were(tmp_path, registry):
    from test_tokenstore import grid

    cell = expand(grid(tmp_path), registry).cells[0]
    assert "accept_lossy_tokenizer" not in cell.config["data"]
    accepted = expand(lossy_grid(tmp_path, tmp_path / "x.json", accept_lossy_tokenizer=False), registry).cells[0]
    assert "accept_lossy_tokenizer" not in accepted.config["data"]


@pytest.mark.slow
def test_abl_run_refuses_a_lossy_tokenizer_with_exit_2(tmp_path, lossy_json):
    g = tmp_path / "g.toml"
    g.write_text(f"""
[experiment]
name = "lossy"
[model]
d_model = 32
n_layers = 1
n_heads = 2
context = 32
[train]
steps = 2
batch_size = 4
[data]
tokenizer = "pretrained"
[tokenizer.pretrained]
path = "{lossy_json.as_posix()}"
[dataset.pystdlib]
max_bytes = 200000
""")
    r = run_abl(["run", str(g), "--db", str(tmp_path / "x.duckdb")])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "does not give back the validation text" in r.stdout + r.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
