"""Fixed byte spans of the validation text: what ``val_bpb`` scores under every tokenizer.

Bits per byte compare tokenizers only when every cell scores the same bytes. Scoring the windows
of each tokenizer's own token stream does not: the same number of windows covers a different
amount of text, in different places, under each tokenizer. So the spans are chosen from the
validation text alone (its length), never from a tokenizer's tokens, and each span is tokenised
on its own (after the document separator, as a document starts): every tokenizer then scores
exactly these bytes (abl.train.spanscore scores them).

The same pass checks that the tokenizer gives each span back (decode(encode(text)) == text); one
that does not is refused (``lossy_errors``) unless the grid sets ``data.accept_lossy_tokenizer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

SPAN_BYTES = 1024
MAX_SPANS = 256


def choose_byte_spans(text: bytes, span_bytes: int = SPAN_BYTES, max_spans: int = MAX_SPANS
                      ) -> list[tuple[int, int]]:
    """(start, length) of up to ``max_spans`` spans of about ``span_bytes`` bytes, evenly spaced over
    ``text`` and not overlapping, each on UTF-8 character boundaries (a subword tokenizer needs text)."""
    n = len(text)
    if n <= span_bytes:
        return [(0, n)] if n else []
    count = min(max_spans, n // span_bytes)
    starts = np.linspace(0, n - span_bytes, count).round().astype(np.int64)

    def boundary(i: int) -> int:  # forward to the start of a character
        while 0 < i < n and (text[i] & 0xC0) == 0x80:
            i += 1
        return i

    out: list[tuple[int, int]] = []
    for s in starts:
        a, b = boundary(int(s)), boundary(int(s) + span_bytes)
        if b > a:
            out.append((a, b - a))
    return out


def spread(n_items: int, n_wanted: int) -> np.ndarray:
    """``n_wanted`` indices of ``range(n_items)`` spread evenly (all of them when fewer exist)."""
    if n_wanted >= n_items:
        return np.arange(n_items)
    return np.unique(np.linspace(0, n_items - 1, max(1, n_wanted)).round().astype(np.int64))


@dataclass
class ByteSpans:
    """Fixed byte spans of the validation text and their tokens under one tokenizer.

    Span i covers bytes ``starts[i] .. starts[i] + lengths[i]`` of the validation text (its documents
    joined by ``DOCUMENT_SEPARATOR``); its tokens are ``tokens[offsets[i]:offsets[i + 1]]``: first
    the ``prefix`` tokens of ``DOCUMENT_SEPARATOR`` (context only, as at a document's start), then
    the span's own. The byte table is the same under every tokenizer; the tokens are not.
    """

    tokens: np.ndarray
    offsets: np.ndarray  # n + 1 token offsets
    prefix: int
    starts: np.ndarray
    lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.starts)

    def span(self, i: int) -> np.ndarray:
        return np.asarray(self.tokens[int(self.offsets[i]):int(self.offsets[i + 1])], dtype=np.int64)

    def table(self, indices) -> list[tuple[int, int]]:
        """(start, length) in bytes of the chosen spans: what a val_bpb over them scored."""
        return [(int(self.starts[i]), int(self.lengths[i])) for i in indices]

    def chosen(self, n_bytes: int) -> np.ndarray:
        """The spans an evaluation of about ``n_bytes`` bytes scores: evenly spread, chosen from the
        byte table alone (identical for every tokenizer of the same text)."""
        per = max(1, int(np.mean(self.lengths))) if len(self) else 1
        return spread(len(self), -(-n_bytes // per))


def encode_spans(tok: Tokenizer, val_text: bytes, prefix: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """The validation text's fixed byte spans (``choose_byte_spans``), each tokenised whole after the
    separator's tokens, and whether the tokenizer gives each span back (``round_trip``: None, or the
    first span it changes). Returns (the tokens of every span, in order; the meta.json entries)."""
    table = choose_byte_spans(val_text)
    texts = [val_text[a:a + n] for a, n in table]
    encoded = tok.encode(texts)
    prefix = np.asarray(prefix, np.int64)  # the separator's tokens, before every span
    parts: list[np.ndarray] = []
    offsets = [0]
    round_trip: dict[str, Any] | None = None
    for (start, length), text, (ids, _) in zip(table, texts, encoded):
        ids = np.asarray(ids, np.int64)
        parts += [prefix, ids]
        offsets.append(offsets[-1] + len(prefix) + len(ids))
        if round_trip is None:
            back = tok.decode(ids)
            if back != text:
                round_trip = lossy_sample(start, text, back)
    tokens = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return tokens, {"val_spans": {"starts": [a for a, _ in table], "lengths": [n for _, n in table],
                                  "offsets": offsets, "prefix": int(len(prefix))},
                    "round_trip": round_trip}


def lossy_sample(start: int, text: bytes, back: bytes) -> dict[str, Any]:
    """Where decode(encode(text)) first differs from ``text``, with a few bytes of each around it."""
    i = next((k for k, (a, b) in enumerate(zip(text, back)) if a != b), min(len(text), len(back)))
    lo = max(0, i - 12)
    return {"byte": start + i, "expected": text[lo:i + 12].decode("utf-8", "backslashreplace"),
            "decoded": back[lo:i + 12].decode("utf-8", "backslashreplace")}


def lossy_message(meta: dict[str, Any]) -> str:
    """One sentence on a tokenizer that does not round-trip the validation text (``meta['round_trip']``)."""
    r = meta["round_trip"]
    return (f"tokenizer {meta['tokenizer']} does not give back the validation text it encodes: at byte "
            f"{r['byte']:,}, {r['expected']!r} decodes as {r['decoded']!r}, so its bits per byte are not "
            "over the text's bytes")


def lossy_errors(cell, meta: dict[str, Any]) -> list[str]:
    """A tokenizer that does not round-trip the validation text is refused unless the cell's grid
    accepts it (``data.accept_lossy_tokenizer = true``)."""
    if not meta.get("round_trip") or getattr(cell.data, "accept_lossy_tokenizer", False):
        return []
    return [f"cell [{cell.label}]: {lossy_message(meta)} ({meta['description']}); use a lossless tokenizer, "
            "or set data.accept_lossy_tokenizer = true to train it anyway (its runs then carry a note)"]
