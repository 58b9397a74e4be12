"""Tokenizers (axis ``tokenizer``), local Hugging Face datasets and the one token store per database."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import run_abl

from abl.data import tokenstore
from abl.data.corpus import DataError
from abl.grid.gridfile import expand
from abl.plugins.datasets import python_stdlib
from abl.plugins.tokenizers import ByteLevelBPE, ByteTokenizer, PretrainedTokenizer

UNICODE_DOC = "déjà vu: naïve café, 漢字 and 🙂 emoji\n\ttabs  and   spaces\r\nend".encode()


def grid(tmp_path, tok="byte", dataset=None, **extra):
    raw = {
        "experiment": {"name": "tok", "seeds": [0]},
        "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32},
        "train": {"steps": 6, "batch_size": 4, "warmup_steps": 1, "eval_every": 3, "eval_batches": 2},
        "data": {"dataset": "pystdlib", "tokenizer": tok},
        "dataset": {"pystdlib": {"max_bytes": 200_000}},
        "eval": {"decode": False, "extrapolation": False},
    }
    if dataset:
        raw["data"]["dataset"] = dataset[0]
        raw["dataset"] = {dataset[0]: dataset[1]}
    for k, v in extra.items():
        raw.setdefault(k, {}).update(v)
    return raw


@pytest.fixture(scope="module")
def corpus():
    c = python_stdlib(max_bytes=400_000)
    c.val_docs.append(UNICODE_DOC)
    return c


@pytest.fixture(scope="module")
def bpe(corpus):
    tok = ByteLevelBPE(vocab_size=512)
    tok.train(corpus)
    return tok


# ---------------------------------------------------------------- tokenizers


def test_bpe_round_trips_the_validation_text_exactly(corpus, bpe):
    assert len(bpe._tok.get_vocab()) == 512
    encoded = bpe.encode(corpus.val_docs)
    for doc, (ids, nbytes) in zip(corpus.val_docs, encoded):
        assert bpe.decode(ids) == doc
        assert int(nbytes.sum()) == len(doc)  # every byte of the text is covered once
    # merges were learned: fewer tokens than bytes
    n_tokens = sum(len(ids) for ids, _ in encoded)
    assert n_tokens < 0.6 * sum(len(d) for d in corpus.val_docs)


def test_bpe_training_is_deterministic_and_its_fingerprint_is_its_definition(corpus, bpe):
    again = ByteLevelBPE(vocab_size=512)
    again.train(corpus)
    assert again.definition() == bpe.definition() and again.fingerprint() == bpe.fingerprint()
    restored = ByteLevelBPE(vocab_size=512)
    restored.load_definition(bpe.definition())
    assert [i.tolist() for i, _ in restored.encode(corpus.val_docs[:3])] == \
           [i.tolist() for i, _ in bpe.encode(corpus.val_docs[:3])]
    assert bpe.training_key(corpus) != ByteLevelBPE(vocab_size=1024).training_key(corpus)


def test_pretrained_tokenizer_from_a_file_or_a_folder(tmp_path, corpus, bpe):
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text(bpe.definition())
    for path in (tmp_path / "tok", tmp_path / "tok" / "tokenizer.json"):
        tok = PretrainedTokenizer(str(path))
        assert tok.vocab_size == 512 and tok.fingerprint() == bpe.fingerprint()
        for doc, (ids, nbytes) in zip(corpus.val_docs, tok.encode(corpus.val_docs)):
            # offsets give the same byte counts as the byte-level table, summing to the document
            assert int(nbytes.sum()) == len(doc)
            assert tok.decode(ids) == doc
    with pytest.raises(DataError, match="does not exist"):
        PretrainedTokenizer(str(tmp_path / "nope.json"))
    with pytest.raises(DataError, match="has no tokenizer.json"):
        PretrainedTokenizer(str(tmp_path))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DataError, match="not a tokenizer.json"):
        PretrainedTokenizer(str(tmp_path / "bad.json"))


def test_byte_tokenizer_is_todays_byte_stream(corpus):
    """The byte tokenizer through the store gives the stream (and fingerprint) bytes always gave."""
    from abl.data.corpus import fingerprint

    sep = ByteTokenizer().encode([b"\0"])[0]
    train, _ = tokenstore._join(ByteTokenizer().encode(corpus.train_docs), sep)
    assert np.array_equal(train, corpus.train)
    assert fingerprint(corpus.train.astype(np.uint16), corpus.val.astype(np.uint16), vocab_size=256) == \
        fingerprint(np.asarray(corpus.train, np.uint16), np.asarray(corpus.val, np.uint16), vocab_size=256)


def test_subword_tokenizers_need_utf8(tmp_path, registry):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 ".encode("latin-1") * 500)
    g = expand(grid(tmp_path, "bpe", ("text_file", {"path": str(bad)}), tokenizer={"bpe": {"vocab_size": 300}}),
               registry)
    with pytest.raises(DataError, match="not valid UTF-8.*data.tokenizer = 'byte' takes any bytes"):
        tokenstore.prepare_store(g.cells, registry, tmp_path / "tokens")
    assert not (tmp_path / "tokens").exists()


# ---------------------------------------------------------------- the store


def test_a_second_grid_reuses_the_trained_tokenizer_and_the_tokens(tmp_path, registry, monkeypatch):
    root = tmp_path / "tokens"
    g = expand(grid(tmp_path, "bpe", tokenizer={"bpe": {"vocab_size": 400}}), registry)
    lines: list[str] = []
    entries = tokenstore.prepare_store(g.cells, registry, root, lines.append)
    assert "tokenizer trained in" in lines[0] and "tokens built in" in lines[0] and "MiB" in lines[0]
    entry = entries[g.cells[0].run_id]
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["vocab_size"] == 400 and meta["tokenizer"] == "bpe" and meta["dtype"] == "<u2"
    trained = list((root / "tokenizers").glob("bpe-*.json"))
    assert len(trained) == 1
    restored = ByteLevelBPE(400)
    restored.load_definition(trained[0].read_text())
    assert meta["tokenizer_fingerprint"] == restored.fingerprint()
    assert (entry / "tokenizer.json").read_text() == trained[0].read_text()
    stamp = {p: p.stat().st_mtime_ns for p in [*trained, *entry.iterdir()]}

    # a second grid (another experiment, another seed) on the same data and tokenizer: nothing is trained
    def no_training(self, corpus):
        raise AssertionError("the BPE was trained again")

    monkeypatch.setattr(ByteLevelBPE, "train", no_training)
    monkeypatch.setattr(tokenstore, "_corpora", {})  # a new process: the corpus is read again
    g2 = expand(grid(tmp_path, "bpe", tokenizer={"bpe": {"vocab_size": 400}},
                     experiment={"name": "other", "seeds": [7]}), registry)
    lines2: list[str] = []
    entries2 = tokenstore.prepare_store(g2.cells, registry, root, lines2.append)
    assert entries2[g2.cells[0].run_id] == entry
    assert "tokenizer reused from tokenizers/bpe-" in lines2[0] and "tokens reused" in lines2[0]
    assert {p: p.stat().st_mtime_ns for p in stamp} == stamp  # nothing rewritten


def _linked_run(tmp_path, registry):
    """A cell, its token store entry as the parent builds it, and its run folder linked to the entry."""
    g = expand(grid(tmp_path), registry)
    cell = g.cells[0]
    entry = tokenstore.prepare_store(g.cells, registry, tmp_path / "tokens")[cell.run_id]
    run_dir = tmp_path / "runs" / cell.run_id
    run_dir.mkdir(parents=True)
    tokenstore.link_run(run_dir, entry)
    return cell, entry, run_dir


def test_workers_map_the_store_and_never_read_the_corpus(tmp_path, registry, monkeypatch):
    cell, entry, run_dir = _linked_run(tmp_path, registry)

    def unreadable(**params):
        raise AssertionError("the worker loaded the dataset")

    monkeypatch.setitem(registry.components, ("dataset", "pystdlib"),
                        registry.get("dataset", "pystdlib").__class__(**{
                            **registry.get("dataset", "pystdlib").__dict__, "factory": unreadable}))
    monkeypatch.setattr(tokenstore, "_corpora", {})
    monkeypatch.setattr(tokenstore, "_bound", None)
    tokenstore.bind(run_dir)
    data = tokenstore.cell_tokens(cell, registry)
    assert isinstance(data.train, np.memmap) and isinstance(data.val, np.memmap)
    assert data.vocab_size == 256 and data.meta["token_store"] == entry.name
    assert data.fingerprint == json.loads((entry / "meta.json").read_text())["data_fingerprint"]


def test_an_entry_is_mapped_once_per_process_until_it_is_rebuilt(tmp_path, registry, monkeypatch):
    """Issue 37: a warm worker's later cells reuse the mapped entry, its token-id scan and its int64
    validation tokens; a rebuilt entry (another meta.json) is mapped afresh."""
    cell, entry, run_dir = _linked_run(tmp_path, registry)
    monkeypatch.setattr(tokenstore, "_opened", {})
    monkeypatch.setattr(tokenstore, "_bound", None)
    maps: list[str] = []
    real_memmap = np.memmap

    def counted(path, *args, **kwargs):
        maps.append(str(path))
        return real_memmap(path, *args, **kwargs)

    monkeypatch.setattr(tokenstore.np, "memmap", counted)
    tokenstore.bind(run_dir)
    first = tokenstore.cell_tokens(cell, registry)
    first.check(16)
    n_maps = len(maps)
    assert n_maps >= 2  # train and val
    tokenstore.bind(run_dir)
    second = tokenstore.cell_tokens(cell, registry)
    assert second is first and len(maps) == n_maps
    assert "max_id" in second.__dict__ and second.val_int64 is first.val_int64

    # the entry rebuilt in place (as commit does after a torn write): a new meta.json, so a new mapping
    meta = (entry / "meta.json").read_text()
    (entry / "meta.json").unlink()
    (entry / "meta.json").write_text(meta)
    third = tokenstore.cell_tokens(cell, registry)
    assert third is not first and len(maps) == 2 * n_maps
    assert np.array_equal(third.val_int64, first.val_int64)


def test_a_build_removes_the_folders_killed_builds_left_and_keeps_a_live_builds(tmp_path, registry):
    """A build killed mid-write (SIGKILL, OOM) leaves its ``.KEY.tmpPID`` folder; the next build removes it once
    it is quiet and its PID is gone, and never a folder a live process (here: one building the same key) writes."""
    cell = expand(grid(tmp_path), registry).cells[0]
    root = tmp_path / "tokens"
    root.mkdir()
    prepared = tokenstore.prepare_tokens(cell.components["dataset"], cell.components["tokenizer"], registry,
                                         root, tokenstore.default_tokenizer(cell))
    killed = subprocess.Popen([sys.executable, "-c", "pass"])
    killed.wait()  # reaped: its PID names no process now
    building = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])

    def left(key, pid, age_s):
        folder = root / f".{key}.tmp{pid}"
        folder.mkdir()
        (folder / "train.bin").write_bytes(b"\0" * 64)
        for p in (folder / "train.bin", folder):
            os.utime(p, (time.time() - age_s, time.time() - age_s))
        return folder

    try:
        stale = left(prepared.key, killed.pid, 3600)
        other_key = left("0" * 20, killed.pid, 3600)
        live = left(prepared.key, building.pid, 3600)  # alive: a concurrent build of the same entry
        just_written = left("1" * 20, killed.pid, 5)  # a build in another PID namespace (container) may write
        abandoned = left("2" * 20, building.pid, 2 * 86_400)  # no build is this quiet: its PID was reused
        entry = tokenstore.commit(prepared, root)
        assert tokenstore._entry_ok(entry) is not None
        assert not stale.exists() and not other_key.exists() and not abandoned.exists()
        assert live.is_dir() and (live / "train.bin").is_file() and just_written.is_dir()
        assert any("3 folder(s) left by killed builds" in n for n in prepared.notes), prepared.notes
        assert sorted(p.name for p in root.iterdir()) == sorted([entry.name, live.name, just_written.name])
    finally:
        building.kill()
        building.wait()


def test_token_bin_goes_through_the_store_as_pretokenised(tmp_path, registry):
    b = tmp_path / "t.bin"
    (np.arange(6000) % 700).astype(np.uint16).tofile(b)
    g = expand(grid(tmp_path, dataset=("token_bin", {"path": str(b)})), registry)
    entry = tokenstore.prepare_store(g.cells, registry, tmp_path / "tokens")[g.cells[0].run_id]
    data = tokenstore.open_tokens(entry)
    assert data.vocab_size == 700 and data.tokenizer == "pretokenized" and data.val_bytes is None
    g = expand(grid(tmp_path, "bpe", dataset=("token_bin", {"path": str(b)})), registry)
    with pytest.raises(DataError, match="already tokenised; data.tokenizer = 'bpe' cannot apply"):
        tokenstore.prepare_store(g.cells, registry, tmp_path / "tokens2")


def test_model_vocab_follows_the_tokenizer(tmp_path, registry):
    from abl.model.costmodel import dataset_vocab_size

    for tok, params, vocab in (("byte", {}, 256), ("bpe", {"bpe": {"vocab_size": 1000}}, 1000)):
        cell = expand(grid(tmp_path, tok, tokenizer=params), registry).cells[0]
        assert dataset_vocab_size(cell, registry) == vocab  # nothing trained to know it


# ---------------------------------------------------------------- bits per byte


class ListSink:
    def __init__(self):
        self.rows = []

    def log(self, step, metrics):
        self.rows.append((step, dict(metrics)))

    def series(self, name):
        return [m[name] for _, m in self.rows if name in m]


# val_bpb is scored on the validation text's fixed byte spans: tests/test_span_bpb.py


# ---------------------------------------------------------------- hf datasets


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    datasets = pytest.importorskip("datasets")
    root = tmp_path_factory.mktemp("hf")
    texts = [f"def f{i}(x):\n    return x * {i}  # café\n" * 20 for i in range(60)]
    ds = datasets.Dataset.from_dict({"text": texts, "n": list(range(60))})
    ds.save_to_disk(str(root / "single"))
    datasets.DatasetDict({"train": ds.select(range(50)), "validation": ds.select(range(50, 60))}).save_to_disk(
        str(root / "dict"))
    with open(root / "rows.jsonl", "w") as f:
        for t in texts:
            f.write(json.dumps({"content": t}) + "\n")
    ds.to_parquet(str(root / "rows.parquet"))
    (root / "arrow").mkdir()  # a bare arrow file (no save_to_disk metadata beside it)
    shard, = (root / "single").glob("*.arrow")
    (root / "arrow" / "rows.arrow").write_bytes(shard.read_bytes())
    datasets.Dataset.from_dict({"text": ["", ""]}).save_to_disk(str(root / "empty"))
    return root, texts


def test_hf_dataset_from_disk_jsonl_and_parquet(hf_dir, registry):
    from abl.plugins.datasets import hf_dataset

    root, texts = hf_dir
    all_bytes = sorted(t.encode() for t in texts)
    for c in (hf_dataset(str(root / "single")), hf_dataset(str(root / "rows.jsonl"), column="content"),
              hf_dataset(str(root / "rows.parquet")), hf_dataset(str(root / "arrow"))):
        assert sorted(c.train_docs + c.val_docs) == all_bytes
        assert c.val_docs and c.train_docs
    d = hf_dataset(str(root / "dict"), val_split="validation")
    assert d.train_docs == [t.encode() for t in texts[:50]] and d.val_docs == [t.encode() for t in texts[50:]]
    assert hf_dataset(str(root / "single")).fingerprint == hf_dataset(str(root / "single")).fingerprint


@pytest.mark.parametrize("params, message", [
    ({"path": "nowhere"}, "hf dataset path 'nowhere' does not exist"),
    ({"path": "{root}/single", "column": "txt"}, "has no column 'txt' \\(columns: text, n\\)"),
    ({"path": "{root}/single", "column": "n"}, "holds int values"),
    ({"path": "{root}/empty"}, "is empty: no text in column 'text'"),
    ({"path": "{root}/dict", "split": "dev"}, "has no split 'dev' \\(splits: train, validation\\)"),
    ({"path": "{root}/single", "val_split": "test"}, "is a single split"),
    ({"path": ""}, "dataset hf needs a path"),
])
def test_hf_dataset_errors_are_clear(hf_dir, params, message):
    from abl.plugins.datasets import hf_dataset

    root, _ = hf_dir
    params = {k: v.format(root=root) if isinstance(v, str) else v for k, v in params.items()}
    with pytest.raises(DataError, match=message):
        hf_dataset(**params)


# ---------------------------------------------------------------- checks in the parent (issue 13, point 4)


@pytest.mark.parametrize("params, message", [
    ({"column": "body"}, "dataset 'hf': hf dataset .* has no column 'body'"),
    ({"column": "text", "path": "{root}/empty"}, "dataset 'hf': hf dataset .* is empty"),
])
def test_hf_problems_are_found_before_anything_is_written(tmp_path, registry, hf_dir, params, message):
    root, _ = hf_dir
    params = {"path": str(root / "single"), **{k: v.format(root=root) for k, v in params.items()}}
    g = expand(grid(tmp_path, "bpe", dataset=("hf", params)), registry)
    with pytest.raises(DataError, match=message):
        tokenstore.prepare_store(g.cells, registry, tmp_path / "store" / "tokens")
    assert not (tmp_path / "store").exists()


def _problems(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "short.txt").write_text("tiny corpus " * 10)
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    (tmp_path / "adir.bin").mkdir()
    return {
        "empty text_file": (("text_file", {"path": str(tmp_path / "empty.txt")}), {}, "is empty"),
        "context longer than the data": (("text_file", {"path": str(tmp_path / "short.txt")}), {},
                                         "model.context=32 is too long for the data: the validation split has 12"),
        "missing token_bin": (("token_bin", {"path": str(tmp_path / "missing.bin")}), {}, "does not exist"),
        "odd token_bin": (("token_bin", {"path": str(tmp_path / "odd.bin")}), {}, "has an odd size \\(3 bytes\\)"),
        "token_bin directory": (("token_bin", {"path": str(tmp_path / "adir.bin")}), {}, "is a directory"),
        "vocabulary too small": (None, {"model": {"vocab_size": 200}},
                                 "model.vocab_size=200 is smaller than the vocabulary of its data \\(256"),
        "missing hf path": (("hf", {"path": str(tmp_path / "no-such-dataset")}), {}, "does not exist"),
    }


@pytest.mark.parametrize("case", [
    "empty text_file", "context longer than the data", "missing token_bin", "odd token_bin", "token_bin directory",
    "vocabulary too small", "missing hf path"])
def test_each_data_problem_is_found_before_anything_is_written(tmp_path, registry, case):
    dataset, extra, message = _problems(tmp_path)[case]
    g = expand(grid(tmp_path, dataset=dataset, **extra), registry)
    with pytest.raises(DataError, match=message):
        tokenstore.prepare_store(g.cells, registry, tmp_path / "store" / "tokens")
    assert not (tmp_path / "store").exists()


def test_every_problem_of_a_grid_is_reported_at_once_with_exit_2_and_no_store(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    g = tmp_path / "g.toml"
    g.write_text(f"""
[experiment]
name = "bad-data"
[model]
d_model = 32
n_layers = 1
n_heads = 2
context = 64
[train]
steps = 2
[grid]
"data.dataset" = ["text_file", "token_bin", "hf", "pystdlib"]
"model.vocab_size" = [0, 100]
exclude = [{{ "data.dataset" = "text_file", "model.vocab_size" = 100 }},
           {{ "data.dataset" = "token_bin", "model.vocab_size" = 100 }},
           {{ "data.dataset" = "hf", "model.vocab_size" = 100 }},
           {{ "data.dataset" = "pystdlib", "model.vocab_size" = 0 }}]
[dataset.text_file]
path = {json.dumps(str(tmp_path / "empty.txt"))}
[dataset.token_bin]
path = {json.dumps(str(tmp_path / "odd.bin"))}
[dataset.hf]
path = {json.dumps(str(tmp_path / "missing"))}
[dataset.pystdlib]
max_bytes = 200000
""")
    db = tmp_path / "res" / "x.duckdb"
    r = run_abl(["run", str(g), "--db", str(db)])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    err = r.stderr
    assert "text file" in err and "is empty" in err
    assert "has an odd size" in err
    assert "hf dataset path" in err and "does not exist" in err
    assert "model.vocab_size=100 is smaller than the vocabulary of its data (256" in err
    # one line per problem; the new-store note and the closing "no store was created" are not problems
    problems = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("note: new store at")
                and not ln.startswith("no store was created at")]
    assert len(problems) == 4, err
    assert f"no store was created at {db}" in err
    assert not (tmp_path / "res").exists()  # no database, no run folders, no token store


def test_import_abl_loads_neither_datasets_nor_tokenizers():
    code = ("import sys, abl, abl.cli; "
            "print([m for m in ('torch', 'datasets', 'tokenizers') if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


@pytest.mark.slow
def test_a_grid_of_tokenizers_runs_reports_bits_per_byte_and_a_second_grid_trains_no_tokenizer(tmp_path):
    g = tmp_path / "g.toml"
    g.write_text("""
[experiment]
name = "tok-cli"
[model]
d_model = 32
n_layers = 1
n_heads = 2
context = 32
[train]
steps = 4
batch_size = 4
eval_every = 2
eval_batches = 2
[data]
dataset = "pystdlib"
[dataset.pystdlib]
max_bytes = 200000
[eval]
decode = false
extrapolation = false
[grid]
"data.tokenizer" = ["byte", "bpe"]
[tokenizer.bpe]
vocab_size = 300
""")
    db = tmp_path / "x.duckdb"
    r = run_abl(["run", str(g), "--db", str(db)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "tokenizer trained in" in r.stdout and "val_bpb by cell" in r.stdout and "bits per byte" in r.stdout
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT r.env->>'$.tokenizer', r.env->>'$.tokenizer_fingerprint', "
                       "r.config->>'$.components.tokenizer.params.vocab_size', m.value FROM runs r "
                       "JOIN metrics m USING (run_id) WHERE m.name = 'val_bpb' AND m.step = 4").fetchall()
    con.close()
    assert sorted(r[0] for r in rows) == ["bpe", "byte"] and all(len(r[1]) == 64 for r in rows)
    assert [r[2] for r in rows if r[0] == "bpe"] == ["300"]
    # a second grid on the same store: other seeds, same data and tokenizers: nothing is trained again
    r2 = run_abl(["run", str(g), "--db", str(db), "--set", "experiment.seeds=[5]"])
    assert r2.returncode == 0, r2.stdout + r2.stderr
    assert "tokenizer trained" not in r2.stdout
    assert "tokenizer reused from tokenizers/bpe-" in r2.stdout and r2.stdout.count("tokens reused") == 2


def test_cells_with_different_tokenizers_are_compared_in_bits_per_byte():
    from abl.present.report.runs import Cell, cell_statistics, comparison_metric
    from abl.store.reader import StoredRun as Run

    def run(key, seed, tok, loss, bpb):
        cfg = {"components": {"dataset": {"name": "pystdlib", "params": {}}, "tokenizer": {"name": tok, "params": {}}},
               "model": {"context": 32}, "train": {"batch_size": 4}}
        return Run(f"{key}{seed}", "e", key, key, seed, "completed", cfg, "c", {}, "cpu", {}, f"fp-{tok}", "", "",
                   final={"val_loss": loss, "val_bpb": bpb})

    byte = Cell("byte", "byte", [run("byte", s, "byte", 1.0 + s / 100, 1.44 + s / 100) for s in range(3)])
    bpe = Cell("bpe", "bpe", [run("bpe", s, "bpe", 3.0 + s / 100, 1.20 + s / 100) for s in range(3)])
    assert comparison_metric([byte, bpe]) == "val_bpb"
    rows = cell_statistics([byte, bpe], byte, metric="val_bpb")
    assert rows[1]["delta"] == pytest.approx(-0.24)  # bpe is better per byte though worse per token
    assert comparison_metric([byte]) == "val_loss"  # one tokenizer: tokens are the same unit
    same = Cell("byte2", "byte2", [run("byte2", s, "byte", 1.1, 1.5) for s in range(3)])
    assert comparison_metric([byte, same]) == "val_loss"
