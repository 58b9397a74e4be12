"""The token store: each (corpus, tokenizer) pair tokenised once per store, memory-mapped by every worker.

A dataset plugin gives a ``TextCorpus`` (text documents split into train and
validation) or ``TokenData`` (ids already tokenised). A tokenizer plugin
(axis ``tokenizer``, selected by ``data.tokenizer``) turns a corpus into
tokens. The ``abl run`` parent does this once for every distinct pair in the
grid (``prepare_store``) and writes the result beside the database::

    tokens/
      tokenizers/<training key>.json    tokenizers trained on the data, keyed by
                                        corpus fingerprint + the tokenizer's parameters
      <store key>/meta.json             what the arrays hold (vocabulary, sizes, fingerprints)
      <store key>/train.bin, val.bin    flat little-endian uint16 (vocabulary <= 65,536) or uint32 ids
      <store key>/val_bytes.bin         uint32: bytes of validation text each validation token covers
      <store key>/val_spans.bin         fixed byte spans of the validation text, each tokenised whole
                                        (val_bpb scores these; the byte table is in meta.json)
      <store key>/tokenizer.json        the tokenizer's definition, when it has one

The store key is a hash of (corpus fingerprint, tokenizer fingerprint), so a
second grid on the same data and tokenizer reuses both the trained tokenizer
and the tokens. Every run folder gets a ``tokens.json`` naming its store
entry; the worker maps the arrays read-only (``bind`` + ``cell_tokens``) and
never reads, hashes or tokenises the corpus itself.

Everything is checked before anything is written (``prepare_store`` raises
``DataError`` with one line per problem): a dataset that cannot be loaded,
a vocabulary too small for the data, a context longer than a split, a
tokenizer that does not give back the validation text it encoded (unless the
grid sets ``data.accept_lossy_tokenizer``; its runs then carry a note).

Nothing here names a specific dataset or tokenizer.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import files
from .corpus import DOCUMENT_SEPARATOR, DataError, TextCorpus, TokenData, fingerprint
from .spans import ByteSpans, encode_spans, lossy_errors
from .tokenizer import Tokenizer  # a tokenizer plugin's base class (also imported from here)

TOKENS_DIR = "tokens"
TOKENIZERS_DIR = "tokenizers"
RUN_LINK = "tokens.json"  # in a run folder: which store entry the worker maps
FORMAT = 2  # 2: val_spans.bin and the round-trip check; an entry of format 1 is built again


def sha256_text(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() + b"\0")
    return h.hexdigest()


def spec_key(spec: dict[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True, default=str)


# ---------------------------------------------------------------- loading (memoised per process)

_corpora: dict[str, TextCorpus | TokenData] = {}


def load_corpus(spec: dict[str, Any], registry) -> TextCorpus | TokenData:
    """The dataset a spec names, loaded once per process. Raises DataError with the dataset's name."""
    key = spec_key(spec)
    if key in _corpora:
        return _corpora[key]
    comp = registry.get("dataset", spec["name"])
    try:
        data = comp.factory(**spec["params"])
    except DataError as exc:
        raise DataError(f"dataset {spec['name']!r}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a broken file is the user's input: say so, no traceback
        raise DataError(f"dataset {spec['name']!r} failed to load: {type(exc).__name__}: {exc}") from None
    if not isinstance(data, (TextCorpus, TokenData)):
        raise DataError(f"dataset {spec['name']!r} (plugin {comp.plugin!r}) returned {type(data).__name__}; "
                        "a dataset factory returns abl.TextCorpus or abl.TokenData")
    if isinstance(data, TextCorpus):
        for split, docs in (("train", data.train_docs), ("validation", data.val_docs)):
            if not any(docs):
                raise DataError(f"dataset {spec['name']!r}: the {split} split has no text")
    _corpora[key] = data
    return data


def make_tokenizer(spec: dict[str, Any], registry) -> Tokenizer:
    comp = registry.get("tokenizer", spec["name"])
    try:
        tok = comp.factory(**spec["params"])
    except DataError as exc:
        raise DataError(f"tokenizer {spec['name']!r}: {exc}") from None
    if not isinstance(tok, Tokenizer):
        raise DataError(f"tokenizer {spec['name']!r} (plugin {comp.plugin!r}) returned {type(tok).__name__}, "
                        "not an abl.Tokenizer")
    return tok


def default_tokenizer(cell) -> str:
    """The tokenizer a cell gets when its grid names none (``data.tokenizer``'s default)."""
    return str(type(cell.data)().tokenizer)


def vocab_size(cell, registry) -> int:
    """The vocabulary of a cell's data: its tokenizer's, a pre-tokenised dataset's, or a task's (its
    ``vocab_size``, as training takes it); no training."""
    from .tasks import is_task_factory

    spec = cell.components["dataset"]
    factory = registry.get("dataset", spec["name"]).factory
    if is_task_factory(factory):
        return int(factory(**spec["params"]).vocab_size)
    data = load_corpus(spec, registry)
    if isinstance(data, TokenData):
        return int(data.vocab_size)
    return int(make_tokenizer(cell.components["tokenizer"], registry).vocab_size)


# ---------------------------------------------------------------- tokenising


@dataclass
class Prepared:
    """One (corpus, tokenizer) pair: in the store already (``arrays`` None) or built now, not yet written."""

    key: str
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray] | None = None
    definition: str | None = None
    trained: tuple[str, str] | None = None  # (training key, definition) to cache
    notes: list[str] = field(default_factory=list)


def _join(pieces: list[tuple[np.ndarray, np.ndarray]], sep: tuple[np.ndarray, np.ndarray]
          ) -> tuple[np.ndarray, np.ndarray]:
    ids: list[np.ndarray] = []
    nbytes: list[np.ndarray] = []
    for i, (a, b) in enumerate(pieces):
        ids += [sep[0], a] if i else [a]
        nbytes += [sep[1], b] if i else [b]
    if not ids:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return (np.concatenate([np.asarray(a, np.int64) for a in ids]),
            np.concatenate([np.asarray(b, np.int64) for b in nbytes]))


def token_dtype(vocab: int) -> np.dtype:
    return np.dtype("<u2") if vocab <= 2**16 else np.dtype("<u4")  # little-endian on every machine


def _entry_ok(folder: Path) -> dict[str, Any] | None:
    """The meta of a complete store entry, else None (absent, torn or of another format)."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        return None
    item = np.dtype(meta["dtype"]).itemsize
    sizes = {"train.bin": meta["n_train"] * item, "val.bin": meta["n_val"] * item}
    if meta.get("has_val_bytes"):
        sizes["val_bytes.bin"] = meta["n_val"] * 4
    if meta.get("val_spans"):
        sizes["val_spans.bin"] = meta["val_spans"]["offsets"][-1] * item
    for name, size in sizes.items():
        try:
            if (folder / name).stat().st_size != size:
                return None
        except OSError:
            return None
    return meta


def prepare_tokens(dataset: dict[str, Any], tokenizer: dict[str, Any], registry, root: Path | None,
                   default_tokenizer: str) -> Prepared:
    """The tokens of one (dataset, tokenizer) pair: found in the store at ``root``, or built in memory.

    Nothing is written here (``commit`` does that once every check passed).
    ``default_tokenizer`` is the only one an already tokenised dataset accepts.
    Raises DataError.
    """
    t0 = time.perf_counter()
    corpus = load_corpus(dataset, registry)
    notes: list[str] = []
    trained: tuple[str, str] | None = None
    if isinstance(corpus, TokenData):
        if tokenizer["name"] != default_tokenizer:
            raise DataError(f"dataset {dataset['name']!r} is already tokenised; data.tokenizer = "
                            f"{tokenizer['name']!r} cannot apply to it (leave data.tokenizer at "
                            f"{default_tokenizer!r})")
        key = sha256_text("pretokenized", corpus.fingerprint)[:20]
        tok_meta = {"tokenizer": "pretokenized", "tokenizer_params": {}, "tokenizer_fingerprint": "",
                    "tokenizer_description": corpus.tokenizer, "corpus_fingerprint": corpus.fingerprint}
        vocab, tok = int(corpus.vocab_size), None
    else:
        tok = make_tokenizer(tokenizer, registry)
        tkey = tok.training_key(corpus)
        if tkey is not None:
            try:  # a plugin's key names a file: it must stay a name inside tokenizers/
                cached = files.confined(root / TOKENIZERS_DIR, f"{tkey}.json", f"tokenizer {tokenizer['name']!r}'s "
                                        "training key") if root is not None else None
            except files.PathRefused as exc:
                raise DataError(str(exc)) from None
            if cached is not None and cached.is_file():
                tok.load_definition(cached.read_text())
                notes.append(f"tokenizer reused from {cached.parent.name}/{cached.name}, not trained again")
            else:
                t = time.perf_counter()
                try:
                    tok.train(corpus)
                except DataError as exc:
                    raise DataError(f"tokenizer {tokenizer['name']!r} on dataset {dataset['name']!r}: {exc}"
                                    ) from None
                definition = tok.definition()
                if definition is not None:
                    trained = (tkey, definition)
                notes.append(f"tokenizer trained in {time.perf_counter() - t:.1f} s")
        tfp = tok.fingerprint()
        key = sha256_text(corpus.fingerprint, tfp)[:20]
        tok_meta = {"tokenizer": tokenizer["name"], "tokenizer_params": tokenizer["params"],
                    "tokenizer_fingerprint": tfp, "tokenizer_description": tok.describe(),
                    "corpus_fingerprint": corpus.fingerprint}
        vocab = int(tok.vocab_size)
    if root is not None:
        meta = _entry_ok(root / key)
        if meta is not None:
            return Prepared(key, meta, notes=notes + [f"tokens reused (built in {meta['build_s']:.1f} s)"])
    span_ids, span_meta = None, None
    if tok is None:
        assert isinstance(corpus, TokenData)
        train, val = np.asarray(corpus.train, np.int64), np.asarray(corpus.val, np.int64)
        val_bytes = None if corpus.val_bytes is None else np.asarray(corpus.val_bytes, np.int64)
        description = corpus.description
    else:
        assert isinstance(corpus, TextCorpus)
        try:
            sep = tok.encode([DOCUMENT_SEPARATOR])[0]
            train, _ = _join(tok.encode(corpus.train_docs), sep)
            val, val_bytes = _join(tok.encode(corpus.val_docs), sep)
            span_ids, span_meta = encode_spans(tok, DOCUMENT_SEPARATOR.join(corpus.val_docs), sep[0])
        except DataError as exc:
            raise DataError(f"tokenizer {tokenizer['name']!r} on dataset {dataset['name']!r}: {exc}") from None
        description = corpus.description
    hi = int(max(train.max(initial=0), val.max(initial=0),
                 0 if span_ids is None else span_ids.max(initial=0)))
    if hi >= vocab:
        raise DataError(f"dataset {dataset['name']!r}: token id {hi} >= the vocabulary size {vocab}")
    dtype = token_dtype(vocab)
    train, val = train.astype(dtype), val.astype(dtype)
    arrays = {"train.bin": train, "val.bin": val}
    if val_bytes is not None:
        arrays["val_bytes.bin"] = val_bytes.astype("<u4")
    if span_ids is not None:
        arrays["val_spans.bin"] = span_ids.astype(dtype)
    build_s = time.perf_counter() - t0
    meta = {
        "format": FORMAT, "key": key, "dtype": dtype.str, "vocab_size": vocab,
        "n_train": int(len(train)), "n_val": int(len(val)), "max_token_id": hi,
        "has_val_bytes": val_bytes is not None,
        "val_text_bytes": None if val_bytes is None else int(val_bytes.sum()),
        **(span_meta or {"val_spans": None, "round_trip": None}),
        "data_fingerprint": fingerprint(train, val, vocab_size=vocab),
        "description": description, **tok_meta,
        "build_s": round(build_s, 3), "created": time.time(),
    }
    notes.append(f"tokens built in {build_s:.1f} s")
    return Prepared(key, meta, arrays, tok.definition() if tok is not None else None, trained, notes)


def tokendata(meta: dict[str, Any], arrays: dict[str, np.ndarray], folder: Path | None = None) -> TokenData:
    record = {k: meta[k] for k in ("tokenizer", "tokenizer_params", "tokenizer_fingerprint",
                                   "corpus_fingerprint")}
    record["token_store"] = meta["key"]
    if meta.get("round_trip"):
        record["lossy_tokenizer"] = meta["round_trip"]
    spans = None
    if meta.get("val_spans"):
        table = meta["val_spans"]
        spans = ByteSpans(arrays["val_spans.bin"], np.asarray(table["offsets"], np.int64), int(table["prefix"]),
                          np.asarray(table["starts"], np.int64), np.asarray(table["lengths"], np.int64))
    return TokenData(arrays["train.bin"], arrays["val.bin"], int(meta["vocab_size"]), meta["data_fingerprint"],
                     meta["description"], meta["tokenizer"], arrays.get("val_bytes.bin"), record, spans)


# The entries this process has mapped: folder -> (the stamp of its meta.json, its data). An entry's key is the
# hash of what it holds and it is written whole (commit's atomic replace), so while its meta.json is the same
# file the data is the same; a warm worker (abl.run.warm) maps an entry once for all its cells.
_opened: dict[Path, tuple[tuple[int, int, int], TokenData]] = {}
_OPENED_MAX = 4


def _stamp(folder: Path) -> tuple[int, int, int] | None:
    try:
        st = (folder / "meta.json").stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def open_tokens(folder: Path) -> TokenData:
    """Map a store entry read-only (nothing is copied; batches gather their windows from it); an entry this
    process mapped before, unchanged since, is the same object (its checks and conversions done once)."""
    folder = folder.resolve()
    stamp = _stamp(folder)
    held = _opened.get(folder)
    if held is not None and stamp is not None and held[0] == stamp:
        return held[1]
    data = _map_entry(folder)
    if stamp is not None:
        _opened.pop(folder, None)
        while len(_opened) >= _OPENED_MAX:
            _opened.pop(next(iter(_opened)))
        _opened[folder] = (stamp, data)
    return data


def _map_entry(folder: Path) -> TokenData:
    meta = _entry_ok(folder)
    if meta is None:
        raise DataError(f"token store entry {folder} is missing or incomplete; run abl run again to rebuild it")
    arrays: dict[str, np.ndarray] = {}
    n_spans = meta["val_spans"]["offsets"][-1] if meta.get("val_spans") else -1
    for name, dtype, n in (("train.bin", meta["dtype"], meta["n_train"]), ("val.bin", meta["dtype"], meta["n_val"]),
                           ("val_bytes.bin", "<u4", meta["n_val"] if meta["has_val_bytes"] else -1),
                           ("val_spans.bin", meta["dtype"], n_spans)):
        if n >= 0:
            arrays[name] = np.memmap(folder / name, dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype)
    return tokendata(meta, arrays, folder)


STALE_S, ABANDONED_S = 600, 86_400  # sweep: a build's folder untouched this long was left by a killed build


def _pid_alive(pid: int) -> bool:
    try:  # off POSIX os.kill would end the process: age alone decides there
        if os.name == "posix":
            os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # another user's process (or no PID at all: age decides)
        pass
    return True


def sweep(root: Path) -> list[str]:
    """Remove (and name) the ``.KEY.tmpPID`` folders builds killed mid-write left in the store: one untouched for
    STALE_S whose PID names no process here, or for ABANDONED_S whatever its PID (PIDs are reused; a build in
    another container has PIDs we cannot see). A live build writes until its rename, never quiet for minutes."""
    gone = []
    for tmp in root.glob(".*.tmp*"):
        pid = tmp.name.rpartition(".tmp")[2]
        try:
            quiet = time.time() - max(p.stat().st_mtime for p in (tmp, *tmp.iterdir()))
        except OSError:  # not a folder, or renamed into place meanwhile
            continue
        if pid.isdigit() and (quiet > ABANDONED_S or (quiet > STALE_S and not _pid_alive(int(pid)))):
            shutil.rmtree(tmp, ignore_errors=True)
            gone.append(tmp.name)
    return gone


def commit(prepared: Prepared, root: Path) -> Path:
    """Write a built entry (and a newly trained tokenizer) into the store; atomic per entry."""
    folder = root / prepared.key
    if prepared.trained is not None:
        tdir = root / TOKENIZERS_DIR
        tdir.mkdir(parents=True, exist_ok=True)
        target = files.confined(tdir, f"{prepared.trained[0]}.json", "the tokenizer's training key")
        files.write_text(target, prepared.trained[1])
    if prepared.arrays is None:
        return folder
    root.mkdir(parents=True, exist_ok=True)
    if gone := sweep(root):
        prepared.notes.append(f"removed {len(gone)} folder(s) left by killed builds ({', '.join(gone)})")
    tmpdir = root / f".{prepared.key}.tmp{os.getpid()}"
    shutil.rmtree(tmpdir, ignore_errors=True)
    try:  # a full disk (or any failed write) leaves no half-written folder behind
        tmpdir.mkdir()
        for name, arr in prepared.arrays.items():  # each write's size is checked: a short one is an OSError
            files.write_sized(tmpdir / name, arr.nbytes, arr.tofile)
        texts = {"meta.json": json.dumps(prepared.meta, indent=1, sort_keys=True, default=str)}
        if prepared.definition is not None:
            texts["tokenizer.json"] = prepared.definition
        for name, text in texts.items():
            files.write_sized(tmpdir / name, len(text.encode()), functools.partial(Path.write_text, data=text,
                                                                                   encoding="utf-8"))
    except BaseException:
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise
    if _entry_ok(folder) is None:
        shutil.rmtree(folder, ignore_errors=True)  # a torn entry (a killed writer)
        try:
            os.replace(tmpdir, folder)
        except OSError:  # another abl process wrote it meanwhile
            if _entry_ok(folder) is None:
                raise
    shutil.rmtree(tmpdir, ignore_errors=True)  # left only when another process's entry won: same content
    prepared.arrays = None
    return folder


# ---------------------------------------------------------------- the parent: check, then write


def check_cell(cell, meta: dict[str, Any]) -> list[str]:
    """A cell against its data: vocabulary and context. One message per problem."""
    where = f"cell [{cell.label}]"
    what = f"{meta['description']}, tokenizer {meta['tokenizer']}"
    errs = []
    mv = cell.model.vocab_size
    if mv and mv < meta["vocab_size"]:
        errs.append(f"{where}: model.vocab_size={mv} is smaller than the vocabulary of its data "
                    f"({meta['vocab_size']} ids; {what}); set model.vocab_size = 0 to follow the data")
    ctx = cell.model.context
    for split, n in (("training", meta["n_train"]), ("validation", meta["n_val"])):
        if n < ctx + 2:
            errs.append(f"{where}: model.context={ctx} is too long for the data: the {split} split has "
                        f"{n:,} tokens, a window needs context+2={ctx + 2} ({what})")
    return errs + lossy_errors(cell, meta)


def prepare_store(cells: list, registry, root: Path, log: Callable[[str], None] | None = None
                  ) -> dict[str, Path]:
    """Check every cell's data and make sure its tokens are in the store at ``root``.

    Every distinct (dataset, tokenizer) pair of the grid is loaded, tokenised
    (a trainable tokenizer trained first) or found in the store, and every
    cell is checked against it. Only when nothing is wrong is anything
    written. Returns the store entry of each run id. Raises DataError with one
    line per problem.
    """
    errors: list[str] = []
    prepared: dict[tuple[str, str], Prepared] = {}
    failed: set[tuple[str, str]] = set()
    pairs: dict[str, tuple[str, str]] = {}
    from .tasks import is_task_factory

    for cell in cells:
        ds, tk = cell.components["dataset"], cell.components["tokenizer"]
        factory = registry.get("dataset", ds["name"]).factory
        if is_task_factory(factory):  # a generated task: nothing to tokenise or store, only to check
            try:
                task = factory(**ds["params"])
                task.check(cell.model.context)
                if cell.model.vocab_size and cell.model.vocab_size < task.vocab_size:
                    errors.append(f"cell [{cell.label}]: model.vocab_size={cell.model.vocab_size} is smaller "
                                  f"than the task's vocabulary ({task.vocab_size}); set model.vocab_size = 0")
            except (DataError, ValueError, TypeError) as exc:
                errors.append(f"cell [{cell.label}]: dataset {ds['name']}: {exc}")
            continue
        pair = (spec_key(ds), spec_key(tk))
        pairs[cell.run_id] = pair
        if pair not in prepared and pair not in failed:
            try:
                prepared[pair] = prepare_tokens(ds, tk, registry, root, default_tokenizer(cell))
            except DataError as exc:
                failed.add(pair)
                errors.append(str(exc))
                continue
        if pair in prepared:
            errors += check_cell(cell, prepared[pair].meta)
    if errors:
        raise DataError("\n".join(dict.fromkeys(errors)))
    out: dict[str, Path] = {}
    for p in prepared.values():
        folder = commit(p, root)
        if log is not None:
            m, mib = p.meta, sum(f.stat().st_size for f in folder.iterdir() if f.is_file()) / 2**20
            log(f"token store {root.name}/{p.key}: {m['description']}, tokenizer {m['tokenizer']} "
                f"(vocabulary {m['vocab_size']:,}): {m['n_train']:,} training + {m['n_val']:,} validation "
                f"tokens, {np.dtype(m['dtype']).name}, {mib:.1f} MiB; {'; '.join(p.notes)}")
    for run_id, pair in pairs.items():  # task cells have no entry: they generate their data
        out[run_id] = root / prepared[pair].key
    return out


def link_run(run_dir: Path, entry: Path) -> None:
    """Tell a run folder's worker which store entry to map (a path relative to the folder when it can)."""
    try:
        target = os.path.relpath(entry.resolve(), run_dir.resolve())
    except ValueError:  # another drive
        target = str(entry.resolve())
    files.write_json(run_dir / RUN_LINK, {"token_store": target}, indent=None)


# ---------------------------------------------------------------- the worker

_bound: Path | None = None


def bind(run_dir: Path) -> None:
    """The worker: map the store entry the parent named in ``run_dir/tokens.json`` (if any)."""
    global _bound
    try:
        target = json.loads((run_dir / RUN_LINK).read_text())["token_store"]
    except (OSError, ValueError, KeyError, TypeError):
        _bound = None
        return
    _bound = (run_dir / target).resolve()


def cell_tokens(cell, registry) -> TokenData:
    """The cell's tokens: mapped from the bound store entry, else (no parent, e.g. a test) built in memory."""
    if _bound is not None:
        return open_tokens(_bound)
    p = prepare_tokens(cell.components["dataset"], cell.components["tokenizer"], registry, None,
                       default_tokenizer(cell))
    assert p.arrays is not None
    return tokendata(p.meta, p.arrays)
