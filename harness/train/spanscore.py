"""val_bpb on identical bytes: the validation text's fixed byte spans (abl.data.spans), each scored whole.

Every cell whose data is text scores the same spans, whatever its tokenizer: the spans are chosen
from the validation text alone, and how many are scored depends only on the evaluation's size in
bytes (``train.eval_batches`` x ``train.batch_size`` x ``model.context``, the bytes a byte-level
cell's validation windows hold), never on the tokenizer or the number of processes. Each span's
tokens are cut into consecutive windows of ``model.context`` tokens (the first conditioned on the
document separator), so every token of the span is a target once and every byte is scored once:

    val_bpb = sum of the targets' nats / (ln 2 x bytes of the spans)

``val_loss`` stays the mean cross-entropy per token over the token stream's validation windows
(abl.train.loop.evaluate); it does not compare across tokenizers, val_bpb does.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..data.corpus import LN2, TokenData, bits_per_byte
from ..data.spans import ByteSpans, lossy_message
from ..model.decoder import ForwardContext

IGNORE = -100  # a position that is not a target (the separator before a span, padding)

# (inputs [B, T], targets [B, T] with IGNORE where nothing is scored) -> summed nats of the targets
NatsFn = Callable[[np.ndarray, np.ndarray], float]


def span_windows(spans: ByteSpans, indices, context: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets [N, context] covering every token of the chosen spans once as a target.

    Windows are consecutive within a span (window k predicts tokens k*context+1 .. (k+1)*context
    from the ones before it in the window); short windows are padded with IGNORE targets."""
    xs, ys = [], []
    for i in indices:
        z = spans.span(int(i))
        for k in range(0, len(z) - 1, context):
            m = min(context, len(z) - 1 - k)
            x = np.zeros(context, np.int64)
            y = np.full(context, IGNORE, np.int64)
            x[:m] = z[k:k + m]
            y[:m] = z[k + 1:k + 1 + m]
            y[:max(0, spans.prefix - 1 - k)] = IGNORE  # the separator's own tokens are context only
            xs.append(x)
            ys.append(y)
    if not xs:
        return np.zeros((0, context), np.int64), np.zeros((0, context), np.int64)
    return np.stack(xs), np.stack(ys)


def score_spans(nats: NatsFn, spans: ByteSpans, indices, context: int, batch_size: int) -> float:
    """Bits per byte of the chosen spans under ``nats`` (a model, or any scorer of targets)."""
    x, y = span_windows(spans, indices, context)
    total, step = 0.0, max(1, batch_size)
    for a in range(0, len(x), step):
        total += nats(x[a:a + step], y[a:a + step])
    n_bytes = int(sum(spans.lengths[int(i)] for i in indices))
    return total / (LN2 * n_bytes)


def model_nats(model, precision, device: torch.device) -> NatsFn:
    """``NatsFn`` of a DecoderLM: the summed cross-entropy of the targets (IGNORE left out)."""

    @torch.no_grad()
    def nats(x: np.ndarray, y: np.ndarray) -> float:
        xt, yt = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
        with precision.autocast(device):
            logits, _, _ = model(xt, None, ForwardContext(position=model.position))
        return float(F.cross_entropy(logits.float().flatten(0, 1), yt.flatten(), ignore_index=IGNORE,
                                     reduction="sum"))

    return nats


def eval_bytes(cell) -> int:
    """How many bytes an evaluation scores: the bytes of ``eval_batches`` x ``batch_size`` windows of
    ``context`` bytes (the global batch: the same with any number of processes)."""
    return cell.train.eval_batches * cell.train.batch_size * cell.model.context


def chosen_spans(data: TokenData, cell) -> np.ndarray | None:
    """Which spans the cell's val_bpb scores (None: its data has no text spans)."""
    if not isinstance(data, TokenData) or data.val_spans is None:
        return None
    return data.val_spans.chosen(eval_bytes(cell))


def val_bpb(run, val_loss: float) -> float | None:
    """The training loop's val_bpb: on the fixed byte spans when the data has them; else (pre-tokenised
    data that says which bytes its tokens cover) over the validation windows' bytes; else None."""
    data, cell = run.data, run.cell
    indices = chosen_spans(data, cell)
    if indices is not None:
        model = run.core
        model.eval()
        try:
            return score_spans(model_nats(model, run.precision, run.device), data.val_spans, indices,
                               cell.model.context, run.batches.batch_size)
        finally:
            model.train()
    if getattr(run.batches, "val_bytes", None) is None:  # a task's batches: no text
        return None
    return bits_per_byte(val_loss, run.batches.val_target_counts(cell.train.eval_batches))


def info(data, cell) -> dict[str, Any]:
    """What val_bpb was scored on, stored with the run (info.json): the spans' count, bytes and a
    hash of their byte table and the corpus (equal hashes: the same bytes were scored)."""
    indices = chosen_spans(data, cell)
    if indices is None:
        return {}
    table = data.val_spans.table(indices)
    digest = hashlib.sha256(json.dumps([data.meta.get("corpus_fingerprint"), table]).encode()).hexdigest()
    return {"val_bpb_spans": {"spans": len(table), "bytes": sum(n for _, n in table), "sha256": digest[:16]}}


def notes(data) -> list[str]:
    """The run's notes about its data: a lossy tokenizer the grid accepted."""
    if not isinstance(data, TokenData) or not data.meta.get("lossy_tokenizer"):
        return []
    meta = {"tokenizer": data.tokenizer, "round_trip": data.meta["lossy_tokenizer"]}
    return [lossy_message(meta) + " (accepted: data.accept_lossy_tokenizer = true)"]
