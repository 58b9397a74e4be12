"""Datasets (axis ``dataset``). Every factory is ``factory(**params)`` -> TextCorpus or TokenData.

The text datasets (``pystdlib``, ``text_file``, ``hf``) return a
``TextCorpus``, which the cell's tokenizer (``data.tokenizer``) turns into
tokens once per store; ``token_bin`` holds token ids already.

``pystdlib`` is the embedded default: real text that needs no download, the
Python source of the standard library of the interpreter running abl. Its
fingerprint (stored with every run) changes with the Python version.

``hf`` reads a local Hugging Face dataset through ``datasets``: a folder
written by ``save_to_disk``, or parquet / jsonl / json / arrow / csv files.
Nothing is downloaded (``HF_DATASETS_OFFLINE``), and ``datasets`` is imported
only when an ``hf`` dataset is loaded.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Annotated, Any

from abl import Arg, DataError, TextCorpus, from_documents, from_text_file, from_token_bin, hookimpl

_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def _stdlib_sources(root: Path) -> list[Path]:
    """The ``*.py`` files under ``root`` outside ``_SKIP_DIRS``, in path order (as sorted Paths compare:
    part by part), as ``root.rglob`` finds them: symlinked folders are not followed. The skipped
    folders are never walked: site-packages alone can hold most of the files under the standard
    library's folder."""
    found: list[tuple[tuple[str, ...], Path]] = []
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        rel = here.relative_to(root).parts
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS]
        found += [((*rel, f), here / f) for f in files if f.endswith(".py")]
    return [p for _, p in sorted(found)]


VAL_FRACTION = Arg("share of the data held out for validation", min=0.001, max=0.9)


def python_stdlib(max_bytes: Annotated[int, Arg("stop adding files past this many bytes", min=10_000)] = 8_000_000,
                  val_fraction: Annotated[float, VAL_FRACTION] = 0.1):
    """Python standard-library source; whole files split train/val by name hash."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs, total = [], 0
    for path in _stdlib_sources(root):
        rel = path.relative_to(root)
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if total + len(data) > max_bytes:
            continue
        docs.append((rel.as_posix(), data))
        total += len(data)
    if not docs:
        raise DataError(f"no Python source found under the standard library ({sys.version.split()[0]})")
    v = sys.version_info
    return from_documents(docs, val_fraction,
                          f"Python {v.major}.{v.minor}.{v.micro} stdlib source, "
                          f"{len(docs)} files, {total} bytes")


def text_file(path: Annotated[str, Arg("path of a UTF-8 (or any byte) text file")] = "",
              val_fraction: Annotated[float, VAL_FRACTION] = 0.1):
    """Any local text file as one document; the last val_fraction of it is validation."""
    if not path:
        raise DataError("dataset text_file needs a path: [dataset.text_file] path = \"corpus.txt\"")
    return from_text_file(path, val_fraction)


# file suffix -> the ``datasets`` builder that reads it
HF_FILE_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow", ".csv": "csv"}


def _import_datasets() -> Any:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # a local dataset: never reach for the Hub
    try:
        import datasets
    except ImportError:
        raise DataError("dataset hf needs the datasets package: pip install 'abl[hf]'") from None
    datasets.disable_progress_bars()
    # its readers log a file they cannot read ("Failed to read file ...") at ERROR before raising: abl's
    # DataError names the file and the reason, so the raw line would come first and say it twice
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    return datasets


def _hf_load(path: str) -> Any:
    """A Dataset or DatasetDict from a save_to_disk folder, or from data files through their builder."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"hf dataset path {path!r} does not exist")
    datasets = _import_datasets()
    if p.is_dir() and ((p / "dataset_dict.json").is_file() or (p / "state.json").is_file()):
        try:
            return datasets.load_from_disk(str(p))
        except (IndexError, StopIteration) as exc:  # a saved dataset of no rows has no shard to open
            raise DataError(_empty(path, f"the saved dataset has no rows ({type(exc).__name__})")) from None
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    kinds = {HF_FILE_BUILDERS[f.suffix.lower()] for f in files if f.suffix.lower() in HF_FILE_BUILDERS}
    if not kinds:
        raise DataError(f"hf dataset path {path!r} holds no dataset: expected a folder written by "
                        f"save_to_disk, or {', '.join(HF_FILE_BUILDERS)} files")
    if len(kinds) > 1:
        raise DataError(f"hf dataset path {path!r} mixes file kinds ({', '.join(sorted(kinds))}); "
                        "point path at one kind")
    builder = kinds.pop()
    data_files = [str(f) for f in files if HF_FILE_BUILDERS.get(f.suffix.lower()) == builder]
    if all(os.path.getsize(f) == 0 for f in data_files):
        raise DataError(_empty(path, f"its {builder} file(s) hold no bytes"))
    if builder == "parquet":
        _check_parquet_footers(path, data_files)
    cache = tempfile.mkdtemp(prefix="abl-hf-")  # the builder's arrow cache: kept out of ~/.cache, removed
    try:
        return datasets.load_dataset(builder, data_files=data_files, cache_dir=cache, keep_in_memory=True)
    except (IndexError, StopIteration, ValueError, datasets.exceptions.DatasetGenerationError) as exc:
        cause = exc.__cause__ or exc
        # pyarrow could not parse a file: damaged, or not the format its suffix says (a parquet file's
        # damage is found from its footer above: its reader says ArrowInvalid for zero rows too)
        damage = _unreadable(exc) if builder != "parquet" else None
        if damage is not None:
            raise DataError(f"hf dataset path {path!r}: a {builder} file is not readable (damaged, cut short, or "
                            f"not {builder}): {type(damage).__name__}: {_first_line(damage)}") from None
        # the builder found no row to read: "corresponds to no data", a zero-row batch, no schema
        raise DataError(_empty(path, f"the {builder} reader found no rows: {type(cause).__name__}: "
                                     f"{str(cause).splitlines()[0][:160] if str(cause) else ''}")) from None
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _check_parquet_footers(path: str, data_files: list[str]) -> None:
    """A DataError naming the first parquet file whose footer (its schema and row counts) cannot be read."""
    import pyarrow.parquet as pq

    for f in data_files:
        if os.path.getsize(f) == 0:
            continue  # no bytes: the empty case, said as such
        try:
            pq.read_metadata(f)
        except Exception as exc:  # noqa: BLE001 - pyarrow's errors (ArrowInvalid, OSError) name the damage
            raise DataError(f"hf dataset path {path!r}: parquet file {Path(f).name!r} is not readable (damaged, "
                            f"cut short, or not parquet): {type(exc).__name__}: {_first_line(exc)}") from None


def _unreadable(exc: BaseException) -> BaseException | None:
    """The pyarrow error in ``exc``'s chain (ArrowInvalid, ArrowIOError, ...: a file pyarrow cannot parse),
    else None."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if type(e).__module__.startswith("pyarrow"):
            return e
        e = e.__cause__ or e.__context__
    return None


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else ""


def _empty(path: str, why: str) -> str:
    return f"hf dataset path {path!r} is empty or holds no readable rows ({why})"


def _hf_split(data: Any, split: str, path: str) -> Any:
    if hasattr(data, "column_names") and not isinstance(data.column_names, dict):
        return data  # a single Dataset: the split name does not apply
    if split not in data:
        raise DataError(f"hf dataset {path!r} has no split {split!r} (splits: {', '.join(data) or 'none'})")
    return data[split]


def _hf_texts(ds: Any, column: str, path: str, split: str, max_rows: int) -> list[bytes]:
    if column not in ds.column_names:
        raise DataError(f"hf dataset {path!r} (split {split!r}) has no column {column!r} "
                        f"(columns: {', '.join(ds.column_names) or 'none'}); set [dataset.hf] column")
    if max_rows:
        ds = ds.select(range(min(max_rows, len(ds))))
    values = ds[column]
    docs = []
    for i, v in enumerate(values):
        if v is None:
            continue
        if not isinstance(v, str):
            raise DataError(f"hf dataset {path!r} column {column!r} holds {type(v).__name__} values "
                            f"(row {i}), not text")
        if v:
            docs.append(v.encode("utf-8"))
    if not docs:
        raise DataError(f"hf dataset {path!r} (split {split!r}) is empty: no text in column {column!r} "
                        f"({len(values)} rows)")
    return docs


def hf_dataset(path: Annotated[str, Arg("a save_to_disk folder, or a parquet / jsonl / json / arrow / csv file "
                                        "or folder of them")] = "",
               column: Annotated[str, Arg("the column holding the text")] = "text",
               split: Annotated[str, Arg("the split to train on (a DatasetDict or data files)")] = "train",
               val_split: Annotated[str, Arg("the split to validate on; empty = hold out val_fraction of the "
                                             "rows")] = "",
               val_fraction: Annotated[float, VAL_FRACTION] = 0.1,
               max_rows: Annotated[int, Arg("use only the first N rows of each split (0 = all)", min=0)] = 0,
               ) -> TextCorpus:
    """A local Hugging Face dataset's text column: save_to_disk folder, or parquet/jsonl/json/arrow/csv files.

    Validation is ``val_split`` when given, else a ``val_fraction`` of the rows
    chosen by a hash of the row number (whole documents, as ``pystdlib``).
    """
    if not path:
        raise DataError('dataset hf needs a path: [dataset.hf] path = "my_dataset"')
    data = _hf_load(path)
    if val_split and hasattr(data, "column_names") and not isinstance(data.column_names, dict):
        raise DataError(f"hf dataset {path!r} is a single split; val_split = {val_split!r} does not apply "
                        "(leave it empty to hold out val_fraction of the rows)")
    train_docs = _hf_texts(_hf_split(data, split, path), column, path, split, max_rows)
    name = Path(path).name
    if val_split:
        val_docs = _hf_texts(_hf_split(data, val_split, path), column, path, val_split, max_rows)
        return TextCorpus(train_docs, val_docs,
                          f"hf dataset {name} ({split}: {len(train_docs)} rows, {val_split}: {len(val_docs)} rows)")
    corpus = from_documents([(str(i), d) for i, d in enumerate(train_docs)], val_fraction, "")
    corpus.description = (f"hf dataset {name} ({split}, column {column}: {len(train_docs)} rows, "
                          f"{sum(map(len, train_docs))} bytes)")
    return corpus


def token_bin(path: Annotated[str, Arg("flat uint16 token file (train, or all if val_path is empty)")] = "",
              val_path: Annotated[str, Arg("optional separate validation token file")] = "",
              vocab_size: Annotated[int, Arg("0 = max token id + 1", min=0)] = 0,
              val_fraction: Annotated[float, VAL_FRACTION] = 0.1):
    """Pre-tokenised uint16 .bin (nanoGPT format); val from val_path or the tail of path."""
    if not path:
        raise DataError("dataset token_bin needs a path: [dataset.token_bin] path = \"train.bin\"")
    return from_token_bin(path, vocab_size, val_path, val_fraction)


@hookimpl
def register_components(register):
    # each factory's signature declares its parameters (type, default, doc, bounds)
    register("dataset", "pystdlib", python_stdlib)
    register("dataset", "text_file", text_file)
    register("dataset", "hf", hf_dataset)
    register("dataset", "token_bin", token_bin)
