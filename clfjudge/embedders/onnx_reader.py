"""The decoder reader of an embedding judge run by onnxruntime: no PyTorch, no transformers.

``clfjudge export`` writes the frozen decoder as one graph (``reader.onnx``: token ids -> the chosen layer's
states mean-pooled over the answer span, and with token statistics the log-probability of every answer token);
this reader is a ``DecoderEmbedder`` whose token ids come from the ``tokenizers`` library (tokenizer.json)
and the chat template's two rendered halves stored in the judge card, and whose forward pass is that graph.
Everything else — truncation, caching, PMI statistics, the head — is the PyTorch judge's own code.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..models.onnx_session import inference_session, provider_info
from .decoder import DecoderEmbedder

READER_FILES = {"fp32": "reader.onnx", "int8": "reader_quantized.onnx"}
GRAPH_INPUTS = ("input_ids", "attention_mask", "pool", "positions", "targets")


class OnnxDecoderReader(DecoderEmbedder):
    """``directory``: an exported embedding judge; ``reader``: the card's ``runtime.reader`` entry."""

    def __init__(self, directory: str | Path, reader: dict[str, Any], config: dict[str, Any], *,
                 variant: str | None = None, provider: str = "cpu", threads: int | None = None,
                 batch_size: int = 8, cache_dir: str | Path | None = None) -> None:
        super().__init__(reader["encoder"], layer=config["layer"], max_prompt_tokens=config["max_prompt_tokens"],
                         max_answer_tokens=config["max_answer_tokens"], stats=config.get("stats", False),
                         stats_tokens=config.get("stats_tokens"), batch_size=batch_size, cache_dir=cache_dir)
        self._depth = reader["depth"]
        self.directory = Path(directory)
        self.variant = variant or reader["primary"]
        # part of the cache identity: int8 readings are not fp32 ones, nor are a bf16 provider's
        arithmetic = provider_info(provider).precision
        self.precision = f"onnx-{self.variant}" + ("" if arithmetic == "fp32" else f"-{provider}")
        self._reader = reader
        self._provider, self._threads = provider, threads
        self._session = None

    @property
    def file(self) -> str:
        """The ONNX file this reader runs."""
        return READER_FILES.get(self.variant, self.variant)

    def _load(self) -> None:
        if self._session is not None:
            return
        path = self.directory / self.file
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist (variant {self.variant!r})")
        self._session = inference_session(path, self._provider, self._threads)
        self._load_tokenizer()
        self._inputs = [i.name for i in self._session.get_inputs()]
        self._model = self._session  # DecoderEmbedder checks _model to know it is loaded

    def _load_tokenizer(self) -> None:
        """tokenizer.json alone (the prompt frame is on the card: ``_render``); the session waits."""
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(str(self.directory / "tokenizer.json"))

    def _ids(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    @property
    def _eos(self) -> int:
        return int(self._reader["eos_token_id"])

    def _render(self, question: str) -> str:
        before, after = self._reader["template"]
        return f"{before}{question}{after}"

    @property
    def hidden_size(self) -> int:
        return int(self._reader["hidden_size"])

    def _read(self, items, with_log_probs):
        out = np.zeros((len(items), self.hidden_size), dtype=np.float32)
        log_probs = [np.zeros(0)] * len(items) if with_log_probs else None
        for batch in self._batches([len(p) + len(b) for p, b in items]):
            feed = graph_feed([items[i] for i in batch], self._eos, self.stats_tokens)
            outputs = self._session.run(None, {k: feed[k] for k in self._inputs})
            out[batch] = outputs[0]
            if log_probs is not None:
                token_log_probs = outputs[1]
                for row, i in enumerate(batch):
                    log_probs[i] = token_log_probs[row, :len(self._scored(items[i][1]))].astype(np.float32)
        return out, log_probs

    def _read_all(self, items, with_log_probs):
        """One length-sorted ``_read`` of every item: with no key/value cache in the graph, grouping answers by
        their shared prompt (``DecoderEmbedder._read_all``) would only cut the batches smaller -- every pair's two
        answers share one, so a call of many pairs would run as one small batch per pair."""
        return self._read(items, with_log_probs)

    def _read_shared(self, prefix, bodies, with_log_probs):
        """No key/value cache inputs in the graph: a shared prompt is read with every answer."""
        return self._read([(prefix, body) for body in bodies], with_log_probs)


def graph_feed(items: list[tuple[list[int], list[int]]], pad: int,
               scored: int | None = None) -> dict[str, np.ndarray]:
    """Right-padded inputs of the reader graph for (prefix ids, body ids) items: the body's pooling weights,
    and for each of the first ``scored`` body tokens (None: all) the position whose state predicts it and its id."""
    width = max(len(p) + len(b) for p, b in items)
    items_scored = [b if scored is None else b[:scored] for _, b in items]
    span = max(len(b) for b in items_scored)
    n = len(items)
    ids = np.full((n, width), pad, dtype=np.int64)
    mask = np.zeros((n, width), dtype=np.int64)
    pool = np.zeros((n, width), dtype=np.float32)
    positions = np.zeros((n, span), dtype=np.int64)
    targets = np.zeros((n, span), dtype=np.int64)
    for row, ((prefix, body), head) in enumerate(zip(items, items_scored)):
        ids[row, :len(prefix) + len(body)] = prefix + body
        mask[row, :len(prefix) + len(body)] = 1
        pool[row, len(prefix):len(prefix) + len(body)] = 1 / len(body)
        positions[row, :len(head)] = np.arange(len(prefix) - 1, len(prefix) + len(head) - 1).clip(min=0)
        targets[row, :len(head)] = head
    return {"input_ids": ids, "attention_mask": mask, "pool": pool, "positions": positions, "targets": targets}
