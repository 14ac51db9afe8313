"""Token-budget batching: which sequences go into one forward pass, and which queued requests into one judge call.

Every clfjudge backend pads (PyTorch and onnxruntime on CPU pad each row to the longest one), so a batch costs
``rows x longest`` token positions, padding included, and that product is what the budget counts. This is the
rule text-embeddings-inference applies to padded models (its router's ``--max-batch-tokens``: ``max_length x
(rows + 1)`` must stay within the budget); it counts the plain sum of lengths only for its unpadded flash-attention
kernels, which no clfjudge backend has. Sorting by length before cutting keeps the padding small.

``token_batches`` is the in-process policy (the judges' and readers' batches); ``next_call`` is the server's
(which queued requests its next judge call takes: in arrival order, as TEI's queue).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_BATCH_SIZE = 16  # rows per forward pass (records per judge call) when the caller names none
# What ``clfjudge serve`` batches by (--max-batch-tokens, --max-padding): padded token positions per judge call and
# forward pass, and the padding a forward pass may hold (docs/serving.md#serving-under-load).
DEFAULT_MAX_BATCH_TOKENS = 4096
DEFAULT_MAX_PADDING = 0.1


def padded_tokens(lengths: Sequence[int]) -> int:
    """Token positions a padded backend computes for one batch of sequences of these lengths."""
    return max(lengths, default=0) * len(lengths)


def check_budget(max_rows: int, max_tokens: int | None, max_padding: float | None = None) -> None:
    if max_rows < 1:
        raise ValueError(f"a batch must hold at least one row, got max_rows={max_rows}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive number of tokens or None, got {max_tokens}")
    if max_padding is not None and not 0 <= max_padding <= 1:
        raise ValueError(f"max_padding must be a fraction in [0, 1] or None, got {max_padding}")


@dataclass(frozen=True)
class Budget:
    """What one judge call or forward pass may hold, owned by whoever calls the judge (the server, the batch scorer,
    a user's ``Judge.load``), as text-embeddings-inference's router owns its budget: ``max_batch_size`` rows (items
    per call, records per forward pass), ``max_batch_tokens`` padded tokens (None: rows only), ``max_padding`` the
    fraction of a forward pass that may be padding (None: any). A judge is given it once, when it loads
    (``options.LoadOptions.budget``), and hands it to its reader then; it only reports what it reads
    (``Judge.sequence_lengths``)."""

    max_batch_size: int = DEFAULT_BATCH_SIZE
    max_batch_tokens: int | None = None
    max_padding: float | None = None

    def __post_init__(self) -> None:
        check_budget(self.max_batch_size, self.max_batch_tokens, self.max_padding)

    def batches(self, lengths: Sequence[int], rows_per_item: int = 1) -> list[list[int]]:
        """``token_batches`` within this budget; ``rows_per_item``: sequences one record reads (a reward head
        reads two answers of a pair), so a forward pass holds ``max_batch_size`` records' worth of rows."""
        return token_batches(lengths, self.max_batch_size * rows_per_item, self.max_batch_tokens, self.max_padding)


def token_batches(lengths: Sequence[int], max_rows: int, max_tokens: int | None = None,
                  max_padding: float | None = None) -> list[list[int]]:
    """Indices of ``lengths`` in batches: sorted by length (stable), cut into consecutive runs of at most
    ``max_rows`` rows whose padded size (rows x longest) stays within ``max_tokens`` (None: no budget) and whose
    padding stays within ``max_padding`` of it (None: any). A sequence longer than the budget runs alone.

    ``max_padding`` is for CPUs: there a bigger batch gains little per token (docs/serving.md#serving-under-load:
    1.04-1.30x one request at a time with 4-7% padding, 0.82-0.93x with 34-42%), so padding soon costs more than
    batching saves; on a GPU leave it None, as TEI does."""
    check_budget(max_rows, max_tokens, max_padding)
    batches: list[list[int]] = []
    current: list[int] = []
    real = 0
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        # ascending order: the newcomer is the longest of its batch
        padded = lengths[i] * (len(current) + 1)
        full = (len(current) >= max_rows or (max_tokens is not None and padded > max_tokens)
                or (max_padding is not None and padded - real - lengths[i] > max_padding * padded))
        if current and full:
            batches.append(current)
            current, real = [], 0
        current.append(i)
        real += lengths[i]
    if current:
        batches.append(current)
    return batches


def next_call(queued: Sequence[tuple[int, Sequence[int]]], max_items: int,
              max_tokens: int | None = None) -> list[int]:
    """How many of the queued requests the next judge call takes: the first ``k`` (oldest first; each entry is
    (items, token lengths of the sequences it reads)), returned as indices into ``queued``.

    In queue order, as text-embeddings-inference's queue fills a batch: the oldest request always (so one over
    the budget runs alone), then each next one while the call stays within ``max_items`` items and ``max_tokens``
    padded tokens (all its sequences x the longest); the first that does not fit ends the call. No request is
    overtaken by a later one, so none waits longer than the requests before it take: picking the requests nearest
    the oldest one in length instead padded a little less but left the odd lengths behind call after call (p99 at
    32 clients 3.3-3.4 s against 2.3 s one at a time; docs/serving.md#serving-under-load). The judge
    sorts a call's sequences by length into forward passes itself (``token_batches``), so mixing lengths in a
    call costs little padding. A request with nothing to read (an embedding judge's cache hit) costs no tokens."""
    check_budget(max_items, max_tokens)
    if not queued:
        return []
    items, rows, width = queued[0][0], len(queued[0][1]), max(queued[0][1], default=0)
    taken = 1
    for n, lengths in queued[1:]:
        new_rows, new_width = rows + len(lengths), max(width, max(lengths, default=0))
        if items + n > max_items or (max_tokens is not None and new_rows * new_width > max_tokens):
            break
        items, rows, width, taken = items + n, new_rows, new_width, taken + 1
    return list(range(taken))
