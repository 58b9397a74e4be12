"""May a metric be compared between two cells? The metric catalogue's ``across_tokenizers``, applied.

A figure in nats per token (``val_loss``) does not compare between cells whose tokens differ:
a token of one tokenizer is not a token of another, and the same tokenizer trained on other
data is another tokenizer. Bits per byte (``val_bpb``) do compare, scored on the same bytes
under every tokenizer (abl.train.spanscore). The verdict tables (abl.analysis.verdicts) drop
the comparisons this refuses and say so, naming the metric to compare instead.
"""

from __future__ import annotations

from typing import Hashable, Mapping, Sequence

from . import metrics

# the settings that decide what a token is: the dataset (a trainable tokenizer learns from it) and
# the tokenizer, each with its parameters (abl.analysis.verdicts.settings flattens them so)
_UNIT_KEYS = ("data.dataset", "data.tokenizer")
_UNIT_PREFIXES = ("dataset.", "tokenizer.")


def token_unit(settings: Mapping[str, str]) -> tuple:
    """What a cell's tokens are, from its flattened settings: equal tuples, the same token unit."""
    return tuple(sorted((k, v) for k, v in settings.items() if k in _UNIT_KEYS or k.startswith(_UNIT_PREFIXES)))


def may_compare(metric: str, a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    """May ``metric`` be tested between cells with settings ``a`` and ``b``? Not when it is a
    per-token figure (the catalogue's ``across_tokenizers`` is false) and their tokens differ."""
    return metrics.across_tokenizers(metric) or token_unit(a) == token_unit(b)


def keep_comparable(metric: str, cells: Sequence, comparisons: Sequence[tuple[Hashable, Hashable]],
                    what: str) -> tuple[list[tuple[Hashable, Hashable]], str]:
    """The ``comparisons`` (pairs of ``cells``' keys) ``metric`` may be tested on, and ``what`` (the
    sentence naming them) with the reason for any left out and the metric that does compare."""
    settings = {c.key: c.settings for c in cells}
    kept = [(a, b) for a, b in comparisons if may_compare(metric, settings[a], settings[b])]
    dropped = len(comparisons) - len(kept)
    if dropped:
        instead = metrics.comparison_metric(metric, tokenizers_differ=True)
        what += (f"; {dropped} comparison{'s' if dropped > 1 else ''} left out: {metric} is per token and "
                 f"these cells' tokenizers (or data) differ, so compare {instead}")
    return kept, what
