"""Corpora, token data, deterministic splits, fingerprints, batches.

A dataset plugin (plugins/datasets.py and third-party ones) returns either

- a ``TextCorpus``: text documents split into train and validation, which the
  cell's tokenizer (axis ``tokenizer``, abl.data.tokenstore) turns into tokens once
  per store; ``from_documents`` and ``from_text_file`` build one; or
- a ``TokenData``: token ids that are already tokenised (``from_token_bin``).

The trainer only sees ``TokenData``, mapped from the token store
(abl.data.tokenstore).
"""

from __future__ import annotations

import hashlib
import math
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

BYTE_VOCAB = 256
# joins the documents of a split: no training window silently runs from one document into the next
DOCUMENT_SEPARATOR = b"\0"
LN2 = math.log(2.0)

if TYPE_CHECKING:
    from .spans import ByteSpans


class DataError(Exception):
    """A dataset cannot be loaded (missing file, wrong format...)."""


@dataclass
class TokenData:
    train: np.ndarray  # 1-D integer tokens
    val: np.ndarray
    vocab_size: int
    fingerprint: str  # sha256 of the token streams and vocab size
    description: str
    tokenizer: str  # the tokenizer's name, or "pretokenized"
    # bytes of the validation text each validation token covers (for bits per byte); None: unknown
    val_bytes: np.ndarray | None = None
    # facts recorded with the run: tokenizer fingerprint, corpus fingerprint, token store key ...
    meta: dict[str, Any] = field(default_factory=dict)
    # fixed byte spans of the validation text, each tokenised whole (val_bpb scores them); None: no text
    val_spans: ByteSpans | None = None

    def check(self, context: int) -> None:
        for split, arr in (("train", self.train), ("val", self.val)):
            if len(arr) < context + 2:
                raise DataError(
                    f"{split} split has {len(arr)} tokens, fewer than context+2={context + 2}"
                )
        hi = self.max_id
        if hi >= self.vocab_size:
            raise DataError(f"token id {hi} >= vocab_size {self.vocab_size}")

    # Computed once per object: a scan of every token, which a warm worker (abl.run.warm) that keeps the
    # mapped entry for its next cells (abl.data.tokenstore.open_tokens) does not repeat per cell.
    @cached_property
    def max_id(self) -> int:
        """The largest token id in either split."""
        return int(max(self.train.max(initial=0), self.val.max(initial=0)))

    @cached_property
    def val_int64(self) -> np.ndarray:
        """The validation tokens as int64 (what batches index), converted once per object."""
        return np.asarray(self.val, dtype=np.int64)


@dataclass
class TextCorpus:
    """Text documents split into train and validation (what a dataset plugin returns for text).

    The cell's tokenizer turns it into tokens: each document on its own, the
    documents of a split joined by the tokenizer's encoding of
    ``DOCUMENT_SEPARATOR`` (one NUL byte), so the text a model sees is the
    same byte string under every tokenizer.

    ``train``, ``val``, ``vocab_size`` and ``tokenizer`` give the byte-level
    view (one token per byte, vocabulary 256), as ``from_documents``
    returned before tokenizers were an axis.
    """

    train_docs: list[bytes]
    val_docs: list[bytes]
    description: str

    @cached_property
    def fingerprint(self) -> str:
        """sha256 of the documents of each split, in order (the corpus' identity)."""
        h = hashlib.sha256(b"abl-text-corpus-v1;")
        for split, docs in (("train", self.train_docs), ("val", self.val_docs)):
            h.update(f"{split}={len(docs)};".encode())
            for d in docs:
                h.update(f"{len(d)};".encode())
                h.update(d)
        return h.hexdigest()

    def n_bytes(self, split: str) -> int:
        docs = self.train_docs if split == "train" else self.val_docs
        return sum(len(d) for d in docs) + max(0, len(docs) - 1) * len(DOCUMENT_SEPARATOR)

    @cached_property
    def train(self) -> np.ndarray:
        return byte_tokens(DOCUMENT_SEPARATOR.join(self.train_docs))

    @cached_property
    def val(self) -> np.ndarray:
        return byte_tokens(DOCUMENT_SEPARATOR.join(self.val_docs))

    @cached_property
    def val_bytes(self) -> np.ndarray:
        return np.ones(len(self.val), dtype=np.uint8)

    vocab_size = BYTE_VOCAB
    tokenizer = "bytes"

    def check(self, context: int) -> None:
        for split in ("train", "val"):
            if self.n_bytes(split) < context + 2:
                raise DataError(f"{split} split has {self.n_bytes(split)} bytes, fewer than "
                                f"context+2={context + 2}")


def fingerprint(*arrays: np.ndarray, vocab_size: int) -> str:
    h = hashlib.sha256()
    h.update(f"vocab={vocab_size};".encode())
    for a in arrays:
        h.update(f"len={len(a)};dtype={a.dtype};".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def byte_tokens(data: bytes) -> np.ndarray:
    """Byte-level tokenisation: every byte is a token id in [0, 256)."""
    return np.frombuffer(data, dtype=np.uint8).astype(np.uint16)


def in_val_split(name: str, val_fraction: float) -> bool:
    """Deterministic, order-independent split: a document goes to val by a hash of its name."""
    return (zlib.crc32(name.encode()) % 10_000) < val_fraction * 10_000


def from_documents(docs: list[tuple[str, bytes]], val_fraction: float, description: str) -> TextCorpus:
    """Named documents split whole into train/val by a hash of the name (``in_val_split``).

    In a split, documents are joined by ``DOCUMENT_SEPARATOR`` (one NUL byte),
    so no window silently joins two files.
    """
    train_parts: list[bytes] = []
    val_parts: list[bytes] = []
    for name, data in docs:
        (val_parts if in_val_split(name, val_fraction) else train_parts).append(data)
    if not any(val_parts) and any(train_parts):  # tiny corpora: keep the split's text non-empty
        val_parts.append(train_parts.pop(max(i for i, d in enumerate(train_parts) if d)))
    return TextCorpus(train_parts, val_parts, description)


def split_stream(tokens: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous split: the last ``val_fraction`` of the stream is validation."""
    n_val = max(1, int(len(tokens) * val_fraction))
    return tokens[:-n_val], tokens[-n_val:]


def check_file(path: str | Path, what: str) -> Path:
    """``path`` as a readable, non-empty regular file, or a DataError saying what is wrong."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{what} {str(path)!r} does not exist")
    if p.is_dir():
        raise DataError(f"{what} {str(path)!r} is a directory, not a file")
    if not p.is_file():
        raise DataError(f"{what} {str(path)!r} is not a regular file")
    try:
        size = p.stat().st_size
        with open(p, "rb"):
            pass
    except OSError as exc:
        raise DataError(f"{what} {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    if size == 0:
        raise DataError(f"{what} {str(path)!r} is empty")
    return p


def text_split_point(data: bytes, val_fraction: float) -> int:
    """Where the last ``val_fraction`` of ``data`` starts, moved back to the start of a UTF-8 character."""
    cut = len(data) - max(1, int(len(data) * val_fraction))
    while 0 < cut < len(data) and (data[cut] & 0xC0) == 0x80:  # a continuation byte
        cut -= 1
    return cut


def from_text_file(path: str | Path, val_fraction: float) -> TextCorpus:
    """One text file as one document: the last ``val_fraction`` of its bytes is validation."""
    p = check_file(path, "text file")
    data = p.read_bytes()
    cut = text_split_point(data, val_fraction)
    return TextCorpus([data[:cut]], [data[cut:]], f"text file {p.name} ({len(data)} bytes{utf8_note(data)})")


def utf8_note(data: bytes) -> str:
    """'' for UTF-8 text, else where it stops being UTF-8. Such a file is still trained on, as the bytes it
    holds (every tokenizer here reads bytes; docs/robustness.md), and its description says so."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (f"; not UTF-8 from byte {exc.start:,} on ({data[exc.start:exc.start + 1]!r}): "
                "trained on as raw bytes")
    return ""


def from_token_bin(path: str | Path, vocab_size: int, val_path: str = "", val_fraction: float = 0.1) -> TokenData:
    """nanoGPT format: a flat little-endian uint16 array of token ids, no header."""
    p = check_file(path, "token file")
    if p.stat().st_size % 2:
        raise DataError(f"token file {str(path)!r} has an odd size ({p.stat().st_size} bytes); "
                        "expected uint16 tokens (2 bytes each)")
    tokens = np.memmap(p, dtype=np.uint16, mode="r")
    if val_path:
        vp = check_file(val_path, "token file")
        if vp.stat().st_size % 2:
            raise DataError(f"token file {val_path!r} has an odd size ({vp.stat().st_size} bytes); "
                            "expected uint16 tokens (2 bytes each)")
        train, val = np.asarray(tokens), np.asarray(np.memmap(vp, dtype=np.uint16, mode="r"))
    else:
        train, val = split_stream(tokens, val_fraction)
    if vocab_size <= 0:
        vocab_size = int(max(train.max(initial=0), val.max(initial=0))) + 1
    return TokenData(np.asarray(train), np.asarray(val), vocab_size,
                     fingerprint(train, val, vocab_size=vocab_size),
                     f"token file {p.name} ({len(tokens)} tokens)", "pretokenized")


class Batches:
    """Random training windows (seeded) and fixed validation windows.

    The training order depends only on the seed, so two cells with the same
    seed see the same data in the same order (comparisons can pair by seed).
    Validation windows are evenly spaced and identical for every cell: an
    evaluation batch is ``val_batch_size`` windows (the global
    ``train.batch_size``), whatever the number of processes, while
    ``batch_size`` is this process's share of a training step. The training
    tokens stay where they are (a memory-mapped token store, see
    abl.data.tokenstore): each batch gathers only its windows.
    """

    def __init__(self, data: TokenData, context: int, batch_size: int, seed: int, stream: int = 0,
                 val_batch_size: int | None = None):
        import torch

        self.torch = torch
        self.context = context
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.train_tokens = data.train
        # a TokenData converts its validation tokens once (a warm worker's later cells reuse them)
        self.val = torch.from_numpy(data.val_int64 if isinstance(data, TokenData)
                                    else np.asarray(data.val, dtype=np.int64))
        self.val_bytes = data.val_bytes
        # ``stream`` separates the ranks of a multi-process cell
        self.gen = torch.Generator().manual_seed(10_007 * seed + 1 + 7_919 * stream)

    def _windows(self, tokens, starts):
        idx = starts[:, None] + self.torch.arange(self.context + 1)[None, :]
        if isinstance(tokens, np.ndarray):
            w = self.torch.from_numpy(np.asarray(tokens[idx.numpy()], dtype=np.int64))
        else:
            w = tokens[idx]
        return w[:, :-1], w[:, 1:]

    def next_train(self):
        hi = len(self.train_tokens) - self.context - 1
        starts = self.torch.randint(0, hi + 1, (self.batch_size,), generator=self.gen)
        return self._windows(self.train_tokens, starts)

    def _val_starts(self, n_batches: int):
        hi = len(self.val) - self.context - 1
        return self.torch.linspace(0, hi, n_batches * self.val_batch_size).long()

    def val_batches(self, n_batches: int):
        """The windows of ``n_batches`` evaluation batches, in order, in pieces of ``batch_size`` windows
        (one piece per batch in a single process; ``val_batch_size / batch_size`` pieces per batch in each
        process of a multi-process cell)."""
        starts = self._val_starts(n_batches)
        for i in range(0, len(starts), self.batch_size):
            yield self._windows(self.val, starts[i:i + self.batch_size])

    def val_targets(self, n_batches: int):
        """The target token ids [windows, context] that ``val_batches(n_batches)`` scores."""
        return self._windows(self.val, self._val_starts(n_batches))[1]

    def val_target_counts(self, n_batches: int) -> tuple[int, int] | None:
        """(tokens, bytes of validation text they cover) over the targets of ``val_batches(n_batches)``.

        None when the data does not say which bytes its tokens cover (pre-tokenised data).
        """
        spans = self.val_byte_spans(n_batches)
        if spans is None:
            return None
        return len(spans) * self.context, int((spans[:, 1] - spans[:, 0]).sum())

    def val_byte_spans(self, n_batches: int) -> np.ndarray | None:
        """[windows, 2]: the [first, end) byte offsets in the validation text that each window's targets cover
        (None for pre-tokenised data)."""
        if self.val_bytes is None:
            return None
        cum = np.concatenate([[0], np.cumsum(np.asarray(self.val_bytes, dtype=np.int64))])
        starts = self._val_starts(n_batches).numpy()
        # the targets of a window starting at s are tokens s+1 .. s+context
        return np.stack([cum[starts + 1], cum[starts + self.context + 1]], axis=1)


def targets_fingerprint(targets, of: str = "") -> str:
    """sha256 of scored target ids or byte offsets (an integer array or tensor, any shape) and ``of`` (what
    they index, e.g. a corpus fingerprint): the identity of what a figure was scored on. Two runs with the
    same fingerprint were scored on the same targets in the same order."""
    a = np.ascontiguousarray(np.asarray(targets, dtype=np.int64))
    h = hashlib.sha256(f"abl-targets-v1;of={of};shape={list(a.shape)};".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def bits_per_byte(nats_per_token: float, counts: tuple[int, int] | None) -> float | None:
    """Bits per byte of a mean cross-entropy (nats per token) over tokens that cover known bytes.

    bpb = total nats / (ln 2 x bytes) = (nats per token / ln 2) x (tokens / bytes); the
    factor is exactly 1 for a byte-level tokenizer, so there bpb == val_loss / ln 2.
    """
    if counts is None or counts[1] <= 0:
        return None
    tokens, n_bytes = counts
    return nats_per_token / LN2 * (tokens / n_bytes)
