"""Tokenizers (axis ``tokenizer``, selected by ``data.tokenizer``). ``factory(**params)`` -> abl.Tokenizer.

- ``byte``: every byte is a token (vocabulary 256); the default;
- ``bpe``: a byte-level BPE trained with Hugging Face ``tokenizers`` on the
  training split at a chosen ``vocab_size`` (trained once per store: the
  harness caches it by corpus fingerprint and parameters);
- ``pretrained``: a ``tokenizer.json`` (or a Hugging Face tokenizer folder
  holding one) from a local path.

Each reports, per token, the bytes of the document it covers, and decodes ids
back to bytes. ``val_bpb`` (bits per byte) is scored on the same byte spans of the
validation text under every tokenizer (abl.data.spans), so it compares cells with
different tokenizers; a tokenizer that does not give a span back
(decode(encode(s)) != s, e.g. a ``pretrained`` one with a lowercasing normaliser)
is refused unless the grid sets ``data.accept_lossy_tokenizer = true``.
``tokenizers`` is imported only when a subword tokenizer is used.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any

import numpy as np

from abl import Arg, DataError, Tokenizer, hookimpl


def utf8_text(doc: bytes) -> str:
    """A document as text for a subword tokenizer (which needs valid UTF-8, unlike ``byte``)."""
    try:
        return doc.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"a document is not valid UTF-8 (byte {exc.start}: {doc[exc.start:exc.start + 4]!r}); "
                        "subword tokenizers need text (data.tokenizer = 'byte' takes any bytes)") from None


class ByteTokenizer(Tokenizer):
    """Byte-level: token id = byte value, vocabulary 256, each token covers one byte."""

    vocab_size = 256

    def fingerprint(self) -> str:
        return hashlib.sha256(b"abl byte tokenizer: id = byte value").hexdigest()

    def encode(self, docs: list[bytes]) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(np.frombuffer(d, dtype=np.uint8).astype(np.uint16), np.ones(len(d), dtype=np.uint8))
                for d in docs]

    def decode(self, ids: Any) -> bytes:
        return bytes(np.asarray(ids, dtype=np.uint8))

    def describe(self) -> str:
        return "bytes (vocabulary 256)"


class HFTokenizer(Tokenizer):
    """Shared by the tokenizers backed by a Hugging Face ``tokenizers.Tokenizer``."""

    def __init__(self) -> None:
        self._tok: Any = None
        self._definition: str | None = None

    def _use(self, definition: str) -> None:
        from tokenizers import Tokenizer as Backend

        self._tok = Backend.from_str(definition)
        self._definition = definition

    def definition(self) -> str | None:
        return self._definition

    def load_definition(self, text: str) -> None:
        self._use(text)

    def fingerprint(self) -> str:
        assert self._definition is not None, "the tokenizer is not trained or loaded"
        return hashlib.sha256(self._definition.encode()).hexdigest()

    def decode(self, ids: Any) -> bytes:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False).encode("utf-8")

    def _byte_counts(self, text: str, raw: bytes, enc: Any) -> np.ndarray:
        """Bytes each token covers, from its character offsets: token i covers the bytes from the end
        of token i-1 to its own end, and the last one the rest, so the counts add up to the
        document's length even where tokens share a character (byte fallback) or skip some."""
        n = len(enc.ids)
        if n == 0:
            return np.zeros(0, dtype=np.uint32)
        cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        width = 1 + (cps >= 0x80).astype(np.int64) + (cps >= 0x800) + (cps >= 0x10000)
        byte_at = np.concatenate([[0], np.cumsum(width)])  # char offset -> byte offset
        ends = byte_at[np.asarray([e for _, e in enc.offsets], dtype=np.int64)]
        ends = np.maximum.accumulate(ends)
        ends[-1] = len(raw)
        return np.diff(np.concatenate([[0], ends])).astype(np.uint32)

    def encode(self, docs: list[bytes]) -> list[tuple[np.ndarray, np.ndarray]]:
        texts = [utf8_text(d) for d in docs]
        encs = self._tok.encode_batch(texts, add_special_tokens=False)
        return [(np.asarray(e.ids, dtype=np.uint32), self._byte_counts(t, d, e))
                for t, d, e in zip(texts, docs, encs)]


class ByteLevelBPE(HFTokenizer):
    """Byte-level BPE trained on the training split (Sennrich et al. 2016, "Neural Machine Translation
    of Rare Words with Subword Units", section 3.2: merge the most frequent adjacent pair until the
    vocabulary is full; over bytes, as GPT-2, Radford et al. 2019, section 2.2, so any text encodes
    without unknown tokens). Pre-tokenised with GPT-2's regex (``ByteLevel``), no special tokens,
    no normaliser, so decoding returns the text exactly."""

    def __init__(self,
                 vocab_size: Annotated[int, Arg("vocabulary size (256 bytes + merges); the model's vocabulary "
                                                "follows it", min=256, max=2**31 - 1)] = 4096,
                 min_frequency: Annotated[int, Arg("a pair merges only if it occurs at least this often",
                                                   min=1)] = 2):
        super().__init__()
        self.vocab_size = vocab_size
        self.min_frequency = min_frequency
        self._table: np.ndarray | None = None

    def training_key(self, corpus) -> str | None:
        import tokenizers

        spec = {"kind": "byte-level bpe", "vocab_size": self.vocab_size, "min_frequency": self.min_frequency,
                "tokenizers": tokenizers.__version__, "corpus": corpus.fingerprint}
        return "bpe-" + hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:24]

    def train(self, corpus) -> None:
        from tokenizers import Tokenizer as Backend, decoders, models, pre_tokenizers, trainers

        texts = [utf8_text(d) for d in corpus.train_docs]
        tok = Backend(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=self.vocab_size, min_frequency=self.min_frequency,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      special_tokens=[], show_progress=False)
        tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
        self._use(tok.to_str())

    def _use(self, definition: str) -> None:
        super()._use(definition)
        # byte-level: each character of a token's string stands for exactly one byte
        vocab = self._tok.get_vocab(with_added_tokens=True)
        table = np.zeros(max(vocab.values(), default=0) + 1, dtype=np.uint32)
        for token, i in vocab.items():
            table[i] = len(token)
        self._table = table

    def encode(self, docs: list[bytes]) -> list[tuple[np.ndarray, np.ndarray]]:
        assert self._table is not None, "the tokenizer is not trained"
        texts = [utf8_text(d) for d in docs]
        out = []
        for e in self._tok.encode_batch(texts, add_special_tokens=False):
            ids = np.asarray(e.ids, dtype=np.uint32)
            out.append((ids, self._table[ids]))
        return out

    def describe(self) -> str:
        trained = "" if self._tok is None else f", {self._tok.get_vocab_size()} trained"
        return f"byte-level BPE (vocabulary {self.vocab_size}{trained})"


class PretrainedTokenizer(HFTokenizer):
    """A tokenizer.json (Hugging Face ``tokenizers`` format) from a local file or tokenizer folder.

    Documents are encoded without added special tokens; the bytes a token
    covers come from its character offsets.
    """

    def __init__(self, path: Annotated[str, Arg("a tokenizer.json, or a Hugging Face tokenizer folder "
                                                "holding one")] = ""):
        super().__init__()
        if not path:
            raise DataError('tokenizer pretrained needs a path: [tokenizer.pretrained] path = "tokenizer.json"')
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
            if not p.is_file():
                raise DataError(f"tokenizer folder {path!r} has no tokenizer.json (save a fast tokenizer "
                                "with save_pretrained, or point path at its tokenizer.json)")
        elif not p.exists():
            raise DataError(f"tokenizer file {path!r} does not exist")
        try:
            text = p.read_text(encoding="utf-8")
            self._use(text)
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"tokenizer file {path!r} cannot be read: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the backend's parse error, for a user's file
            raise DataError(f"tokenizer file {path!r} is not a tokenizer.json: {exc}") from None
        self.path = path
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))

    def describe(self) -> str:
        return f"pretrained {Path(self.path).name} (vocabulary {self.vocab_size})"


@hookimpl
def register_components(register):
    # each factory's signature declares its parameters (type, default, doc, bounds)
    register("tokenizer", "byte", ByteTokenizer)
    register("tokenizer", "bpe", ByteLevelBPE,
             doc="Byte-level BPE (Hugging Face tokenizers) trained on the training split, once per store.")
    register("tokenizer", "pretrained", PretrainedTokenizer,
             doc="A local tokenizer.json (Hugging Face tokenizers format).")
