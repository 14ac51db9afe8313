"""Token-budget batching: which sequences go into one forward pass, and which queued requests into one judge call.

Every clfjudge backend pads (PyTorch and onnxruntime on CPU pad each row to the longest one), so a batch costs
``rows x longest`` token positions, padding included, and that product is what the budget counts. This is the
rule text-embeddings-inference applies to padded models (its router's ``--max-batch-tokens``: ``max_length x
(rows + 1)`` must stay within the budget); it counts the plain sum of lengths only for its unpadded flash-attention
kernels, which no clfjudge backend has. Sorting by length before cutting keeps the padding small.

``token_batches`` is the in-process policy (the judges' and readers' batches); ``next_call`` is the server's
(which queued requests its next judge call takes).
"""
from __future__ import annotations

from collections.abc import Sequence

# What ``clfjudge serve`` batches by (--max-batch-tokens, --max-padding): padded token positions per judge call and
# forward pass, and the padding a forward pass may hold (bench/results/serve_load_2026-11-25*.md).
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


def token_batches(lengths: Sequence[int], max_rows: int, max_tokens: int | None = None,
                  max_padding: float | None = None) -> list[list[int]]:
    """Indices of ``lengths`` in batches: sorted by length (stable), cut into consecutive runs of at most
    ``max_rows`` rows whose padded size (rows x longest) stays within ``max_tokens`` (None: no budget) and whose
    padding stays within ``max_padding`` of it (None: any). A sequence longer than the budget runs alone.

    ``max_padding`` is for CPUs: there a bigger batch gains little per token (bench/results/serve_load_2026-11-25*:
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
    """Which queued requests the next judge call takes, as indices into ``queued`` (oldest first; each entry
    is (items, token lengths of the sequences it reads)); returned in queue order.

    The oldest request is always taken, so none waits behind later ones for ever and one over the budget runs
    alone. The others join in order of how close their longest sequence is to the oldest one's (ties: older
    first) -- the oldest request's length bucket -- each if the call stays within ``max_items`` items and
    ``max_tokens`` padded tokens (all its sequences x the longest). A request with nothing to read (an
    embedding judge's cache hit) costs no tokens."""
    check_budget(max_items, max_tokens)
    if not queued:
        return []

    def longest(j: int) -> int:
        return max(queued[j][1], default=0)

    anchor = longest(0)
    chosen = [0]
    items, rows, width = queued[0][0], len(queued[0][1]), anchor
    for j in sorted(range(1, len(queued)), key=lambda j: (abs(longest(j) - anchor), j)):
        n, lengths = queued[j]
        new_rows, new_width = rows + len(lengths), max(width, longest(j))
        over = max_tokens is not None and new_rows * new_width > max(max_tokens, rows * width)
        if items + n > max_items or over:
            continue
        chosen.append(j)
        items, rows, width = items + n, new_rows, new_width
    return sorted(chosen)
