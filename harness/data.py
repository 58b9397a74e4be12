"""Token data: byte-level tokenisation, deterministic splits, fingerprints, batches.

Dataset plugins (plugins/datasets.py and third-party ones) build a
``TokenData`` with the helpers here; the trainer only sees ``TokenData``.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BYTE_VOCAB = 256


class DataError(Exception):
    """A dataset cannot be loaded (missing file, wrong format...)."""


@dataclass
class TokenData:
    train: np.ndarray  # 1-D integer tokens
    val: np.ndarray
    vocab_size: int
    fingerprint: str  # sha256 of the token streams and vocab size
    description: str
    tokenizer: str  # "bytes" or "pretokenized"

    def check(self, context: int) -> None:
        for split, arr in (("train", self.train), ("val", self.val)):
            if len(arr) < context + 2:
                raise DataError(
                    f"{split} split has {len(arr)} tokens, fewer than context+2={context + 2}"
                )
        hi = int(max(self.train.max(initial=0), self.val.max(initial=0)))
        if hi >= self.vocab_size:
            raise DataError(f"token id {hi} >= vocab_size {self.vocab_size}")


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


def from_documents(docs: list[tuple[str, bytes]], val_fraction: float, description: str) -> TokenData:
    """Byte-tokenise named documents, splitting whole documents into train/val.

    Documents are separated by a NUL byte so no window silently joins two files.
    """
    train_parts: list[bytes] = []
    val_parts: list[bytes] = []
    for name, data in docs:
        (val_parts if in_val_split(name, val_fraction) else train_parts).append(data)
    if not val_parts and docs:  # tiny corpora: keep the split non-empty
        val_parts.append(train_parts.pop())
    train = byte_tokens(b"\0".join(train_parts))
    val = byte_tokens(b"\0".join(val_parts))
    return TokenData(train, val, BYTE_VOCAB, fingerprint(train, val, vocab_size=BYTE_VOCAB),
                     description, "bytes")


def split_stream(tokens: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous split: the last ``val_fraction`` of the stream is validation."""
    n_val = max(1, int(len(tokens) * val_fraction))
    return tokens[:-n_val], tokens[-n_val:]


def from_text_file(path: str | Path, val_fraction: float) -> TokenData:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"text file {str(path)!r} does not exist")
    tokens = byte_tokens(p.read_bytes())
    train, val = split_stream(tokens, val_fraction)
    return TokenData(train, val, BYTE_VOCAB, fingerprint(train, val, vocab_size=BYTE_VOCAB),
                     f"text file {p.name} ({len(tokens)} bytes)", "bytes")


def from_token_bin(path: str | Path, vocab_size: int, val_path: str = "", val_fraction: float = 0.1) -> TokenData:
    """nanoGPT format: a flat little-endian uint16 array of token ids, no header."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"token file {str(path)!r} does not exist")
    if p.stat().st_size % 2:
        raise DataError(f"token file {p.name} has an odd size; expected uint16 tokens")
    tokens = np.memmap(p, dtype=np.uint16, mode="r")
    if val_path:
        vp = Path(val_path)
        if not vp.is_file():
            raise DataError(f"token file {val_path!r} does not exist")
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
    Validation windows are evenly spaced and identical for every cell.
    """

    def __init__(self, data: TokenData, context: int, batch_size: int, seed: int, stream: int = 0):
        import torch

        self.torch = torch
        self.context = context
        self.batch_size = batch_size
        self.train = torch.from_numpy(np.asarray(data.train, dtype=np.int64))
        self.val = torch.from_numpy(np.asarray(data.val, dtype=np.int64))
        # ``stream`` separates the ranks of a multi-process cell
        self.gen = torch.Generator().manual_seed(10_007 * seed + 1 + 7_919 * stream)

    def _windows(self, tokens, starts):
        idx = starts[:, None] + self.torch.arange(self.context + 1)[None, :]
        w = tokens[idx]
        return w[:, :-1], w[:, 1:]

    def next_train(self):
        hi = len(self.train) - self.context - 1
        starts = self.torch.randint(0, hi + 1, (self.batch_size,), generator=self.gen)
        return self._windows(self.train, starts)

    def val_batches(self, n_batches: int):
        hi = len(self.val) - self.context - 1
        total = n_batches * self.batch_size
        starts = self.torch.linspace(0, hi, total).long()
        for i in range(n_batches):
            yield self._windows(self.val, starts[i * self.batch_size:(i + 1) * self.batch_size])
