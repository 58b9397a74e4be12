"""The contract of a tokenizer plugin (axis ``tokenizer``): what abl.data.tokenstore asks of one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .corpus import TextCorpus


class Tokenizer:
    """Base class of a tokenizer plugin (axis ``tokenizer``): ``factory(**params) -> Tokenizer``.

    A tokenizer turns documents (bytes) into token ids and says how many bytes
    of the document each token covers (bits per byte divides by them). One
    that learns from the data returns a ``training_key``; the harness then
    trains it on the training split once per store (``train``), caches its
    ``definition`` under that key and later restores it (``load_definition``)
    instead of training again.
    """

    # the model's vocabulary under this tokenizer, known before any training
    vocab_size: int = 0

    def training_key(self, corpus: TextCorpus) -> str | None:
        """A file-name-safe key of what training depends on; None: nothing to train."""
        return None

    def train(self, corpus: TextCorpus) -> None:
        """Learn from ``corpus.train_docs`` (never the validation split)."""

    def definition(self) -> str | None:
        """The tokenizer as text (e.g. a tokenizer.json), stored beside its tokens; None: none."""
        return None

    def load_definition(self, text: str) -> None:
        """Restore a trained tokenizer from its ``definition``."""
        raise NotImplementedError

    def fingerprint(self) -> str:
        """sha256 of what decides the ids (recorded with every run, part of the store key)."""
        raise NotImplementedError

    def encode(self, docs: list[bytes]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per document: (token ids, bytes of the document each token covers; they sum to its length)."""
        raise NotImplementedError

    def decode(self, ids: Any) -> bytes:
        """The bytes a sequence of ids stands for."""
        raise NotImplementedError

    def describe(self) -> str:
        return f"{type(self).__name__} (vocabulary {self.vocab_size})"
