"""The decoder reader of an embedding judge run by onnxruntime: no PyTorch, no transformers.

``clfjudge export`` writes the frozen decoder as one graph (``reader.onnx``: token ids -> the chosen layer's
states mean-pooled over the answer span, and with token statistics the log-probability of every answer token);
this reader is a ``DecoderEmbedder`` whose token ids come from the ``tokenizers`` library (tokenizer.json)
and the chat template's two rendered halves stored in the judge card, and whose forward pass is that graph.
Everything else — truncation, caching, PMI statistics, the head — is the PyTorch judge's own code. Answers that
share a prompt are read after its key/value cache when the export has the shared-prefix graphs (``prefix.onnx``,
``continuation.onnx``; fp32), as ``DecoderEmbedder`` does in PyTorch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..models.onnx_session import inference_session, provider_info
from ..options import LoadOptions
from ..untrusted import inside
from .decoder import DecoderEmbedder

READER_FILES = {"fp32": "reader.onnx", "int8": "reader_quantized.onnx", "int4": "reader_int4.onnx"}
GRAPH_INPUTS = ("input_ids", "attention_mask", "pool", "positions", "targets")
# Shared-prefix graphs (fp32 only): a prompt's key/value cache, and answers read after it (export.embedding)
SHARED_PREFIX_FILES = {"prefix": "prefix.onnx", "continuation": "continuation.onnx"}
# Answers sharing a prompt are read after its cache when there are at least this many. Not 2 as in PyTorch: the two
# answers of a pair read after their prompt's cache ran at half the speed of all pairs read whole in length-sorted
# batches of 8 (32 PandaLM test pairs, default judge, 2 threads); best-of-8:
# docs/speed.md#best-of-n-one-read-of-a-shared-prompt.
# Groups of 3 to 7 are not measured.
SHARED_PREFIX_MIN = 4


class OnnxDecoderReader(DecoderEmbedder):
    """``directory``: an exported embedding judge; ``reader``: the card's ``runtime.reader`` entry; ``run``: the
    caller's load options with the provider and variant resolved (``models.onnx_session.resolve_provider``; variant
    None: the reader's primary file), whose provider and threads open the sessions and whose budget cuts the
    reader's batches."""

    def __init__(self, directory: str | Path, reader: dict[str, Any], config: dict[str, Any],
                 run: LoadOptions = LoadOptions(provider="cpu"), *, cache_dir: str | Path | None = None) -> None:
        backbone = reader["backbone"] if "backbone" in reader else reader["encoder"]  # "encoder": its older name
        super().__init__(backbone, layer=config["layer"], max_prompt_tokens=config["max_prompt_tokens"],
                         max_answer_tokens=config["max_answer_tokens"], stats=config.get("stats", False),
                         stats_tokens=config.get("stats_tokens"), budget=run.budget, cache_dir=cache_dir)
        self._depth = reader["depth"]
        self.directory = Path(directory)
        variant, provider = run.variant or reader["primary"], run.provider
        self.variant = next((key for key, file in READER_FILES.items() if file == variant), variant)  # a file name
        # part of the cache identity: int8 / int4 readings are not fp32 ones, nor are a bf16 provider's
        arithmetic = provider_info(provider).precision
        self.precision = f"onnx-{self.variant}" + ("" if arithmetic == "fp32" else f"-{provider}")
        self._reader = reader
        self._provider, self._threads = provider, run.threads
        self._session = None
        self._shared_files = None  # (prefix graph, continuation graph) when the export has them for this variant
        self._shared = None  # their sessions, opened with the reader's (``_load``)
        self.shared_prefix_min = SHARED_PREFIX_MIN
        # the files the card names are checked now: one outside the directory fails the load, not every input
        self._where = f"{self.directory / 'judge_card.json'} field 'runtime.reader'"
        shared = reader.get("shared_prefix") or {}
        for name in [self.file, "tokenizer.json", *(shared[k] for k in SHARED_PREFIX_FILES if k in shared)]:
            inside(self.directory, name, self._where)

    @property
    def file(self) -> str:
        """The ONNX file this reader runs."""
        return READER_FILES.get(self.variant, self.variant)

    def _load(self) -> None:
        if self._session is not None:
            return
        where = self._where
        path = inside(self.directory, self.file, where)
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist (variant {self.variant!r})")
        self._session = inference_session(path, self._provider, self._threads)
        self._load_tokenizer()
        # Directories exported before the shared-prefix graphs (no ``shared_prefix`` entry on the card), and
        # variants they were not exported for (int8, int4), read a shared prompt with every answer (``_read_shared``).
        graphs = self._reader.get("shared_prefix")
        variant = next((name for name, file in READER_FILES.items() if file == self.file), self.variant)
        if graphs and variant in graphs["variants"]:  # the variant named, or its file (as the parity gate names it)
            self._shared_files = tuple(inside(self.directory, graphs[k], where) for k in ("prefix", "continuation"))
            # opened now, not when a call first holds a group of answers to one prompt: the judge's start-up check
            # (``Judge.self_test``, one short item) then opens every graph it may run, so a corrupt one fails the
            # start (exit 3, never served) rather than every group of answers later
            self._shared = tuple(inference_session(f, self._provider, self._threads) for f in self._shared_files)
            check_inputs(self._shared_files[0], self._shared[0], {"input_ids"})
            cache = {o.name.replace("present", "past_key_values", 1) for o in self._shared[0].get_outputs()}
            check_inputs(self._shared_files[1], self._shared[1], {*GRAPH_INPUTS, *cache}, needed=cache)
        self._model = self._session  # DecoderEmbedder checks _model to know it is loaded

    @property
    def shares_prefixes(self) -> bool:
        """Whether answers of one prompt are read after its key/value cache (the export has the shared-prefix
        graphs for this variant)."""
        self._load()
        return self._shared_files is not None

    def _load_tokenizer(self) -> None:
        """tokenizer.json alone (the prompt frame is on the card: ``_render``); the session waits."""
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(str(inside(self.directory, "tokenizer.json", str(self.directory))))

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

    def _run(self, session, feeds, lengths, bodies, with_log_probs):
        """Run ``session`` on ``feeds(batch)`` for every length-sorted batch of ``lengths``: the pooled vectors and,
        if asked, each body's scored log-probabilities."""
        inputs = [i.name for i in session.get_inputs()]
        out = np.zeros((len(bodies), self.hidden_size), dtype=np.float32)
        log_probs = [np.zeros(0)] * len(bodies) if with_log_probs else None
        for batch in self._batches(lengths):
            feed = feeds(batch)
            outputs = session.run(None, {k: feed[k] for k in inputs})
            out[batch] = outputs[0]
            if log_probs is not None:
                for row, i in enumerate(batch):
                    log_probs[i] = outputs[1][row, :len(self._scored(bodies[i]))].astype(np.float32)
        return out, log_probs

    def _read(self, items, with_log_probs):
        return self._run(self._session,
                         lambda batch: graph_feed([items[i] for i in batch], self._eos, self.stats_tokens),
                         [len(p) + len(b) for p, b in items], [b for _, b in items], with_log_probs)

    def _read_all(self, items, with_log_probs):
        """With the shared-prefix graphs: ``DecoderEmbedder._read_all`` (answers of a prompt shared by at least
        ``shared_prefix_min`` read after its cache). Without them, one length-sorted ``_read`` of every item:
        grouping answers by their prompt would only cut the batches smaller -- every pair's two answers share one,
        so a call of many pairs would run as one small batch per pair."""
        self._load()
        if self._shared_files is not None:
            return super()._read_all(items, with_log_probs)
        return self._read(items, with_log_probs)

    def _read_shared(self, prefix, bodies, with_log_probs):
        """The prompt's key/value cache is computed once (the prefix graph) and broadcast to every batch of
        answers (the continuation graph): the same vectors as reading each prompt + answer whole, up to float
        rounding. Without those graphs (an older export, the int8 and int4 variants) the prompt is read with every
        answer."""
        self._load()
        if self._shared_files is None:
            return self._read([(prefix, body) for body in bodies], with_log_probs)
        head, continuation = self._shared
        cached = head.run(None, {"input_ids": np.array([prefix], dtype=np.int64)})
        names = [o.name for o in head.get_outputs()]
        cache = {name.replace("present", "past_key_values", 1): value for name, value in zip(names, cached)}

        def feeds(batch):
            feed = continuation_feed(len(prefix), [bodies[i] for i in batch], self._eos, self.stats_tokens)
            return {**feed, **cache}

        return self._run(continuation, feeds, [len(prefix) + len(b) for b in bodies], bodies, with_log_probs)


def check_inputs(path: Path, session, fed: set[str], needed: set[str] = frozenset()) -> None:
    """A graph must take only inputs this reader feeds it, ``needed`` among them (another graph in its place fails
    here, not at its first call or, worse, with numbers read without the prompt's cache)."""
    wanted = {i.name for i in session.get_inputs()}
    if not wanted or wanted - fed or needed - wanted:
        raise ValueError(f"{path}: takes the inputs {sorted(wanted)}; this reader feeds it {sorted(fed)}")


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


def continuation_feed(past: int, bodies: list[list[int]], pad: int,
                      scored: int | None = None) -> dict[str, np.ndarray]:
    """Inputs of the continuation graph for ``bodies`` read after a cached prompt of ``past`` tokens (its cache
    and last state are fed beside them): ``graph_feed`` of each body after a one-token stand-in for the prompt's
    last token (whose state, position 0, predicts the body's first token), the stand-in's column dropped and the
    attention mask opened over the cached prompt."""
    feed = graph_feed([([pad], body) for body in bodies], pad, scored)
    mask = np.hstack([np.ones((len(bodies), past), dtype=np.int64), feed["attention_mask"][:, 1:]])
    return {**feed, "input_ids": feed["input_ids"][:, 1:], "pool": feed["pool"][:, 1:], "attention_mask": mask}


def cache_names(n_layers: int, prefix: str) -> list[str]:
    """Names of a decoder's key/value cache tensors as optimum exports them: ``{prefix}.{i}.key`` / ``.value``
    (``past_key_values`` as inputs, ``present`` as outputs)."""
    return [f"{prefix}.{i}.{part}" for i in range(n_layers) for part in ("key", "value")]
